"""LongRCA-Mini against Full (App. A): fixed-manifest fidelity and the sample-size calibration, worked by hand.

The Full run (``full``) has 9 trajectories, source a: f0–f5 and b: f6–f8; a prediction is either right on every
target (Planner at step 10) or wrong on every one (Coder at 30), so Agent, Step and Step ±5 agree.

- ``rcta`` right on f0–f3 and f6: Macro (4/6 + 1/3) / 2 = 1/2, pooled 5/9.
- ``aao`` right on f0, f6, f7: Macro (1/6 + 2/3) / 2 = 5/12, pooled 3/9.

The Mini run (``mini``, drawn by a manifest) holds f0, f1, f4 (a) and f6, f8 (b), answered anew:

- ``rcta`` right on f0, f6, f8: Macro (1/3 + 1) / 2 = 2/3; post-stratified to 6/3: (6·1/3 + 3·1)/9 = 5/9.
- ``aao`` right on none: 0.

The Full run's own predictions on the Mini trajectories (the paper's "cached" estimand): ``rcta`` a 2/3, b 1/2,
Macro 7/12, post-stratified (6·2/3 + 3·1/2)/9 = 11/18; ``aao`` a 1/3, b 1/2, Macro 5/12.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from analysis.builders import Pred, Traj, build_run
from rcarun.analysis import (
    Expected,
    Prediction,
    Report,
    ReportOptions,
    build_report,
    render_text,
    score_items,
)
from rcarun.analysis.fidelity import CALIBRATION_SIZES, sample_size_calibration
from rcarun.cli import main
from rcarun.errors import ConfigError
from rcarun.store import open_store

FULL = [Traj(f"f{i}", "a" if i < 6 else "b") for i in range(9)]
MINI_QIDS = ("f0", "f1", "f4", "f6", "f8")
METHODS = [{"name": "rcta"}, {"name": "all-at-once", "label": "aao"}]


def _answers(right: dict[str, set[str]], trajs: list[Traj]) -> list[Pred]:
    return [
        Pred("bb", method, t.qid, *(("Planner", 10) if t.qid in hits else ("Coder", 30)))
        for method, hits in right.items()
        for t in trajs
    ]


def _write(db: Path) -> None:
    build_run(
        db,
        "full",
        FULL,
        _answers({"rcta": {"f0", "f1", "f2", "f3", "f6"}, "aao": {"f0", "f6", "f7"}}, FULL),
        methods=METHODS,
    )
    mini = [t for t in FULL if t.qid in MINI_QIDS]
    build_run(
        db,
        "mini",
        mini,
        _answers({"rcta": {"f0", "f6", "f8"}, "aao": set()}, mini),
        methods=METHODS,
        manifest="longrca-mini",
    )
    stranger = [*mini[:4], Traj("x9", "b")]
    build_run(db, "stranger", stranger, _answers({"rcta": {"f0"}, "aao": set()}, stranger), methods=METHODS)
    one_source = [t for t in mini if t.source == "a"]
    build_run(
        db, "one-source", one_source, _answers({"rcta": {"f0"}, "aao": set()}, one_source), methods=METHODS
    )


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fidelity") / "results.db"
    _write(path)
    return path


def _report(db: Path, run: str, **options: Any) -> Report:
    with open_store(db, read_only=True) as store:
        found = store.run_by_name(run)
        assert found is not None
        return build_report(store, found.run_id, ReportOptions(resamples=20, **options))


def _rows(fidelity: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(row["method"], row["metric"]): row for row in fidelity["rows"]}


def test_mini_and_full_scores_side_by_side(db: Path) -> None:
    report = _report(db, "mini", calibrate_against="full")
    assert report.aggregate == "macro"  # a manifest run: Mini's Macro
    fidelity = report.fidelity
    assert (fidelity["full_run"], fidelity["mini_run"], fidelity["cached"]) == ("full", "mini", True)
    assert fidelity["sources"] == {"a": {"full": 6, "mini": 3}, "b": {"full": 3, "mini": 2}}
    rows = _rows(fidelity)
    assert len(rows) == 6 and fidelity["excluded"] == []
    for metric in ("agent_acc", "step_acc", "step_pm5"):
        rcta, aao = rows["rcta", metric], rows["aao", metric]
        assert (rcta["full"], rcta["mini"], rcta["mini_cached"]) == pytest.approx((1 / 2, 2 / 3, 7 / 12))
        assert (rcta["abs_dev"], rcta["abs_dev_cached"]) == pytest.approx((1 / 6, 1 / 12))
        assert (aao["full"], aao["mini"], aao["mini_cached"]) == pytest.approx((5 / 12, 0.0, 5 / 12))
        assert (aao["abs_dev"], aao["abs_dev_cached"]) == pytest.approx((5 / 12, 0.0))
        # Table 9: per source, Full / Mini / Full predictions on Mini
        assert rcta["per_source"]["a"] == pytest.approx({"full": 4 / 6, "mini": 1 / 3, "mini_cached": 2 / 3})
        assert rcta["per_source"]["b"] == pytest.approx({"full": 1 / 3, "mini": 1.0, "mini_cached": 1 / 2})
        # Table 10: Full pooled against Mini post-stratified to the Full run's 6/3
        mixture = rcta["post_stratified"]
        assert (mixture["full"], mixture["mini"], mixture["mini_cached"]) == pytest.approx(
            (5 / 9, 5 / 9, 11 / 18)
        )
        assert (mixture["abs_dev"], mixture["abs_dev_cached"]) == pytest.approx((0.0, 1 / 18))
    [summary] = fidelity["summary"]
    assert summary["pairs"] == 6
    assert (summary["mean_abs_dev"], summary["max_abs_dev"]) == pytest.approx((7 / 24, 5 / 12))
    assert (summary["mean_abs_dev_cached"], summary["max_abs_dev_cached"]) == pytest.approx((1 / 24, 1 / 12))
    text = " ".join(render_text(report, sections=("fidelity",)).split())
    assert "Mini against Full (App. A)" in text
    assert (
        "mean |Δ| 29.17 pp and max 41.67 pp for the Mini run; 4.17 and 8.33 pp with the Full run's own"
        in text
    )


def test_without_every_mini_trajectory_in_full_only_the_runs_own_predictions_compare(db: Path) -> None:
    fidelity = _report(db, "stranger", calibrate_against="full").fidelity
    assert fidelity["cached"] is False
    assert all(row["mini_cached"] is None and row["abs_dev_cached"] is None for row in fidelity["rows"])
    assert fidelity["summary"][0]["mean_abs_dev_cached"] is None
    assert "cannot stand in for the Mini side" in render_text(
        _report(db, "stranger", calibrate_against="full"), sections=("fidelity",)
    ).replace("\n", " ")


def test_runs_over_different_sources_are_refused(db: Path) -> None:
    with pytest.raises(ConfigError, match="sources"):
        _report(db, "one-source", calibrate_against="full")
    with pytest.raises(ConfigError, match="own run"):
        _report(db, "mini", calibrate_against="mini")


def test_the_full_run_may_live_in_another_database(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full_db = tmp_path / "full.db"
    build_run(
        full_db,
        "full",
        FULL,
        _answers({"rcta": {"f0", "f1", "f2", "f3", "f6"}, "aao": {"f0", "f6", "f7"}}, FULL),
        methods=METHODS,
    )
    mini_db = tmp_path / "mini.db"
    mini = [t for t in FULL if t.qid in MINI_QIDS]
    build_run(
        mini_db,
        "mini",
        mini,
        _answers({"rcta": {"f0", "f6", "f8"}, "aao": set()}, mini),
        methods=METHODS,
        manifest="m",
    )
    argv = ["report", "--db", str(mini_db), "--run", "mini", "--resamples", "20", "--json"]
    assert main([*argv, "--calibrate-against", "full", "--calibrate-db", str(full_db)]) == 0
    fidelity = json.loads(capsys.readouterr().out)["fidelity"]
    assert fidelity["full_db"] == str(full_db)
    assert _rows(fidelity)["rcta", "step_acc"]["abs_dev_cached"] == pytest.approx(1 / 12)
    assert main([*argv, "--calibrate-db", str(full_db)]) == 2
    assert "give --calibrate-against too" in capsys.readouterr().err
    assert main([*argv, "--calibrate-against", "nope", "--calibrate-db", str(full_db)]) == 2
    assert "no run named 'nope'" in capsys.readouterr().err


# --- sample-size calibration (Table 5) -------------------------------------------------------------------------


def _cells(
    correct: dict[str, list[bool]], sources: list[str]
) -> tuple[list[Expected], dict[tuple[str, str], Any]]:
    expected = [Expected(f"t{i}", source, 20, "R", 3) for i, source in enumerate(sources)]
    cells = {
        ("bb", method): score_items(
            expected,
            {
                e.qid: Prediction("R" if hit else "S", 3 if hit else 15)
                for e, hit in zip(expected, hits, strict=True)
            },
        )
        for method, hits in correct.items()
    }
    return expected, cells


def test_calibration_errors_follow_the_exact_sampling_distribution() -> None:
    # Source s1 = [1, 1, 0, 0], s2 = [1, 0]; quotas 2/1 at size 3. Full Macro = 1/2. Over the 6 × 2 equally
    # likely samples the error |(m1 + m2)/2 − 1/2| is 1/2 with probability 1/6, 1/4 with 4/6, 0 with 1/6: the
    # median is 1/4 (CDF 1/6 at 0, 5/6 at 1/4) and the nearest-rank p95 is 1/2.
    expected, cells = _cells({"m": [True, True, False, False, True, False]}, ["s1"] * 4 + ["s2"] * 2)
    result = sample_size_calibration(expected, cells, [3, 6, 7], draws=4000, seed=11)
    assert (result["sizes"], result["skipped"]) == ([3, 6], [7])
    small, whole = result["rows"]
    assert small["quotas"] == {"s1": 2, "s2": 1}
    pairs = {pair["metric"]: pair for pair in small["pairs"]}
    assert set(pairs) == {"agent_acc", "step_acc", "step_pm5"}
    assert (pairs["step_acc"]["median"], pairs["step_acc"]["p95"]) == (0.25, 0.5)
    assert (small["max_median"], small["max_p95"], small["passes"]) == (0.25, 0.5, False)
    # the whole run as the sample: no error at all
    assert (whole["quotas"], whole["max_median"], whole["max_p95"], whole["passes"]) == (
        {"s1": 4, "s2": 2},
        0.0,
        0.0,
        True,
    )
    # the same seed draws the same samples
    again = sample_size_calibration(expected, cells, [3, 6, 7], draws=4000, seed=11)
    assert again == result


def test_every_method_shares_the_draws_and_constant_sources_never_err() -> None:
    # "stable" is right on all of s1 and none of s2: every equal-quota sample reproduces its Full Macro.
    sources = ["s1"] * 6 + ["s2"] * 3
    noisy = [True, False, True, False, True, False, True, False, False]
    expected, cells = _cells({"stable": [True] * 6 + [False] * 3, "noisy": noisy}, sources)
    result = sample_size_calibration(expected, cells, [4], draws=500, seed=5)
    [row] = result["rows"]
    assert row["quotas"] == {"s1": 2, "s2": 2}
    stable = [pair for pair in row["pairs"] if pair["method"] == "stable"]
    assert all(pair["median"] == 0.0 and pair["p95"] == 0.0 for pair in stable)
    assert row["max_p95_pair"]["method"] == "noisy" and row["max_p95"] > 0


def test_paper_sizes_and_the_report_section(db: Path) -> None:
    assert CALIBRATION_SIZES == (75, 100, 125, 150, 175, 200, 225, 250, 300, 400, 600)
    report = _report(db, "full", calibration_sizes=(4, 9, 50), draws=300)
    calibration = report.calibration
    assert (calibration["sizes"], calibration["skipped"], calibration["draws"]) == ([4, 9], [50], 300)
    assert calibration["seed"] == 20260820
    by_size = {row["size"]: row for row in calibration["rows"]}
    assert by_size[9]["passes"] and by_size[9]["max_median"] == 0.0
    assert by_size[4]["quotas"] == {"a": 2, "b": 2}
    assert {pair["method"] for pair in by_size[4]["pairs"]} == {"rcta", "aao"}
    text = render_text(report, sections=("calibration",))
    assert "Sample-size calibration (App. A, Table 5)" in text and "Quotas (a/b)" in text
    assert math.isclose(by_size[4]["max_p95"], max(pair["p95"] for pair in by_size[4]["pairs"]))
