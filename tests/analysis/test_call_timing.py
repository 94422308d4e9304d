"""How answers came, per backbone (issue 34): `call_timing`, the report's ``call_timing`` and its "Call timing"
section, and `rcarun cost`'s second table, on a hand-built run whose every figure is known in advance."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from analysis.builders import Pred, Traj, build_run
from rcarun.analysis import CallTiming, ReportOptions, build_report, call_timing, cost_rows, render_text
from rcarun.analysis.render import render_html
from rcarun.cli import main
from rcarun.store import CallRow, StoreWriter, open_store


def _call(backbone: str, qid: str, **more: Any) -> CallRow:
    row = CallRow(
        run_id=1,
        item_id=f"{backbone}|all-at-once|{qid}|r0",
        backbone=backbone,
        model="m",
        method="all-at-once",
        qid=qid,
        realization=0,
        stage="attribution",
        attempt=1,
        max_tokens=4096,
        status="ok",
        started_at="2025-01-01T00:00:00.000Z",
        prompt_tokens=1000,
        completion_tokens=200,
        cost_usd=0.001,
        latency_ms=2000.0,
    )
    return replace(row, **more)


def _calls() -> list[CallRow]:
    streamed = [
        _call("alpha", f"q{index}", streamed=True, ttft_ms=ttft, decode_tokens_per_s=rate)
        for index, (ttft, rate) in enumerate(
            [(800, 40.0), (200, 10.0), (5000, 50.0), (400, 20.0), (600, 30.0)]
        )
    ]
    return [
        *streamed,
        # Cut generations: charged an estimate, their partial answers streamed.
        _call(
            "alpha",
            "q5",
            status="error",
            error_kind="stalled",
            usage_source="estimated",
            cost_usd=0.02,
            completion_tokens=300,
            streamed=True,
            ttft_ms=700.0,
            decode_tokens_per_s=15.0,
        ),
        _call(
            "alpha",
            "q6",
            status="cancelled",
            usage_source="estimated",
            cost_usd=0.005,
            completion_tokens=50,
            streamed=True,
            ttft_ms=300.0,
        ),
        # Errors that are no cut generation: the provider's 500 (nothing charged), an estimate of nothing.
        _call("alpha", "q7", status="error", http_status=500, cost_usd=0.0, completion_tokens=0),
        _call(
            "alpha",
            "q8",
            status="error",
            usage_source="estimated",
            cost_usd=0.0,
            completion_tokens=0,
            streamed=True,
        ),
        # A cache hit is never timed, whatever it holds.
        _call("alpha", "q0", status="cached", ttft_ms=1.0, decode_tokens_per_s=9999.0),
        # Answers that came as one body: nothing known of their first token.
        *(_call("beta", f"q{index}", streamed=False) for index in range(3)),
        # A backbone whose rows never said how their answers came (written before migration 5).
        *(_call("gamma", f"q{index}") for index in range(2)),
    ]


@pytest.fixture(scope="module")
def timed_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("timing") / "results.db"
    trajs = [Traj(f"q{index}", "who-when") for index in range(9)]
    preds = [Pred(backbone, "all-at-once", "q0", "Planner", 10) for backbone in ("alpha", "beta", "gamma")]
    run_id = build_run(db, "timed", trajs, preds)
    assert run_id == 1

    async def write() -> None:
        async with StoreWriter(db) as writer:
            for call in _calls():
                writer.add_call(call)

    asyncio.run(write())
    return db


# alpha's TTFTs (s): 0.2 0.3 0.4 0.6 0.7 0.8 5.0 -> p50 the 4th of 7, p95 the 7th; decode rates (tokens/s): 10 15
# 20 30 40 50 -> p50 the 3rd of 6, p95 the 6th.
EXPECTED = [
    CallTiming("alpha", 9, 8, 0.6, 5.0, 20.0, 50.0, 2, 0.025),
    CallTiming("beta", 3, 0, None, None, None, None, 0, 0.0),
    CallTiming("gamma", 2, None, None, None, None, None, 0, 0.0),
]


def test_call_timing_per_backbone_over_the_attempts_sent(timed_db: Path) -> None:
    with open_store(timed_db, read_only=True) as store:
        timing = call_timing(store, 1)
        rows = cost_rows(store, 1)
    assert [replace(entry, cut_usd=round(entry.cut_usd, 10)) for entry in timing] == EXPECTED
    # The cut generations' estimates are in the cost rows' USD too: 5 × 0.001 + 0.02 + 0.005 (+ 0 for the
    # errors that were no cut) on alpha.
    (alpha,) = [row for row in rows if row.backbone == "alpha"]
    assert alpha.cost_usd == pytest.approx(0.03) and alpha.estimated_calls == 3


def test_the_report_has_call_timing_and_renders_it(timed_db: Path) -> None:
    with open_store(timed_db, read_only=True) as store:
        report = build_report(store, 1, ReportOptions(resamples=50))
    assert [
        {**entry, "cut_usd": round(entry["cut_usd"], 10)}
        for entry in json.loads(json.dumps(report.to_json()))["call_timing"]
    ] == [entry.to_json() for entry in EXPECTED]
    assert report.call_timing[0].to_json() == {
        "backbone": "alpha",
        "attempts": 9,
        "streamed_calls": 8,
        "ttft_p50_s": 0.6,
        "ttft_p95_s": 5.0,
        "decode_p50_tokens_per_s": 20.0,
        "decode_p95_tokens_per_s": 50.0,
        "cut_calls": 2,
        "cut_usd": pytest.approx(0.025),
    }

    text = render_text(report, sections={"call-timing"})
    lines = text.splitlines()
    start = lines.index("Call timing")
    assert lines[start + 2 : start + 9] == [
        "How the answers came, over attempts sent (cache hits left out).",
        "Backbone  Attempts  Streamed  TTFT p50 s  TTFT p95 s  Decode p50 tok/s  Decode p95 tok/s  Cut  Cut USD",
        "--------  --------  --------  ----------  ----------  ----------------  ----------------  ---  -------",
        "alpha            9         8        0.60        5.00              20.0              50.0    2   0.0250",
        "beta             3         0           –           –                 –                 –    0   0.0000",
        "gamma            2         –           –           –                 –                 –    0   0.0000",
        "",
    ]
    page = render_html(report)
    assert '<section id="call-timing">' in page and '<td class="num">5.00</td>' in page


def test_a_report_without_call_timing_renders_without_the_section(timed_db: Path) -> None:
    with open_store(timed_db, read_only=True) as store:
        report = build_report(store, 1, ReportOptions(resamples=50))
    older = replace(report, call_timing=())
    assert "Call timing" not in render_text(older)
    assert 'id="call-timing"' not in render_html(older)


def test_rcarun_cost_prints_the_timing_table_below_the_cost_table(
    timed_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cost", "--db", str(timed_db), "--run", "timed"]) == 0
    out = capsys.readouterr().out.splitlines()
    header = out[1]
    start = out.index("")
    assert out[start + 1 :] == [
        "call timing (attempts sent): streamed answers, time to first token, decode rate; cut generations "
        "(charged an estimate)",
        "backbone         attempts streamed TTFT p50 s TTFT p95 s tok/s p50 tok/s p95   cut    cut USD",
        "-" * 93,
        "alpha                   9        8       0.60       5.00      20.0      50.0     2     0.0250",
        "beta                    3        0          –          –         –         –     0     0.0000",
        "gamma                   2        –          –          –         –         –     0     0.0000",
    ]
    # The cost table itself is unchanged: no timing columns in it.
    assert "TTFT" not in header and header.startswith("backbone         method")

    assert main(["cost", "--db", str(timed_db), "--run", "timed", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [entry["backbone"] for entry in document["call_timing"]] == ["alpha", "beta", "gamma"]
    assert document["call_timing"][2]["streamed_calls"] is None
    assert document["call_timing"][0]["ttft_p95_s"] == 5.0 and document["call_timing"][0]["cut_calls"] == 2
