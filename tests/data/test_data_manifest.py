"""The LongRCA-Mini protocol: quotas, seeded per-source sampling, hashes, and both manifest formats."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest

from rcarun.data import (
    Manifest,
    ManifestRecord,
    allocate_quotas,
    dataset_sha256,
    iter_dataset,
    load_manifest,
    longrca_mini_manifest_path,
    sample_mini,
    save_manifest,
)
from rcarun.errors import DataError

# LongRCA Full's source populations (release notes, validator contract).
LONGRCA = {
    "swe_bench_pro": 128,
    "terminal_bench_2": 42,
    "travelplanner": 685,
    "vitabench": 108,
    "webarena_verified": 177,
}

# Every quota row of the paper's Table 5 (source order SWE, TB2, TP, Vita, WA).
TABLE_5 = {
    75: (15, 15, 15, 15, 15),
    100: (20, 20, 20, 20, 20),
    175: (35, 35, 35, 35, 35),
    200: (40, 40, 40, 40, 40),
    225: (46, 42, 46, 46, 45),
    250: (52, 42, 52, 52, 52),
    300: (65, 42, 65, 64, 64),
    400: (90, 42, 90, 89, 89),
    600: (128, 42, 161, 108, 161),
}


@pytest.mark.parametrize(("size", "quotas"), sorted(TABLE_5.items()))
def test_quotas_reproduce_table_5(size: int, quotas: tuple[int, ...]) -> None:
    allocated = allocate_quotas(LONGRCA, size)
    assert tuple(allocated[source] for source in sorted(LONGRCA)) == quotas
    assert sum(allocated.values()) == size


def test_quotas_cap_every_source_and_preserve_any_total() -> None:
    populations = {"a": 3, "b": 10, "c": 11, "d": 0}
    for size in range(sum(populations.values()) + 1):
        quotas = allocate_quotas(populations, size)
        assert sum(quotas.values()) == size
        assert all(0 <= quotas[s] <= populations[s] for s in populations)
    assert allocate_quotas(populations, 24) == populations
    with pytest.raises(ValueError, match="exceeds"):
        allocate_quotas(populations, 25)


def _records(populations: dict[str, int]) -> list[tuple[str, str, str]]:
    return [
        (f"{source}__{i:03d}", source, hashlib.sha256(f"{source}{i}".encode()).hexdigest())
        for source, count in populations.items()
        for i in range(count)
    ]


def test_sample_is_seeded_stratified_and_without_replacement() -> None:
    records = _records(LONGRCA)
    manifest = sample_mini(records, size=200, seed=20260821)
    assert manifest.quotas == dict.fromkeys(LONGRCA, 40)
    assert Counter(r.source for r in manifest.records) == Counter(manifest.quotas)
    assert len(manifest.qids) == 200  # no qid twice
    by_qid = {qid: sha for qid, _, sha in records}
    assert all(by_qid[r.qid] == r.sha256 for r in manifest.records)
    assert manifest.dataset_sha256 == dataset_sha256((qid, sha) for qid, _, sha in records)

    again = sample_mini(list(reversed(records)), size=200, seed=20260821)  # input order does not matter
    assert again == manifest
    other = sample_mini(records, size=200, seed=20260907)
    assert other.qids != manifest.qids


def test_a_source_selection_depends_only_on_its_own_qids() -> None:
    base = sample_mini(_records({"a": 50, "b": 50}), size=20, seed=7)
    grown = sample_mini(_records({"a": 50, "b": 50, "c": 10}), size=30, seed=7)  # same quotas for a and b
    assert grown.quotas == {"a": 10, "b": 10, "c": 10}

    def of(manifest: Manifest, source: str) -> set[str]:
        return {r.qid for r in manifest.records if r.source == source}

    assert of(base, "a") == of(grown, "a") and of(base, "b") == of(grown, "b")


def test_sampling_is_uniform_over_seeds() -> None:
    # 2,000 draws of 5 out of 20: every qid should be chosen about 500 times (binomial sd ~19).
    counts: Counter[str] = Counter()
    records = _records({"s": 20})
    for seed in range(2_000):
        counts.update(r.qid for r in sample_mini(records, size=5, seed=seed).records)
    assert len(counts) == 20
    assert all(400 < count < 600 for count in counts.values())


def test_rcarun_manifest_round_trips(tmp_path: Path) -> None:
    manifest = sample_mini(_records({"a": 5, "b": 7}), size=6, seed=3)
    path = tmp_path / "m.json"
    save_manifest(manifest, path)
    raw = json.loads(path.read_text())
    assert set(raw) == {"seed", "size", "quotas", "dataset_sha256", "records"}
    assert set(raw["records"][0]) == {"qid", "source", "sha256"}
    assert load_manifest(path) == manifest


def test_the_official_longrca_mini_list_ships_and_loads() -> None:
    manifest = load_manifest(longrca_mini_manifest_path())
    assert load_manifest("longrca-mini") == manifest  # the keyword every manifest option accepts
    assert manifest.origin == "longrca"
    assert manifest.quotas == dict.fromkeys(LONGRCA, 40)
    first = manifest.records[0]
    assert first == ManifestRecord(
        qid="swe_bench_pro__008",
        source="swe_bench_pro",
        sha256="823849c214ef2d01f2f6d263b76e078defc4709b96b3a58578651f7ac5c867f9",
        path="data/mini/swe_bench_pro/swe_bench_pro__008.json",
        size_bytes=567161,
    )
    shared = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "longrca" / "mini_manifest.json"
    if shared.is_file():
        assert longrca_mini_manifest_path().read_bytes() == shared.read_bytes()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "not UTF-8 JSON"),
        (b"[]", "JSON object"),
        (b'{"x": 1}', "not a manifest"),
        (b'{"records": [{"qid": "a", "source": "s"}]}', "sha256"),
        (b'{"files": [{"sha256": "ab"}]}', "question_ID"),
    ],
)
def test_bad_manifests_name_the_file_and_field(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message) as raised:
        load_manifest(path)
    assert str(path) in str(raised.value)


def test_sample_of_who_and_when_hashes_each_file(who_and_when: Path) -> None:
    records = [
        (r.trajectory.qid, r.trajectory.source, r.trajectory.sha256) for r in iter_dataset(who_and_when)
    ]
    manifest = sample_mini(records, size=30, seed=20260821)
    # 126 + 20 trajectories: equal quotas of 15 fit both sources.
    assert manifest.quotas == {"algorithm_generated": 15, "hand_crafted": 15}
    for record in manifest.records:
        source, stem = record.qid.split("/")
        assert (
            hashlib.sha256((who_and_when / source / f"{stem}.json").read_bytes()).hexdigest() == record.sha256
        )
