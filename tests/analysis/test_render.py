"""The report renderers: Table 3 layout, markings, missing values, escaping and the embedded plots."""

from __future__ import annotations

import base64
import copy
import re
from typing import Any

import pytest

from rcarun.analysis.render import render_html, render_text

EVIL = "<script>alert(1)</script>"
BACKBONES = ("mock-flash", "mock-pro")
METHODS = ("all-at-once", "binary search", EVIL)
SOURCES = ("TravelPlanner", "VitaBench")

# (backbone, method) -> (agent, step) macro accuracies of realization 0.
MACRO = {
    ("mock-flash", "all-at-once"): (0.425, 0.075),
    ("mock-flash", "binary search"): (0.405, 0.130),
    ("mock-flash", EVIL): (0.605, None),
    ("mock-pro", "all-at-once"): (0.500, 0.115),
    ("mock-pro", "binary search"): (0.455, 0.280),
    ("mock-pro", EVIL): (0.500, 0.105),
}


def _metrics(agent: float | None, step: float | None, n: int) -> dict[str, Any]:
    return {
        "n": n,
        "agent_acc": agent,
        "step_acc": step,
        "step_pm5": None if step is None else min(1.0, step + 0.1),
        "joint_exact": None if step is None else step / 2,
        "joint_pm5": None if step is None else step / 1.5,
        "root_mae": 31.995,
        "coverage": 0.97,
    }


def _metrics_row(backbone: str, method: str, realization: int) -> dict[str, Any]:
    agent, step = MACRO[backbone, method]
    shift = 0.01 * realization
    agent = None if agent is None else agent + shift
    pooled = _metrics(None if agent is None else agent - 0.02, step, 80)
    per_source = {
        SOURCES[0]: _metrics(agent, None if step is None else step + 0.05, 40),
        SOURCES[1]: _metrics(agent, None if step is None else step - 0.05, 40),
    }
    return {
        "backbone": backbone,
        "method": method,
        "realization": realization,
        **pooled,
        "macro": _metrics(agent, step, 80),
        "per_source": per_source,
    }


def _cost_row(backbone: str, method: str, stage: str, usd: float | None) -> dict[str, Any]:
    return {
        "backbone": backbone,
        "method": method,
        "stage": stage,
        "items": 80,
        "calls": 80,
        "attempts": 83,
        "length_retries": 2,
        "rate_limited": 1,
        "prompt_tokens": 1_234_567,
        "cached_tokens": 200_000,
        "completion_tokens": 45_678,
        "reasoning_tokens": 0,
        "cost_usd": None if usd is None else usd * 80,
        "usd_per_trajectory": usd,
        "latency_p50_ms": 812.0,
        "latency_p95_ms": 2301.0,
        "budget_use": 0.125,
    }


def make_report(*, simulated: bool = True) -> dict[str, Any]:
    metrics = [_metrics_row(b, m, r) for r in (0, 1) for b in BACKBONES for m in METHODS]
    paired = [
        {
            "backbone": backbone,
            "method_a": "binary search",
            "method_b": other,
            "metric": "step_acc",
            "delta": 0.14,
            "ci_low": 0.075,
            "ci_high": 0.205,
            "wins": 39,
            "losses": 11,
            "p_mcnemar": 0.000123456,
            "p_holm": 0.0601,
            "n": 80,
        }
        for backbone in BACKBONES
        for other in ("all-at-once", EVIL)
    ]
    paired_backbones = [
        {
            "method": "binary search",
            "backbone_a": "mock-flash",
            "backbone_b": "mock-pro",
            "metric": "root_mae",
            "delta": -1.235,
            "ci_low": -6.975,
            "ci_high": 9.235,
            "wins": None,
            "losses": None,
            "p_mcnemar": None,
            "p_holm": 1.0,
            "n": 80,
        }
    ]
    complementarity = [
        {
            "backbone": "mock-pro",
            "method_a": "binary search",
            "method_b": "all-at-once",
            "metric": "step_acc",
            "a_only": 12,
            "b_only": 3,
            "both": 6,
            "neither": 59,
        }
    ]
    repeatability = [
        {
            "backbone": b,
            "method": m,
            "realizations": [0, 1],
            "metrics": {
                "agent_acc": {"n": 2, "mean": 0.43, "sd": 0.00707, "min": 0.425, "max": 0.435, "range": 0.01},
                "root_mae": {"n": 2, "mean": 31.995, "sd": 0.0, "min": 31.995, "max": 31.995, "range": 0.0},
            },
            "agreement": [{"first": 0, "second": 1, "n": 80, "agree": 74, "both_missing": 1, "rate": 0.925}],
            "mean_agreement": 0.925,
        }
        for b in BACKBONES
        for m in METHODS
    ]
    cost = [
        _cost_row("mock-flash", "all-at-once", "answer", 0.0012),
        _cost_row("mock-flash", "binary search", "probe", 0.0008),
        _cost_row("mock-flash", "binary search", "answer", 0.0004),
        _cost_row("mock-flash", EVIL, "answer", None),
        _cost_row("mock-pro", "all-at-once", "answer", 0.25),
        _cost_row("mock-pro", "binary search", "answer", 0.0),
    ]
    length_groups = [
        {"backbone": "mock-pro", "method": "binary search", "low": 10, "high": 60, "n": 40}
        | {"step_acc": 0.3, "step_pm5": 0.45, "agent_acc": 0.5},
        {"backbone": "mock-pro", "method": "binary search", "low": 61, "high": 400, "n": 40}
        | {"step_acc": 0.26, "step_pm5": 0.4, "agent_acc": None},
    ]
    return {
        "run": {"name": "mini-sweep", "run_id": 7, "status": "done", "created_at": "2026-05-01T10:00:00Z"},
        "db": "/tmp/results.db",
        "simulated": simulated,
        "aggregate": "macro",
        "reference_method": "binary search",
        "metrics": metrics,
        "paired": paired,
        "paired_backbones": paired_backbones,
        "complementarity": complementarity,
        "repeatability": repeatability,
        "cost": cost,
        "length_groups": length_groups,
    }


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return make_report()


@pytest.fixture(scope="module")
def text(report: dict[str, Any]) -> str:
    return render_text(report)


@pytest.fixture(scope="module")
def page(report: dict[str, Any]) -> str:
    return render_html(report)


def _section(text: str, title: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(title)
    titles = (i for i in range(start + 2, len(lines) - 1) if lines[i] and lines[i + 1] == "-" * len(lines[i]))
    return lines[start : next(titles, len(lines))]


def _cells(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def _table3_row(text: str, method: str) -> list[str]:
    rows = [line for line in _section(text, "Accuracy (Table 3 layout)") if line.startswith(method + " ")]
    assert len(rows) == 1, rows
    return _cells(rows[0][len(method) :])


def test_table3_puts_each_backbone_in_its_columns(text: str) -> None:
    lines = _section(text, "Accuracy (Table 3 layout)")
    group_line = next(line for line in lines if "mock-flash" in line)
    header = next(line for line in lines if line.startswith("Method"))
    rule = lines[lines.index(header) + 1]
    row = next(line for line in lines if line.startswith("all-at-once "))
    # Columns are the dash runs of the rule; every header, group label and number sits inside its column.
    spans = [m.span() for m in re.finditer(r"-+", rule)]
    assert [header[a:b].strip() for a, b in spans] == ["Method", "Agent", "Step", "Agent", "Step"]
    assert [row[a:b].strip() for a, b in spans] == ["all-at-once", "42.5", "7.5", "50.0*", "11.5"]
    assert group_line[spans[1][0] : spans[2][1]].strip() == "mock-flash"
    assert group_line[spans[3][0] : spans[4][1]].strip() == "mock-pro"
    assert _table3_row(text, "binary search") == ["40.5", "13.0*", "45.5", "28.0*"]


def test_table3_uses_the_pooled_numbers_when_asked(report: dict[str, Any]) -> None:
    pooled = render_text(copy.deepcopy(report) | {"aggregate": "pooled"})
    assert _table3_row(pooled, "all-at-once") == ["40.5", "7.5", "48.0*", "11.5"]
    assert "pooled: every trajectory weighs the same" in pooled
    assert "Macro-2" in render_text(report)


def test_highest_point_estimate_is_marked_ties_included(text: str) -> None:
    # mock-pro Agent: all-at-once and the <script> method tie at 50.0; both are marked.
    evil = _table3_row(text, EVIL)
    assert evil == ["60.5*", "–", "50.0*", "10.5"]
    assert "Marked (* in text, bold in HTML)" in text


def test_missing_numbers_render_as_dash(text: str) -> None:
    full = _section(text, "Full metrics")
    evil = next(line for line in full if line.startswith("mock-flash") and EVIL in line)
    values = _cells(evil.split(EVIL, 1)[1])
    assert values == ["80", "60.5", "–", "–", "–", "–", "32.0", "97.0"]
    cost = _section(text, "Cost")
    money = next(line for line in cost if EVIL in line and "%" in line)
    assert _cells(money.split(EVIL, 1)[1])[1:4] == ["–", "–", "812"]


def test_simulated_banner_only_when_simulated(text: str, page: str, report: dict[str, Any]) -> None:
    assert "SIMULATED BACKBONES" in text.split("Accuracy (Table 3 layout)")[0]
    assert "not any model's accuracy" in text
    assert page.index("SIMULATED BACKBONES") < page.index('id="accuracy"')
    real = copy.deepcopy(report) | {"simulated": False}
    assert "SIMULATED" not in render_text(real)
    assert "SIMULATED" not in render_html(real)


def test_paired_table_formats_points_and_pvalues(text: str) -> None:
    paired = _section(text, "Paired comparisons")
    row = next(line for line in paired if line.startswith("mock-pro") and "all-at-once" in line)
    assert _cells(row) == [
        "mock-pro",
        "binary search vs all-at-once",
        "Step Acc",
        "+14.0",
        "[7.5, 20.5]",
        "39/11",
        "0.000123",
        "0.0601",
        "80",
    ]
    assert "against binary search" in "\n".join(paired)
    # Across backbones: the MAE stays in steps and a missing W/L or p is a dash; 1.0 keeps 3 digits.
    row = next(line for line in paired if line.startswith("binary search  mock-flash vs mock-pro"))
    assert _cells(row)[2:] == ["Root MAE", "-1.2", "[-7.0, 9.2]", "–", "–", "1.00", "80"]
    assert any("in steps, not percentage points" in line for line in paired)


def test_complementarity_counts(text: str) -> None:
    row = next(line for line in _section(text, "Complementarity") if line.startswith("mock-pro"))
    assert _cells(row) == ["mock-pro", "binary search vs all-at-once", "Step Acc", "12", "3", "6", "59"]


def test_cost_uses_thousands_separators_and_totals(text: str) -> None:
    cost = _section(text, "Cost")
    assert any("1,234,567" in line for line in cost)
    flash_total = [line for line in cost if line.startswith("mock-flash") and " total " in line]
    assert len(flash_total) == 2  # calls/tokens table and money table
    assert "4,938,268" in flash_total[0]  # four stage rows of 1,234,567 prompt tokens
    # USD per trajectory adds over stages and methods: 0.0012 + 0.0008 + 0.0004; USD sums likewise.
    assert _cells(flash_total[1])[2:4] == ["0.1920", "0.0024"]


def test_repeatability_and_length_groups(text: str) -> None:
    rep = "\n".join(_section(text, "Repeatability"))
    assert "43.0 ± 0.7" in rep and "42.5–43.5" in rep and "32.0 ± 0.0" in rep
    assert "0 vs 1: 92.5" in rep
    groups = _section(text, "Length groups")
    row = next(line for line in groups if "61–400" in line)
    assert _cells(row)[-3:] == ["26.0", "40.0", "–"]


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


def test_html_embeds_three_png_plots(page: str) -> None:
    assert page.count("data:image/png;base64,") == 3
    images = _images(page)
    assert len(images) == 3
    assert all(img.startswith(b"\x89PNG\r\n\x1a\n") for img in images)
    assert "<table>" in page and "<strong>50.0</strong>" in page


def test_html_escapes_names_and_has_no_urls(page: str) -> None:
    assert "<script" not in page.lower()
    assert html_escaped(EVIL) in page
    assert "http://" not in page and "https://" not in page


def html_escaped(value: str) -> str:
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def test_empty_sections_say_so_and_drop_plots(report: dict[str, Any]) -> None:
    sparse = copy.deepcopy(report) | {"paired": [], "paired_backbones": [], "cost": []}
    sparse |= {"complementarity": [], "length_groups": []}
    text = render_text(sparse)
    assert "No paired comparisons in this report." in text
    assert "No cost rows in this report" in text
    assert "Length groups" not in text
    page = render_html(sparse)
    assert page.count("data:image/png;base64,") == 2
    assert "Accuracy-versus-cost plot omitted: no USD per trajectory in this report." in page
    assert "No paired comparisons in this report." in page


def test_empty_report_renders_without_plots() -> None:
    empty = {"run": {"name": "blank", "run_id": 1, "status": "running", "created_at": ""}, "simulated": False}
    assert "No accuracy metrics in this report." in render_text(empty)
    page = render_html(empty)
    assert "data:image/png" not in page
    assert "Accuracy plot omitted" in page and "Per-source heat map omitted" in page


def test_single_backbone_method_and_source_still_plot() -> None:
    row = _metrics_row("mock-flash", "all-at-once", 0)
    row["per_source"] = {"TravelPlanner": row["per_source"]["TravelPlanner"]}
    tiny = {
        "run": {"name": "tiny", "run_id": 2, "status": "done", "created_at": ""},
        "simulated": True,
        "aggregate": "macro",
        "metrics": [row],
        "cost": [_cost_row("mock-flash", "all-at-once", "answer", 0.0)],
    }
    page = render_html(tiny)
    assert len(_images(page)) == 3
    # A single value has nothing to beat: no marks.
    assert _table3_row(render_text(tiny), "all-at-once") == ["42.5", "7.5"]
