"""`rcarun data check`: every problem located, labels never changed, manifests verified file by file."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rcarun.cli import main
from rcarun.data import ManifestRecord, check_dataset, iter_dataset, sample_mini, save_manifest
from rcarun.data.manifest import Manifest

RecordWriter = Callable[..., Path]


def _longrca(qid: str, steps: int, root: int, agent: str = "ActionAgent") -> dict[str, Any]:
    names = ["human", "DiagnostAgent (-> ActionAgent)", "ActionAgent", "Computer_terminal"]
    return {
        "question_ID": qid,
        "history": [
            {"step": i, "name": names[i % 4], "role": "assistant", "content": f"step {i}"}
            for i in range(steps)
        ],
        "mistake_agent": agent,
        "mistake_step": root,
        "mistake_reason": "why",
    }


def test_who_and_when_loads_every_record_and_reports_its_noisy_labels(who_and_when: Path) -> None:
    report = check_dataset(who_and_when)
    assert report.ok and report.loaded == 146 == sum(1 for _ in iter_dataset(who_and_when))
    noisy = {p.record: p for p in report.problems if p.kind == "noisy_label"}
    assert set(noisy) == {
        "algorithm_generated/14",
        "algorithm_generated/15",
        "algorithm_generated/59",
        "hand_crafted/20",
    }
    assert noisy["hand_crafted/20"].path.endswith("hand_crafted/20.json")
    assert "'WebSurfer' but step 3 is spoken by 'Orchestrator'" in noisy["hand_crafted/20"].message
    # Reported, not repaired: the label is still the recorded one.
    label = json.loads((who_and_when / "hand_crafted" / "20.json").read_text())
    loaded = {r.trajectory.qid: r.reference for r in iter_dataset(who_and_when)}["hand_crafted/20"]
    assert loaded is not None and (loaded.role, str(loaded.step)) == (
        label["mistake_agent"],
        label["mistake_step"],
    )
    empty = sorted(p.record for p in report.problems if p.kind == "empty_content")
    assert empty == ["algorithm_generated/36", "algorithm_generated/99"]
    assert [p.kind for p in report.errors] == []
    summary = report.sources["hand_crafted"]
    assert (summary.trajectories, summary.labelled) == (20, 20)


def test_every_unusable_record_is_located_and_the_rest_are_summarised(
    write_record: RecordWriter, tmp_path: Path
) -> None:
    write_record(_longrca("s__001", 10, 2), name="s__001")  # root-to-end 7
    write_record(_longrca("s__002", 20, 15), name="s__002")  # root-to-end 4
    write_record(_longrca("s__003", 6, 6), name="s__003")  # step out of range
    write_record(_longrca("s__004", 6, 2, agent="Nobody"), name="s__004")  # role not recorded
    write_record({**_longrca("s__005", 6, 2), "mistake_step": "two"}, name="s__005")  # not an integer
    write_record(b'{"question_ID": "s__006", "history": [', name="s__006")  # truncated JSON
    write_record(
        {"question_ID": "s__007", "mistake_agent": "x", "mistake_step": 1}, name="s__007"
    )  # no history
    write_record(_longrca("s__001", 10, 3), source="t", name="s__001")  # duplicate qid in another source
    unlabelled = _longrca("t__002", 4, 1)
    del unlabelled["mistake_agent"], unlabelled["mistake_step"]
    write_record(unlabelled, source="t", name="t__002")

    report = check_dataset(tmp_path / "ds")
    assert not report.ok
    errors = {(Path(p.path).name, p.field) for p in report.errors}
    assert errors == {
        ("s__003.json", "mistake_step"),
        ("s__004.json", "mistake_agent"),
        ("s__005.json", "mistake_step"),
        ("s__006.json", ""),
        ("s__007.json", "history"),
        ("s__001.json", "question_ID"),  # the later duplicate (source t)
    }
    assert all(p.kind == "unusable" and p.record for p in report.errors)
    assert [p.record for p in report.problems if p.kind == "unlabelled"] == ["t__002"]
    s = report.sources["src"]
    assert (s.trajectories, s.labelled, s.steps) == (2, 2, 30)
    assert s.history_chars == sum(len(f"step {i}") for i in range(10)) + sum(
        len(f"step {i}") for i in range(20)
    )
    assert s.median_root_to_end == 5.5
    assert report.sources["t"].median_root_to_end is None


def test_cli_exit_status_and_output(
    write_record: RecordWriter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_record(_longrca("s__001", 10, 2), name="s__001")
    assert main(["data", "check", str(tmp_path / "ds")]) == 0
    out = capsys.readouterr().out
    assert "1 trajectories loaded, 0 unusable" in out and out.rstrip().endswith("OK")

    write_record(_longrca("s__002", 5, 9), name="s__002")
    assert main(["data", "check", str(tmp_path / "ds"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["loaded"] == 1
    assert [(p["record"], p["field"]) for p in report["problems"]] == [("s__002", "mistake_step")]
    assert report["sources"]["src"]["median_root_to_end"] == 7


def test_manifest_verification_file_by_file(write_record: RecordWriter, tmp_path: Path) -> None:
    files = {qid: write_record(_longrca(qid, 8, 2), name=qid) for qid in ("s__001", "s__002", "s__003")}
    digest = {qid: hashlib.sha256(path.read_bytes()).hexdigest() for qid, path in files.items()}
    manifest = Manifest(
        records=(
            ManifestRecord("s__001", "s", digest["s__001"]),
            ManifestRecord("s__002", "s", "0" * 64),  # the user's copy differs
            ManifestRecord("s__009", "s", "1" * 64),  # the user's copy lacks it
        )
    )
    report = check_dataset(tmp_path / "ds", manifest=manifest)
    assert not report.ok
    assert [(p.kind, p.record) for p in report.errors] == [
        ("manifest_sha256", "s__002"),
        ("manifest_missing", "s__009"),
    ]
    assert (report.manifest_records, report.manifest_verified, report.manifest_unlisted) == (3, 1, 1)


def test_cli_sample_mini_writes_a_manifest_a_check_verifies(
    write_record: RecordWriter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for source, count in (("a", 6), ("b", 2)):
        for i in range(count):
            write_record(_longrca(f"{source}__{i:03d}", 8, 2), source=source, name=f"{source}__{i:03d}")
    out = tmp_path / "mini.json"
    assert (
        main(["data", "sample-mini", str(tmp_path / "ds"), "--size", "6", "--seed", "5", "--out", str(out)])
        == 0
    )
    manifest = json.loads(out.read_text())
    assert manifest["quotas"] == {"a": 4, "b": 2} and manifest["seed"] == 5 and manifest["size"] == 6
    assert main(["data", "check", str(tmp_path / "ds"), "--manifest", str(out)]) == 0
    assert "6 listed, 6 verified; 2 loaded trajectories are not in it" in capsys.readouterr().out
    assert main(["data", "sample-mini", str(tmp_path / "ds"), "--size", "99"]) == 2
    assert "exceeds" in capsys.readouterr().err


def test_sample_mini_output_is_reproducible(write_record: RecordWriter, tmp_path: Path) -> None:
    for i in range(9):
        write_record(_longrca(f"a__{i:03d}", 5, 1), source="a", name=f"a__{i:03d}")
    triples = [
        (r.trajectory.qid, r.trajectory.source, r.trajectory.sha256) for r in iter_dataset(tmp_path / "ds")
    ]
    first, second = tmp_path / "1.json", tmp_path / "2.json"
    save_manifest(sample_mini(triples, size=4, seed=1), first)
    save_manifest(sample_mini(triples, size=4, seed=1), second)
    assert first.read_bytes() == second.read_bytes()


def test_repaired_text_is_a_warning_naming_the_fields_and_bad_identifiers_are_errors(
    write_record: RecordWriter, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repaired = _longrca("s__001", 12, 2)
    for step in repaired["history"]:
        step["content"] += " \ud800"  # json writes the escape text; the loader replaces it by U+FFFD
    repaired["mistake_reason"] = "why \udfff"
    repaired_file = write_record(repaired, name="s__001")
    bad = _longrca("s__002", 4, 2)
    bad["history"][3]["role"] = "user\ud800"
    bad_file = write_record(bad, name="s__002")

    report = check_dataset(tmp_path / "ds")

    assert not report.ok and report.loaded == 1
    shown = ", ".join(f"history[{i}].content" for i in range(10))
    assert [(p.severity, p.kind, p.path, p.record, p.field, p.message) for p in report.problems] == [
        (
            "warning",
            "repaired_text",
            str(repaired_file),
            "s__001",
            "",
            f"unpaired UTF-16 surrogates replaced by U+FFFD in {shown} and 3 more",
        ),
        (
            "error",
            "unusable",
            str(bad_file),
            "s__002",
            "history[3].role",
            "contains an unpaired UTF-16 surrogate (\\ud800 at character 4); identifiers must be valid Unicode",
        ),
    ]
    # The repair keeps every character in place: the history is as long as recorded.
    assert report.sources["src"].history_chars == sum(len(f"step {i} \ufffd") for i in range(12))

    assert main(["data", "check", str(tmp_path / "ds")]) == 1
    out = capsys.readouterr().out
    assert (
        f"warning: {repaired_file}, record s__001: unpaired UTF-16 surrogates replaced by U+FFFD in {shown} "
        "and 3 more"
    ) in out.splitlines()
    assert "1 trajectories loaded, 1 unusable, 1 errors, 1 warnings" in out
