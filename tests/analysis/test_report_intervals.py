"""The report's task-cluster bootstrap (App. B), leave-one-source-out (Table 13), and Wilson and Newcombe
intervals of the length groups (App. F.1), each checked on a fixture against a computation from the fixture's
own definition.

24 trajectories, 8 in each of the sources s1, s2, s3; every root ``Planner`` at step 10. Within a source,
trajectories 2k and 2k + 1 are two attempts at one task (12 tasks); odd ones are 90 steps long, even ones 30, so
two length groups split them. On backbones ``a`` and ``b`` RCTA and ECHO answer right or wrong by a fixed
pseudo-random table (a right answer is right on agent and step; a wrong one names ``Coder`` at step 20).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from pathlib import Path
from statistics import NormalDist
from typing import Any

import pytest
from statsmodels.stats.proportion import confint_proportions_2indep, proportion_confint

from analysis.builders import Pred, Traj, build_run
from rcarun.analysis import Report, ReportOptions, build_report, render_html, render_text
from rcarun.analysis.stats import cluster_paired_bootstrap, stratified_paired_bootstrap
from rcarun.cli import main
from rcarun.store import open_store

SOURCES = ("s1", "s2", "s3")
TRAJS = [
    Traj(f"{s}-{i}", s, n_steps=90 if i % 2 else 30, task=f"task {i // 2} of {s}")
    for s in SOURCES
    for i in range(8)
]
BACKBONES = ("a", "b")
RESAMPLES = 2000
_draw = random.Random(36)
RIGHT = {
    (backbone, method, t.qid): _draw.random() < (0.7 if method == "rcta" else 0.35)
    for backbone in BACKBONES
    for method in ("rcta", "echo")
    for t in TRAJS
}


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("intervals") / "results.db"
    preds = [
        Pred(b, m, qid, "Planner" if right else "Coder", 10 if right else 20)
        for (b, m, qid), right in RIGHT.items()
    ]
    build_run(path, "intervals", TRAJS, preds, methods=[{"name": "rcta"}, {"name": "echo"}])
    return path


@pytest.fixture(scope="module")
def report(db: Path) -> Report:
    with open_store(db, read_only=True) as store:
        run = store.run_by_name("intervals")
        assert run is not None
        return build_report(store, run.run_id, ReportOptions(resamples=RESAMPLES, length_groups=2))


def _right(backbone: str, method: str) -> list[float]:
    return [float(RIGHT[backbone, method, t.qid]) for t in TRAJS]


def test_the_task_cluster_bootstrap_draws_the_fixtures_tasks(report: dict[str, Any]) -> None:
    found = report.task_clusters
    assert (found["trajectories"], found["tasks"], found["without_task"]) == (24, 12, 0)
    assert report.aggregate == "macro"  # equal source sizes
    tasks = [f"{t.source}/{int(t.qid.split('-')[1]) // 2}" for t in TRAJS]
    for row, backbone in zip(found["rows"], BACKBONES, strict=True):
        assert (row["backbone"], row["method_a"], row["method_b"], row["n"], row["tasks"]) == (
            backbone,
            "rcta",
            "echo",
            24,
            12,
        )
        rcta, echo = _right(backbone, "rcta"), _right(backbone, "echo")
        expected = cluster_paired_bootstrap(
            rcta, echo, [t.source for t in TRAJS], tasks, aggregate="macro", resamples=RESAMPLES
        )
        by_source = [
            sum(rcta[i] - echo[i] for i, t in enumerate(TRAJS) if t.source == s) / 8 for s in SOURCES
        ]
        assert row["delta"] == pytest.approx(sum(by_source) / 3)
        assert (row["delta"], row["ci_low"], row["ci_high"]) == pytest.approx(
            (expected.delta, expected.low, expected.high)
        )
        # The same Δ as the paired comparison, with an interval from another resampling unit.
        paired = next(p for p in report.paired if p.backbone_a == backbone and p.metric == "step_acc")
        assert paired.delta == pytest.approx(row["delta"])


def test_leave_one_source_out_averages_the_backbones_within_each_trajectory(report: dict[str, Any]) -> None:
    rows = report.leave_one_source_out["rows"]
    assert [(r["excluded"], r["n"], r["backbones"]) for r in rows] == [
        (None, 24, ["a", "b"]),
        *((s, 16, ["a", "b"]) for s in SOURCES),
    ]
    gain = [sum(RIGHT[b, "rcta", t.qid] - RIGHT[b, "echo", t.qid] for b in BACKBONES) / 2 for t in TRAJS]
    for row in rows:
        kept = [s for s in SOURCES if s != row["excluded"]]
        by_source = [sum(g for g, t in zip(gain, TRAJS, strict=True) if t.source == s) / 8 for s in kept]
        assert row["delta"] == pytest.approx(sum(by_source) / len(kept))
        retained = [i for i, t in enumerate(TRAJS) if t.source in kept]
        expected = stratified_paired_bootstrap(
            [sum(RIGHT[b, "rcta", TRAJS[i].qid] for b in BACKBONES) / 2 for i in retained],
            [sum(RIGHT[b, "echo", TRAJS[i].qid] for b in BACKBONES) / 2 for i in retained],
            [TRAJS[i].source for i in retained],
            aggregate="macro",
            resamples=RESAMPLES,
        )
        assert (row["ci_low"], row["ci_high"]) == pytest.approx((expected.low, expected.high))


def test_each_cell_carries_the_interval_of_its_headlines(report: dict[str, Any]) -> None:
    z = NormalDist().inv_cdf(0.975)
    for cell in (r for r in report.metrics if r.realization == 0):
        row = cell.to_json()
        hits = [
            sum(RIGHT[row["backbone"], row["method"], t.qid] for t in TRAJS if t.source == s) for s in SOURCES
        ]
        # Three sources of 8: pooled and macro weigh each 1/3; Agresti-Coull's +2/+2 in each variance.
        half = z * math.sqrt(sum((h + 2) / 12 * (10 - h) / 12 / 12 for h in hits) / 9)
        p = sum(hits) / 24
        expected = [max(0.0, p - half), min(1.0, p + half)]
        for headline in (row, row["macro"]):
            assert headline["step_acc"] == pytest.approx(p)
            assert headline["intervals"]["agent_acc"] == pytest.approx(expected)
            assert headline["intervals"]["step_acc"] == pytest.approx(expected)
    # The page lays out the carried intervals; a dict without them gets the same from its per-source counts.
    stripped = replace(
        report, metrics=[replace(r, pooled_intervals=None, macro_intervals=None) for r in report.metrics]
    )
    assert render_html(stripped) == render_html(report)
    first = report.metrics[0]
    assert first.macro_intervals is not None
    moved_first = replace(first, macro_intervals={**first.macro_intervals, "step_acc": (0.0, 1.0)})
    moved = replace(report, metrics=[moved_first, *report.metrics[1:]])
    assert "[0.0, 100.0]" in render_html(moved)


def test_length_groups_carry_wilson_intervals_and_newcombe_contrasts(report: dict[str, Any]) -> None:
    groups = {(g["backbone"], g["method"], g["low"]): g for g in report.length_groups}
    assert sorted({low for _, _, low in groups}) == [30, 90]
    for (backbone, method, low), group in groups.items():
        hits = sum(RIGHT[backbone, method, t.qid] for t in TRAJS if t.n_steps == low)
        assert group["n"] == 12 and group["step_acc"] == pytest.approx(hits / 12)
        for metric in ("agent_acc", "step_acc", "step_pm5"):  # a right answer is right on all three
            assert group["intervals"][metric] == pytest.approx(
                list(proportion_confint(hits, 12, method="wilson"))
            )
    contrasts = report.length_contrasts
    assert len(contrasts) == 2 * 2 * 3
    for row in contrasts:
        assert (row["longest"], row["shortest"]) == ([90, 90], [30, 30])
        long_hits, short_hits = (
            sum(RIGHT[row["backbone"], row["method"], t.qid] for t in TRAJS if t.n_steps == n)
            for n in (90, 30)
        )
        low, high = confint_proportions_2indep(
            long_hits, 12, short_hits, 12, method="newcomb", compare="diff"
        )
        assert row["delta"] == pytest.approx((long_hits - short_hits) / 12)
        assert (row["ci_low"], row["ci_high"]) == pytest.approx((low, high))


def test_a_trajectory_without_a_task_is_a_task_of_its_own(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    untasked = [Traj(t.qid, t.source, n_steps=t.n_steps) for t in TRAJS]
    preds = [Pred(b, m, q, "Planner" if r else "Coder", 10 if r else 20) for (b, m, q), r in RIGHT.items()]
    build_run(db, "old", untasked, preds, methods=[{"name": "rcta"}, {"name": "echo"}])
    with open_store(db, read_only=True) as store:
        run = store.run_by_name("old")
        assert run is not None
        found = build_report(store, run.run_id, ReportOptions(resamples=RESAMPLES))
    clusters = found.task_clusters
    assert (clusters["tasks"], clusters["without_task"]) == (24, 24)
    for row in clusters["rows"]:
        paired = next(p for p in found.paired if p.backbone_a == row["backbone"] and p.metric == "step_acc")
        assert (row["ci_low"], row["ci_high"]) == (paired.ci_low, paired.ci_high)
    text = render_text(found, sections=("task-clusters",))
    assert (
        "24 trajectories have no stored task" in text
        and "the intervals are the paired comparisons' own" in text
    )


def test_the_text_html_and_json_show_them(
    db: Path, report: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    text = " ".join(render_text(report).split())
    assert "Task-cluster bootstrap (App. B)" in text and "24 trajectories in 12 tasks" in text
    assert (
        "Leave one source out (Table 13)" in text
        and "Trajectories kept: 24 with every source; 16 without s1, 16 without s2, 16 without s3" in text
    )
    assert "with Wilson 95% intervals" in text and "Longest group minus shortest" in text
    b_rcta = next(r for r in report.length_contrasts if (r["backbone"], r["method"]) == ("b", "rcta"))
    shown = f"{b_rcta['delta'] * 100:+.1f} [{b_rcta['ci_low'] * 100:.1f}, {b_rcta['ci_high'] * 100:.1f}]"
    assert f"b rcta 90–90 30–30 {shown} {shown} {shown}" in text  # right answers are right on all three
    page = render_html(report)
    for title in ("Task-cluster bootstrap (App. B)", "Leave one source out (Table 13)", "Newcombe"):
        assert title in page
    assert (
        main(["report", "--db", str(db), "--json", "--resamples", str(RESAMPLES), "--run", "intervals"]) == 0
    )
    shown = json.loads(capsys.readouterr().out)
    assert shown["task_clusters"] == report.task_clusters
    assert shown["leave_one_source_out"] == report.leave_one_source_out
