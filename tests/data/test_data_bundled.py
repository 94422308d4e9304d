"""The sample shipped inside the package: present, loadable, light, and byte-identical to its origin."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rcarun.data import bundled_sample_path, iter_dataset

EXPECTED_QIDS = [
    "algorithm_generated/1",
    "algorithm_generated/2",
    "algorithm_generated/5",
    "algorithm_generated/12",
    "algorithm_generated/14",
    "algorithm_generated/36",
    "hand_crafted/4",
    "hand_crafted/6",
    "hand_crafted/12",
    "hand_crafted/14",
]


def test_bundled_sample_loads_in_natural_order_with_the_licence() -> None:
    root = bundled_sample_path()
    records = list(iter_dataset(root))

    assert [r.trajectory.qid for r in records] == EXPECTED_QIDS
    assert Counter(r.trajectory.source for r in records) == {"algorithm_generated": 6, "hand_crafted": 4}
    assert all(r.reference is not None for r in records)
    assert max(r.trajectory.n_steps for r in records) == 32
    assert sum(r.trajectory.n_steps for r in records) == 123
    assert (root / "LICENSE").read_text().startswith("MIT License")
    assert (root / "README.md").is_file()


def test_bundled_files_are_unchanged_copies(who_and_when: Path) -> None:
    root = bundled_sample_path()
    copies = sorted(root.glob("*/*.json"))
    assert len(copies) == 10
    for copy in copies:
        assert copy.read_bytes() == (who_and_when / copy.parent.name / copy.name).read_bytes(), copy
    assert (root / "LICENSE").read_bytes() == (who_and_when / "LICENSE").read_bytes()
