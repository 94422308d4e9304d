"""Root-step label sensitivity (LongRCA App. K.1, Table 22) on a case whose distribution is known exactly.

Three trajectories, each with final reference root 10 (40 steps). Observed annotations: t0 {10, 20}, t1
{10, 10, 30} (so 10 is drawn with probability 2/3), t2 {10} (a single annotation: outside the subset, n = 2).

- A predicts 10, 10, 10; B predicts 20, 30, 10; C predicts 15 and nothing valid on t1.
- Final labels: Step Acc A 1, B 0, C 0; Step ±5 A 1, B 0, C 1/2 (15 is 5 from 10).
- Per draw, Step Acc: A = ([t0 = 10] + [t1 = 10]) / 2, mean (1/2 + 2/3) / 2 = 7/12; B mean (1/2 + 1/3) / 2 =
  5/12; C 0. A leads strictly only when both draws are 10 (probability 1/3); B when both are the others (1/6);
  the rest are ties, which are no wins. A − max(B, C) is 1, 0 or −1 with probabilities 1/3, 1/2, 1/6: mean 1/6.
- Step ±5: C is always within 5 of t0's label (15 against 10 or 20), so exactly 1/2 in every draw.
- Full ordering (Table 22's last row): every draw gives t0 and t1 each to A or to B, so A + B = 1 per draw. Step
  Acc's final ordering A > B = C holds only when A takes both (B = C = 0): probability 1/2 · 2/3 = 1/3; Step ±5's
  A > C > B needs A above 1/2, again both: 1/3.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from analysis.builders import Pred, Traj, build_run
from rcarun.analysis import Expected, Prediction, ReportOptions, build_report, render_text, score_items
from rcarun.analysis.sensitivity import ANNOTATION_SEED, label_sensitivity, load_annotations
from rcarun.cli import main
from rcarun.errors import DataError
from rcarun.store import open_store

ANNOTATIONS = {"t0": (10, 20), "t1": (10, 10, 30), "t2": (10,), "elsewhere": (1, 2)}
STEPS = {"A": (10, 10, 10), "B": (20, 30, 10), "C": (15, None, 3)}


def _case() -> tuple[list[Expected], dict[str, Any]]:
    expected = [Expected(f"t{i}", "s", 40, "R", 10) for i in range(3)]
    cells = {
        method: score_items(
            expected, {e.qid: Prediction("R", step) for e, step in zip(expected, steps, strict=True)}
        )
        for method, steps in STEPS.items()
    }
    return expected, cells


def _by(result: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(row["method"], row["metric"]): row for row in result["rows"]}


def test_scores_under_drawn_labels_match_the_exact_distribution() -> None:
    expected, cells = _case()
    result = label_sensitivity(expected, cells, ANNOTATIONS, reference="A", draws=20_000)
    assert result["n"] == 2
    rows = _by(result)
    assert {k: rows[k]["final"] for k in rows} == {
        ("A", "step_acc"): 1.0,
        ("B", "step_acc"): 0.0,
        ("C", "step_acc"): 0.0,
        ("A", "step_pm5"): 1.0,
        ("B", "step_pm5"): 0.0,
        ("C", "step_pm5"): 0.5,
    }
    assert rows["A", "step_acc"]["mean"] == pytest.approx(7 / 12, abs=0.01)
    assert rows["B", "step_acc"]["mean"] == pytest.approx(5 / 12, abs=0.01)
    assert (rows["A", "step_acc"]["low"], rows["A", "step_acc"]["high"]) == (0.0, 1.0)
    assert rows["A", "step_acc"]["rank1"] == pytest.approx(1 / 3, abs=0.015)
    assert rows["B", "step_acc"]["rank1"] == pytest.approx(1 / 6, abs=0.015)
    assert rows["C", "step_acc"]["rank1"] == 0.0
    c = rows["C", "step_pm5"]
    assert (c["mean"], c["low"], c["high"]) == (0.5, 0.5, 0.5)
    gaps = {row["metric"]: row for row in result["gaps"]}
    assert gaps["step_acc"]["method"] == "A" and gaps["step_acc"]["final"] == 1.0
    assert gaps["step_acc"]["mean"] == pytest.approx(1 / 6, abs=0.02)
    assert (gaps["step_acc"]["low"], gaps["step_acc"]["high"]) == (-1.0, 1.0)
    # the seed fixes the draws
    assert label_sensitivity(expected, cells, ANNOTATIONS, reference="A", draws=20_000) == result
    assert (
        label_sensitivity(expected, cells, ANNOTATIONS, reference="A", draws=200, seed=ANNOTATION_SEED)
        != result
    )


def test_the_full_ordering_is_retained_by_draws_that_keep_every_pairwise_comparison() -> None:
    expected, cells = _case()
    result = label_sensitivity(expected, cells, ANNOTATIONS, reference="A", draws=20_000)
    orderings = {row["metric"]: row for row in result["orderings"]}
    assert orderings["step_acc"]["order"] == [["A"], ["B", "C"]]
    assert orderings["step_pm5"]["order"] == [["A"], ["C"], ["B"]]
    assert orderings["step_acc"]["retained"] == pytest.approx(1 / 3, abs=0.015)
    assert orderings["step_pm5"]["retained"] == pytest.approx(1 / 3, abs=0.015)
    # The same draws, counted one by one: A takes both trajectories exactly when A leads strictly (rank 1).
    assert orderings["step_acc"]["retained"] == _by(result)["A", "step_acc"]["rank1"]

    # A twin of B ties it in every draw as under the final labels: the tie is kept and the rate does not change.
    cells["B2"] = cells["B"]
    twin = label_sensitivity(expected, cells, ANNOTATIONS, reference="A", draws=20_000)
    assert [row["retained"] for row in twin["orderings"]] == [row["retained"] for row in result["orderings"]]
    assert twin["orderings"][0]["order"] == [["A"], ["B", "B2", "C"]]
    single = label_sensitivity(expected, {"A": cells["A"]}, ANNOTATIONS, reference="A", draws=10)
    assert single["orderings"] == []


def test_nothing_to_draw_and_labels_out_of_range() -> None:
    expected, cells = _case()
    empty = label_sensitivity(expected, cells, {"t2": (10,)}, reference="A", draws=10)
    assert empty == {"n": 0, "rows": [], "gaps": [], "orderings": []}
    with pytest.raises(DataError, match="outside the trajectory's 40 steps"):
        label_sensitivity(expected, cells, {"t0": (10, 40)}, reference="A", draws=10)
    no_gap = label_sensitivity(expected, cells, ANNOTATIONS, reference=None, draws=10)
    assert no_gap["gaps"] == [] and len(no_gap["rows"]) == 6


def test_annotation_files(tmp_path: Path) -> None:
    csv_file = tmp_path / "labels.csv"
    csv_file.write_text("question_ID,annotator,step\nt0,a1,10\nt0,a2, 20 \nt1,a1,10\n", encoding="utf-8")
    assert load_annotations(csv_file) == {"t0": (10, 20), "t1": (10,)}
    jsonl = tmp_path / "labels.jsonl"
    jsonl.write_text('{"question_ID": "t0", "step": 10, "role": "R"}\n\n{"question_ID": "t0", "step": "7"}\n')
    assert load_annotations(jsonl) == {"t0": (10, 7)}
    bad = tmp_path / "bad.csv"
    bad.write_text("question_ID,root\nt0,1\n", encoding="utf-8")
    with pytest.raises(DataError, match="missing column"):
        load_annotations(bad)
    bad.write_text("question_ID,step\nt0,1.5\n", encoding="utf-8")
    with pytest.raises(DataError, match="expected an integer step"):
        load_annotations(bad)
    with pytest.raises(DataError, match="unknown annotations format"):
        load_annotations(tmp_path / "labels.txt")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no annotations"):
        load_annotations(tmp_path / "empty.jsonl")


def test_the_report_section_and_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "results.db"
    trajs = [Traj(f"t{i}", "s", ref_role="R", ref_step=10, roles=("R",)) for i in range(3)]
    preds = [
        Pred("bb", label, f"t{i}", "R", step)
        for label, steps in (("rcta", STEPS["A"]), ("aao", STEPS["B"]), ("echo", STEPS["C"]))
        for i, step in enumerate(steps)
    ]
    build_run(
        db,
        "k1",
        trajs,
        preds,
        methods=[{"name": "rcta"}, {"name": "all-at-once", "label": "aao"}, {"name": "echo"}],
    )
    with open_store(db, read_only=True) as store:
        run = store.run_by_name("k1")
        assert run is not None
        report = build_report(
            store, run.run_id, ReportOptions(resamples=20, annotations=ANNOTATIONS, draws=2000)
        )
    found = report.label_sensitivity
    assert (found["n"], found["annotated"], found["unknown"], found["single"]) == (2, 4, 1, 1)
    assert (found["seed"], found["reference"]) == (20260918, "rcta")
    assert {row["backbone"] for row in found["rows"]} == {"bb"} and len(found["rows"]) == 6
    text = " ".join(render_text(report, sections=("label-sensitivity",)).split())
    assert "Label sensitivity (App. K.1, Table 22)" in text and "gap: rcta − strongest other" in text
    assert "100.0 → " in text
    assert [(row["backbone"], row["metric"], row["order"]) for row in found["orderings"]] == [
        ("bb", "step_acc", [["rcta"], ["aao", "echo"]]),
        ("bb", "step_pm5", [["rcta"], ["echo"], ["aao"]]),
    ]
    retained = found["orderings"][0]["retained"]
    assert f"full ordering retained: rcta > aao = echo Step Acc {retained * 100:.1f}" in text

    annotations = tmp_path / "annotations.jsonl"
    annotations.write_text(
        "".join(
            json.dumps({"question_ID": q, "step": s}) + "\n"
            for q, steps in ANNOTATIONS.items()
            for s in steps
        )
    )
    argv = ["report", "--db", str(db), "--resamples", "20", "--json", "--annotations", str(annotations)]
    assert main([*argv, "--draws", "2000"]) == 0
    assert json.loads(capsys.readouterr().out)["label_sensitivity"] == found
    assert main([*argv, "--draws", "0"]) == 2
    assert "--draws must be >= 1" in capsys.readouterr().err
    assert main(["report", "--db", str(db), "--annotations", str(tmp_path / "missing.csv")]) == 2
    assert "cannot read file" in capsys.readouterr().err
