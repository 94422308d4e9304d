"""The report's JSON, text and HTML pinned byte for byte: a hand-built run, a real sweep and the renderer's fixture.

The snapshots in ``snapshots/`` were written by main's dict-returning `build_report`, before the report became
typed, so the typed report must reproduce them exactly (key order included). ``RCARUN_WRITE_SNAPSHOTS=1``
rewrites them; do that only for a deliberate change of output.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from analysis.builders import Pred, Traj, build_run
from analysis.test_render import make_report
from rcarun.analysis import ReportOptions, build_report, render_html, render_text

SNAPSHOTS = Path(__file__).parent / "snapshots"
_PNG = re.compile(r"data:image/png;base64,([A-Za-z0-9+/=]+)")  # a plot is pinned by its digest
WRITE = os.environ.get("RCARUN_WRITE_SNAPSHOTS") == "1"


def _check(name: str, found: str) -> None:
    found = re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+Z", "<t>", re.sub(r"\S*results\.db", "<db>", found))
    found = _PNG.sub(
        lambda m: "data:image/png;sha256," + hashlib.sha256(m[1].encode()).hexdigest()[:16], found
    )
    path = SNAPSHOTS / name
    if WRITE:
        path.write_text(found, encoding="utf-8")
    assert found == path.read_text(encoding="utf-8")


def _hand_built(db: Path) -> int:
    trajs = [
        Traj(
            f"q{i}",
            ("TravelPlanner", "VitaBench")[i % 2],
            ref_role=("Planner", "Coder")[i % 3 == 0],
            ref_step=i,
        )
        for i in range(12)
    ]
    preds = [
        Pred(backbone, method, t.qid, role, step, realization=r)
        for backbone in ("mock-flash", "mock-pro")
        for r in (0, 1)
        for method, shift in (("rcta", 0), ("all-at-once", 2), ("step-by-step", 5))
        for i, t in enumerate(trajs)
        for role, step in [
            (t.ref_role if (i + shift + r) % 3 else "Verifier", t.ref_step + (i + shift) % 4 - 1)
        ]
    ]
    return build_run(db, "hand", trajs, preds)


def _volatile(report: dict[str, Any]) -> dict[str, Any]:
    """A sweep's report less what differs between two sweeps of the same seeds: paths, clocks, latencies."""
    return _masked(dict(report, db="<db>", run=dict(report["run"], created_at="<t>"), call_timing="<timing>"))


def _masked(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: "<clock>" if re.search(r"latency|_ms$|_s$|seconds", k) else _masked(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return value


def _shape(value: Any) -> Any:
    """The JSON's keys, order and kinds, with every number as ``<number>``."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return "<number>" if isinstance(value, int | float) and not isinstance(value, bool) else value


def test_hand_built_run_report(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    run_id = _hand_built(db)
    from rcarun.store import open_store

    store = open_store(db)
    try:
        report = build_report(store, run_id, ReportOptions(resamples=200, length_groups=2))
    finally:
        store.close()
    found = report.to_json()
    _check("hand.json", json.dumps(_volatile(found), indent=2))
    text = render_text(report)
    _check("hand.txt", text)
    _check("hand.html", render_html(report))


def test_sweep_report(methods_db: Path) -> None:
    from rcarun.store import open_store

    store = open_store(methods_db)
    try:
        report = build_report(store, 1, ReportOptions(resamples=200))
    finally:
        store.close()
    # The simulator's answers vary with the order of concurrent calls, so only the shape is pinned here.
    _check("sweep.json", json.dumps(_shape(_volatile(report.to_json())), indent=2))


def test_renderer_fixture() -> None:
    report = make_report()
    _check("fixture.txt", render_text(report))
    _check("fixture.html", render_html(report))


@pytest.mark.parametrize("simulated", [False])
def test_renderer_fixture_real(simulated: bool) -> None:
    report = make_report(simulated=simulated)
    _check("fixture-real.txt", render_text(report))
