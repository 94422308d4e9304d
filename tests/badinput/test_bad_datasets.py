"""Malformed datasets: `rcarun data check` names file, record and field for each; a sweep runs the good records.

The corpus is in `helpers.badinput`. A check lists every problem at once and fails; a sweep leaves the bad
records out as ``data_problem`` events in results.db, predicts the good ones and says how many it left out.
Valid extremes (a 5,000-step history, a 2 MB step) load and run. A lone UTF-16 surrogate makes an identifier
unusable and is repaired in free text: the check warns, and the sweep runs the repaired record.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.badinput import (
    HUGE_STEP_CHARS,
    LONG_HISTORY_STEPS,
    BadDataset,
    good_trajectory,
    write_surrogate_dataset,
)
from helpers.sweeps import rows
from rcarun.cli import main
from rcarun.data import Manifest, ManifestRecord, iter_dataset, save_manifest
from rcarun.errors import DataError


def _rcarun(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rcarun.cli", *args], capture_output=True, text=True, timeout=120, check=False
    )


def _sweep_config(path: Path, dataset: Path, base_url: str, extra_sweep: str = "") -> Path:
    path.write_text(
        f"""
[sweep]
dataset = "{dataset}"
drain_timeout_s = 5
{extra_sweep}

[[methods]]
name = "all-at-once"

[[methods]]
name = "all-at-once"
label = "untruncated"
options = {{ truncation = "none" }}

[backbones.sim]
provider = "simulated"
model = "sim-model"
base_url = "{base_url}"
context_window = 200000
"""
    )
    return path


def test_data_check_names_file_record_and_field_of_every_problem(bad_dataset: BadDataset) -> None:
    result = _rcarun("data", "check", str(bad_dataset.root))

    assert result.returncode == 1
    errors = [line for line in result.stdout.splitlines() if line.startswith("error: ")]
    assert errors == list(bad_dataset.messages)
    assert (
        f"{bad_dataset.root}: {bad_dataset.good} trajectories loaded, {len(errors)} unusable, "
        f"{len(errors)} errors, 0 warnings"
    ) in result.stdout
    assert result.stdout.rstrip().endswith("FAILED: see the errors above")
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr == ""


def test_a_5000_step_history_and_a_2_mb_step_are_valid(
    big_dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["data", "check", str(big_dataset)]) == 0

    out = capsys.readouterr().out
    assert f"{big_dataset}: 3 trajectories loaded, 0 unusable, 0 errors, 0 warnings" in out
    steps = {r.trajectory.qid: r.trajectory.n_steps for r in iter_dataset(big_dataset)}
    assert steps == {"src/1": 3, "src/2": LONG_HISTORY_STEPS, "src/3": 3}
    assert out.rstrip().endswith("OK")


def test_data_check_reports_a_record_whose_hash_differs_from_the_manifest(
    small_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = {r.trajectory.qid: r.trajectory for r in iter_dataset(small_dataset)}
    manifest = tmp_path / "manifest.json"
    save_manifest(
        Manifest(
            records=(
                ManifestRecord("src/1", "src", records["src/1"].sha256),
                ManifestRecord("src/2", "src", "0" * 64),
            )
        ),
        manifest,
    )

    assert main(["data", "check", str(small_dataset), "--manifest", str(manifest)]) == 1

    out = capsys.readouterr().out
    assert (
        f"error: {small_dataset / 'src' / '2.json'}, record src/2: "
        f"SHA-256 {records['src/2'].sha256} differs from the manifest's {'0' * 64}"
    ) in out.splitlines()
    assert f"manifest {manifest}: 2 listed, 1 verified; 0 loaded trajectories are not in it" in out


def test_a_sweep_runs_the_good_records_and_stores_each_bad_one_as_a_data_problem(
    bad_dataset: BadDataset, big_dataset: Path, tmp_path: Path, mock_url: str
) -> None:
    # One dataset with the bad records and the valid extremes: the 5,000-step history and the 2 MB step.
    for file in big_dataset.glob("src/*.json"):
        file.rename(bad_dataset.root / "src" / f"big-{file.name}")
    db = tmp_path / "results.db"
    config = _sweep_config(tmp_path / "bad-sweep.toml", bad_dataset.root, mock_url)

    result = _rcarun("sweep", "--config", str(config), "--db", str(db), "--no-progress")

    assert "Traceback" not in result.stdout + result.stderr
    # The run went to the end, but one item failed for good (the untruncated 2 MB step, below): exit 4.
    assert result.returncode == 4, result.stderr
    assert "ContextOverflow: prompt of about" in result.stdout and "--retry-failed" in result.stdout
    problems = len(bad_dataset.messages)
    good = bad_dataset.good + 3
    assert (
        f"run 'bad-sweep' (id 1) finished: {good} trajectories, {problems} data problems, results in {db}"
    ) in result.stdout.splitlines()
    stored = [
        json.loads(detail)
        for (detail,) in rows(db, "SELECT detail_json FROM run_events WHERE kind = 'data_problem'")
    ]
    assert sorted(f"error: {event['message']}" for event in stored) == sorted(bad_dataset.messages)
    assert all(event["path"] and event["record"] for event in stored)
    assert rows(db, "SELECT status, count(*) FROM runs GROUP BY status") == [("finished", 1)]

    predicted = dict(
        rows(db, "SELECT qid || ' ' || method, output_json FROM predictions WHERE error IS NULL")
    )
    assert len([key for key in predicted if key.endswith(" all-at-once")]) == good
    # The 2 MB step is cut to fit the context window, and the prediction says so.
    truncation = json.loads(predicted["src/big-3 all-at-once"])["truncation"]
    assert truncation["applied"] and truncation["steps_cut"] == 1 and truncation["fits"]
    assert "src/big-2 all-at-once" in predicted  # the 5,000-step history ran
    # Untruncated, the 2 MB step cannot fit: that item fails with a stored reason, the others are predicted.
    failed = rows(db, "SELECT qid, error FROM items WHERE method = 'untruncated' AND status != 'done'")
    assert [qid for qid, _ in failed] == ["src/big-3"]
    match = re.fullmatch(
        r"ContextOverflow: prompt of about (\d+) tokens leaves no room for output in a 200000-token context "
        r"window \(safety margin \d+\)",
        failed[0][1],
    )
    assert match and int(match[1]) >= HUGE_STEP_CHARS // 4  # the estimator's 4 characters per token
    assert len([key for key in predicted if key.endswith(" untruncated")]) == good - 1


def test_a_manifest_hash_mismatch_leaves_that_record_out_of_the_sweep(
    small_dataset: Path, tmp_path: Path, mock_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    records = {r.trajectory.qid: r.trajectory for r in iter_dataset(small_dataset)}
    manifest = tmp_path / "mini.json"
    save_manifest(
        Manifest(
            records=(
                ManifestRecord("src/1", "src", records["src/1"].sha256),
                ManifestRecord("src/2", "src", "f" * 64),
            )
        ),
        manifest,
    )
    (small_dataset / "src" / "2.json").write_text(json.dumps(good_trajectory(question="edited")))
    edited = next(r for r in iter_dataset(small_dataset) if r.trajectory.qid == "src/2").trajectory.sha256
    db = tmp_path / "results.db"
    config = _sweep_config(tmp_path / "mini.toml", small_dataset, mock_url, f'manifest = "{manifest}"')

    code = main(["sweep", "--config", str(config), "--db", str(db), "--no-progress"])

    assert code == 0
    assert (
        f"run 'mini' (id 1) finished: 1 trajectories, 1 data problems, results in {db}"
        in capsys.readouterr().out
    )
    (detail,) = rows(db, "SELECT detail_json FROM run_events WHERE kind = 'data_problem'")[0]
    assert json.loads(detail)["message"] == (
        f"{small_dataset / 'src' / '2.json'}, record src/2: "
        f"SHA-256 {edited} differs from the manifest's {'f' * 64}; left out"
    )
    assert rows(db, "SELECT DISTINCT qid FROM predictions") == [("src/1",)]


def test_data_check_rejects_surrogates_in_identifiers_and_warns_about_repaired_text(tmp_path: Path) -> None:
    dataset = write_surrogate_dataset(tmp_path / "surrogates")

    result = _rcarun("data", "check", str(dataset.root))

    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr == ""
    assert result.returncode == 1
    found = [line for line in result.stdout.splitlines() if line.startswith(("error: ", "warning: "))]
    assert found == list(dataset.lines)
    errors = len(dataset.errors)
    assert (
        f"{dataset.root}: {len(dataset.loaded)} trajectories loaded, {errors} unusable, {errors} errors, "
        f"{len(dataset.lines) - errors} warnings"
    ) in result.stdout
    assert result.stdout.rstrip().endswith("FAILED: see the errors above")

    problems: list[DataError] = []
    records = iter_dataset(dataset.root, strict=False, on_problem=problems.append)
    loaded = {record.trajectory.qid: record for record in records}
    assert tuple(loaded) == dataset.loaded
    assert [f"error: {problem}" for problem in problems] == list(dataset.errors)
    assert tuple(qid for qid, record in loaded.items() if record.repaired_fields) == dataset.repaired
    repaired = loaded["u/1"].trajectory
    assert (repaired.steps[2].content, repaired.task) == ("step \ufffd 2", "\ufffdq")
    assert loaded["lines/a"].repaired_fields == ("history[2].content", "ground_truth", "mistake_reason")
    reference = loaded["lines/a"].reference
    assert reference is not None and reference.rationale == "cut \ufffd"
    # Odd but encodable text and valid pairs are kept exactly; everything loaded now encodes to UTF-8.
    odd = loaded["lines/f"]
    assert odd.trajectory.steps[0].content == "nul \x00 rtl \u202e bom \ufeff zwj \u200d \U0001f600"
    assert odd.trajectory.agents == ("A0", "A1\U0001f600") and odd.repaired_fields == ()
    for record in loaded.values():
        trajectory = record.trajectory
        texts = [trajectory.qid, trajectory.source, trajectory.task, trajectory.ground_truth]
        texts += [text for step in trajectory.steps for text in (step.agent, step.role, step.content)]
        if record.reference is not None:
            texts += [record.reference.role, record.reference.rationale]
        for text in texts:
            text.encode("utf-8")


def test_a_sweep_runs_repaired_records_and_leaves_out_bad_identifiers(tmp_path: Path, mock_url: str) -> None:
    dataset = write_surrogate_dataset(tmp_path / "surrogates")
    db = tmp_path / "results.db"
    config = _sweep_config(tmp_path / "surrogates.toml", dataset.root, mock_url)

    result = _rcarun("sweep", "--config", str(config), "--db", str(db), "--no-progress")

    assert "Traceback" not in result.stdout + result.stderr
    assert result.returncode == 0, result.stderr
    assert (
        f"run 'surrogates' (id 1) finished: {len(dataset.loaded)} trajectories, {len(dataset.errors)} data "
        f"problems, results in {db}"
    ) in result.stdout.splitlines()
    stored = [
        json.loads(detail)["message"]
        for (detail,) in rows(db, "SELECT detail_json FROM run_events WHERE kind = 'data_problem'")
    ]
    assert sorted(f"error: {message}" for message in stored) == sorted(dataset.errors)
    assert rows(db, "SELECT qid FROM trajectories ORDER BY qid") == [(qid,) for qid in sorted(dataset.loaded)]
    done = rows(db, "SELECT qid, method, status FROM items ORDER BY qid, method")
    assert done == [
        (qid, method, "done") for qid in sorted(dataset.loaded) for method in ("all-at-once", "untruncated")
    ]
    predicted = rows(db, "SELECT qid, method FROM predictions WHERE error IS NULL ORDER BY qid, method")
    assert predicted == [
        (qid, method) for qid in sorted(dataset.loaded) for method in ("all-at-once", "untruncated")
    ]
    assert rows(db, "SELECT status FROM runs") == [("finished",)]
