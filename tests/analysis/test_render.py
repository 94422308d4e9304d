"""The report renderers: Table 3 layout, markings, missing values, escaping and the embedded plots."""

from __future__ import annotations

import base64
import io
import re
from dataclasses import replace
from html.parser import HTMLParser
from typing import Any

import pytest

from rcarun.analysis.agreement import Agreement, Spread
from rcarun.analysis.cost import CostRow, ServedBy
from rcarun.analysis.render import PALETTE, method_styles, render_html, render_text
from rcarun.analysis.report import Report, RunInfo
from rcarun.analysis.report.model import (
    CellMetrics,
    CellOutcome,
    Message,
    PairedRow,
    ProtocolInfo,
    Repeatability,
    Scores,
)

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


def _metrics(agent: float | None, step: float | None, n: int) -> Scores:
    return Scores(
        n=n,
        agent_acc=agent,
        step_acc=step,
        step_pm5=None if step is None else min(1.0, step + 0.1),
        joint_exact=None if step is None else step / 2,
        joint_pm5=None if step is None else step / 1.5,
        root_mae=31.995,
        coverage=0.97,
    )


def _metrics_row(backbone: str, method: str, realization: int) -> CellMetrics:
    agent, step = MACRO[backbone, method]
    shift = 0.01 * realization
    agent = None if agent is None else agent + shift
    pooled = _metrics(None if agent is None else agent - 0.02, step, 80)
    per_source = {
        SOURCES[0]: _metrics(agent, None if step is None else step + 0.05, 40),
        SOURCES[1]: _metrics(agent, None if step is None else step - 0.05, 40),
    }
    return CellMetrics(
        backbone, method, realization, pooled, _metrics(agent, step, 80), per_source=per_source
    )


def _cost_row(backbone: str, method: str, stage: str, usd: float | None) -> CostRow:
    return CostRow(
        backbone=backbone,
        method=method,
        stage=stage,
        items=80,
        calls=80,
        attempts=83,
        length_retries=2,
        rate_limited=1,
        cached_calls=0,
        prompt_tokens=1_234_567,
        cached_tokens=200_000,
        completion_tokens=45_678,
        reasoning_tokens=0,
        cost_usd=None if usd is None else usd * 80,  # type: ignore[arg-type]  # a row without a USD figure
        usd_per_trajectory=usd,
        latency_p50_ms=812.0,
        latency_p95_ms=2301.0,
        budget_use=0.125,
    )


def make_report(*, simulated: bool = True) -> Report:
    metrics = [_metrics_row(b, m, r) for r in (0, 1) for b in BACKBONES for m in METHODS]
    paired = [
        PairedRow(
            "methods",
            backbone,
            "binary search",
            backbone,
            other,
            "step_acc",
            80,
            delta=0.14,
            ci_low=0.075,
            ci_high=0.205,
            wins=39,
            losses=11,
            p_mcnemar=0.000123456,
            p_holm=0.0601,
        )
        for backbone in BACKBONES
        for other in ("all-at-once", EVIL)
    ]
    paired_backbones = [
        PairedRow(
            "backbones",
            "mock-flash",
            "binary search",
            "mock-pro",
            "binary search",
            "root_mae",
            80,
            delta=-1.235,
            ci_low=-6.975,
            ci_high=9.235,
            p_holm=1.0,
        )
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
        Repeatability(
            b,
            m,
            (0, 1),
            {
                "agent_acc": Spread(n=2, mean=0.43, min=0.425, max=0.435, sd=0.00707),
                "root_mae": Spread(n=2, mean=31.995, min=31.995, max=31.995, sd=0.0),
            },
            [Agreement(first=0, second=1, n=80, agree=74, both_missing=1)],
            0.925,
        )
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
    return Report(
        run=RunInfo("mini-sweep", 7, "done", "2026-05-01T10:00:00Z"),
        db="/tmp/results.db",
        simulated=simulated,
        aggregate="macro",
        reference_method="binary search",
        metrics=metrics,
        paired=paired,
        paired_backbones=paired_backbones,
        complementarity=complementarity,
        repeatability=repeatability,
        cost=cost,
        length_groups=length_groups,
    )


@pytest.fixture(scope="module")
def report() -> Report:
    return make_report()


@pytest.fixture(scope="module")
def text(report: Report) -> str:
    return render_text(report)


@pytest.fixture(scope="module")
def page(report: Report) -> str:
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
    pooled = render_text(replace(report, aggregate="pooled"))
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
    real = replace(report, simulated=False)
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
    sparse = replace(report, paired=[], paired_backbones=[], cost=[], complementarity=[], length_groups=[])
    text = render_text(sparse)
    assert "No paired comparisons in this report." in text
    assert "No cost rows in this report" in text
    assert "Length groups" not in text
    page = render_html(sparse)
    assert page.count("data:image/png;base64,") == 2
    assert "Accuracy-versus-cost plot omitted: no USD per trajectory in this report." in page
    assert "No paired comparisons in this report." in page


def test_empty_report_renders_without_plots() -> None:
    empty = Report(run=RunInfo("blank", 1, "running", ""), simulated=False)
    assert "No accuracy metrics in this report." in render_text(empty)
    page = render_html(empty)
    assert "data:image/png" not in page
    assert "Accuracy plot omitted" in page and "Per-source heat map omitted" in page


def test_single_backbone_method_and_source_still_plot() -> None:
    row = _metrics_row("mock-flash", "all-at-once", 0)
    row = replace(row, per_source={"TravelPlanner": row.per_source["TravelPlanner"]})
    tiny = Report(
        run=RunInfo("tiny", 2, "done", ""),
        simulated=True,
        aggregate="macro",
        metrics=[row],
        cost=[_cost_row("mock-flash", "all-at-once", "answer", 0.0)],
    )
    page = render_html(tiny)
    assert len(_images(page)) == 3
    # A single value has nothing to beat: no marks.
    assert _table3_row(render_text(tiny), "all-at-once") == ["42.5", "7.5"]


# --- the page reads at a glance: summary, intervals, failures, palette, served replicas ------------------------

FAILED_MESSAGE = "HTTP 503: overloaded <b>"


def _outcome(backbone: str, method: str, realization: int, **counts: int) -> CellOutcome:
    expected = 80
    row = dict.fromkeys(("invalid", "fallback", "failed", "skipped_budget", "interrupted", "not_run"), 0)
    row |= counts
    unanswered = row["failed"] + row["skipped_budget"] + row["interrupted"] + row["not_run"]
    predictions = expected - unanswered
    readable = predictions - row["invalid"]
    status = "complete" if readable == expected else "partial" if readable >= expected / 2 else "failed"
    messages = {"failed": Message(FAILED_MESSAGE, row["failed"])} if row["failed"] else {}
    return CellOutcome(
        backbone=backbone,
        method=method,
        realization=realization,
        expected=expected,
        predictions=predictions,
        unanswered=unanswered,
        readable=readable,
        status=status,
        shown=status != "failed",
        messages=messages,
        **row,
    )


def make_failing_report() -> Report:
    """`make_report` with outcomes: on each backbone, the cell whose Step Acc is highest did not rest on answers.

    mock-pro · binary search failed (70 of 80 items, its number not shown); mock-flash · binary search has 30
    readable answers of 80, below the threshold, while its metrics row still says ``shown`` (the renderer checks
    coverage itself). Both would be bolded by their numbers (28.0 and 13.0).
    """
    report = make_report()
    outcomes = [
        _outcome(b, m, r, fallback=3 if m == "all-at-once" else 0)
        for r in (0, 1)
        for b in BACKBONES
        for m in METHODS
        if (b, m, r) not in {("mock-pro", "binary search", 0), ("mock-flash", "binary search", 0)}
    ]
    outcomes.append(_outcome("mock-pro", "binary search", 0, failed=70))
    low = _outcome("mock-flash", "binary search", 0, failed=20, skipped_budget=25, invalid=5)
    outcomes.append(replace(low, status="partial", shown=True, readable=30))
    metrics = []
    for row in report.metrics:
        if (row.backbone, row.method, row.realization) == ("mock-pro", "binary search", 0):
            metrics.append(replace(row, status="failed", shown=False))
        elif (row.backbone, row.method, row.realization) == ("mock-flash", "binary search", 0):
            metrics.append(replace(row, status="partial", shown=True))
        else:
            metrics.append(replace(row, status="complete", shown=True))
    protocol = ProtocolInfo(name="main", resamples=2000, confidence=0.95, min_readable_share=0.5)
    return replace(report, metrics=metrics, outcomes=outcomes, expected=80, unlabelled=3, protocol=protocol)


def _summary_facts(page: str) -> dict[str, str]:
    summary = page.split('<section id="summary">', 1)[1].split("</section>", 1)[0]
    return {
        label: re.sub(r"<details>.*?</details>", "", value, flags=re.S)
        for label, value in re.findall(r"<tr><th>([^<]*)</th><td>(.*?)</td></tr>", summary, flags=re.S)
    }


def _accuracy_html(page: str) -> str:
    return page.split('<section id="accuracy">', 1)[1].split("</section>", 1)[0]


def test_the_summary_comes_first_and_its_numbers_are_the_reports() -> None:
    report = make_failing_report()
    page = render_html(report)
    assert page.index('<section id="summary">') < page.index(
        "<section", page.index('<section id="summary">') + 1
    )
    assert page.index("<section") == page.index('<section id="summary">')
    facts = _summary_facts(page)
    outcomes = [r.to_json() for r in report.outcomes]
    total = {k: sum(r[k] for r in outcomes) for k in ("expected", "predictions", "failed", "skipped_budget")}
    assert total == {"expected": 960, "predictions": 845, "failed": 90, "skipped_budget": 25}
    assert facts["Items"] == (
        "960 expected over 12 cells (backbone × method × realization): 845 done, 90 failed, 25 skipped for "
        "budget, 0 interrupted, 0 not run"
    )
    assert facts["Failed, by cause"] == f"{html_escaped(FAILED_MESSAGE)} ×90"
    readable = sum(r["readable"] for r in outcomes)
    invalid = sum(r["invalid"] for r in outcomes)
    fallback = sum(r["fallback"] for r in outcomes)
    assert (readable, invalid, fallback) == (840, 5, 12)
    assert facts["Coverage"] == (
        f"{readable:,} of 960 expected answers readable ({readable / 960 * 100:.1f}%; 5 unreadable, 12 "
        "decided by a fallback); cells: 10 complete, 1 partial, not shown: 1 failed"
    )
    cost = report.cost
    usd = sum(r.cost_usd for r in cost if r.cost_usd is not None)
    prompt = sum(r.prompt_tokens for r in cost)
    assert facts["Spend"].startswith(f"{usd:.4f} USD API; tokens: {prompt:,} prompt (1,200,000 cached)")
    assert "GPU" not in page  # no self-hosted charge in this report
    assert facts["Backbones"] == "2: mock-flash, mock-pro"
    assert facts["Methods"] == f"3: all-at-once, binary search, {html_escaped(EVIL)}"
    assert facts["Trajectories"] == "80 labelled, each expected in every cell; 3 unlabelled, left out"
    assert facts["Simulated"].startswith("yes: ")


def test_a_failed_cell_is_shown_as_a_failure_and_never_bolded() -> None:
    report = make_failing_report()
    accuracy = _accuracy_html(render_html(report))
    rows = {
        cells[0]: cells[1:]
        for row in re.findall(r"<tr>(.*?)</tr>", accuracy, flags=re.S)
        for cells in [re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.S)]
        if cells
    }
    failed = (
        f'<span class="fail">— <span class="na">failed</span>: {html_escaped(FAILED_MESSAGE)} (10 of 80 answers '
        "readable)</span>"
    )
    low = (
        f'<span class="fail">— <span class="na">too few readable</span>: {html_escaped(FAILED_MESSAGE)} (30 of 80 '
        "answers readable)</span>"
    )
    assert rows["binary search"] == [low, low, failed, failed]
    # Their numbers (13.0 and 28.0) are the highest Step Acc on each backbone, yet nothing of theirs is bold;
    # mock-pro's Step goes to the best cell that rests on answers.
    bold = re.findall(r"<strong>([^<]*)</strong>", accuracy)
    assert "13.0" not in bold and "28.0" not in bold and "13.0" not in accuracy and "28.0" not in accuracy
    assert sorted(bold) == ["11.5", "50.0", "50.0", "60.5"]
    text_rows = {
        _cells(line)[0]: _cells(line)[1:]
        for line in _section(render_text(report), "Accuracy (Table 3 layout)")
    }
    assert text_rows["binary search"] == ["too few readable", "too few readable", "failed", "failed"]
    assert text_rows["all-at-once"] == ["42.5", "7.5", "50.0*", "11.5*"]


def _interval(estimates: list[tuple[int, float]], pooled: bool) -> tuple[float, float]:
    """The stratified normal interval the page documents, computed independently of it."""
    total = sum(n for n, _ in estimates)
    estimate = (
        sum(n * p for n, p in estimates) / total if pooled else sum(p for _, p in estimates) / len(estimates)
    )
    variance = 0.0
    for n, p in estimates:
        weight = n / total if pooled else 1 / len(estimates)
        adjusted = (p * n + 2) / (n + 4)
        variance += weight**2 * adjusted * (1 - adjusted) / (n + 4)
    half = 1.959963984540054 * variance**0.5
    return max(0.0, estimate - half), min(1.0, estimate + half)


def test_table3_gives_each_number_its_interval(report: dict[str, Any], page: str) -> None:
    accuracy = _accuracy_html(page)
    # mock-pro · binary search, Step Acc (macro 28.0): its two sources at 33.0% and 23.0% of 40 each.
    low, high = _interval([(40, 0.33), (40, 0.23)], pooled=False)
    assert f'<strong>28.0</strong> <span class="ci">[{low * 100:.1f}, {high * 100:.1f}]</span>' in accuracy
    assert (low * 100, high * 100) == pytest.approx((18.5, 37.5), abs=0.05)
    # Every number in the table has an interval; a dash has none.
    numbers = re.findall(r'<td class="num[^"]*">(\d+\.\d)(?:</strong>)? <span class="ci">\[', accuracy)
    bolded = re.findall(r'<td class="num[^"]*"><strong>(\d+\.\d)</strong> <span class="ci">\[', accuracy)
    assert (
        len(numbers) + len(bolded) == 11
    )  # 12 cells, one of them (mock-flash Step of the <script> method) a dash
    assert "Cells: the number (%) and its 95% interval" in accuracy
    pooled = render_html(replace(report, aggregate="pooled"))
    row = next(r for r in report.metrics if r.backbone == "mock-pro" and r.method == "binary search")
    low, high = _interval([(40, 0.33), (40, 0.23)], pooled=True)
    assert row.pooled.step_acc == 0.28
    assert (
        f'<strong>28.0</strong> <span class="ci">[{low * 100:.1f}, {high * 100:.1f}]</span>'
        in _accuracy_html(pooled)
    )


def _lab(color: str) -> tuple[float, float, float]:
    """sRGB hex -> CIELAB (D65), for the palette's distances."""
    rgb = [int(color[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb)
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116

    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def test_the_palette_separates_fourteen_methods_and_more() -> None:
    styles = method_styles(14)
    colours = [s.color for s in styles]
    assert len(set(colours)) == 14
    distances = [
        sum((p - q) ** 2 for p, q in zip(_lab(a), _lab(b), strict=True)) ** 0.5
        for i, a in enumerate(colours)
        for b in colours[i + 1 :]
    ]
    assert min(distances) > 25  # CIE76 ΔE: clearly different colours, as far apart as tab10's closest pair
    # Past the palette the colours repeat, each with a hatch, so that no two methods look the same.
    many = method_styles(40)
    assert len({(s.color, s.hatch) for s in many}) == 40
    assert all(s.hatch == "" for s in many[: len(PALETTE)])


def test_fourteen_methods_plot_with_readable_labels() -> None:
    methods = [f"method-{i:02d}-with-a-long-name" for i in range(14)]
    rows = []
    for b, backbone in enumerate(("alpha", "beta", "gamma", "delta")):
        for i, method in enumerate(methods):
            row = replace(_metrics_row("mock-flash", "all-at-once", 0), backbone=backbone, method=method)
            rows.append(replace(row, macro=_metrics(0.3 + 0.01 * i, 0.1 + 0.02 * b, 80)))
    wide = Report(run=RunInfo("wide", 0, "", ""), simulated=False, aggregate="macro", metrics=rows)
    page = render_html(wide)
    images = _images(page)
    assert len(images) == 2  # accuracy bars and the per-source heat map; no cost rows
    from PIL import Image

    with Image.open(io.BytesIO(images[0])) as bars:
        # sized by the bars, and never wider than the page shows at 1:1 (so labels keep their size)
        assert 1000 <= bars.width <= 1280
        colours = {c for _, c in bars.convert("RGB").getcolors(1 << 20) or []}
    assert {tuple(int(c[i : i + 2], 16) for i in (1, 3, 5)) for c in PALETTE[:14]} <= colours


def test_served_replicas_and_gpu_cost_when_present() -> None:
    report = make_failing_report()
    commands = (f"vllm serve Qwen/Qwen3-8B --port 8001 {EVIL}", "vllm serve Qwen/Qwen3-8B --port 8002")
    served_by = [ServedBy("mock-pro", "0.8.5", 2, 4, commands, 1, 0, 0.75, 2.0, 1.5, 0, None, ())]
    cost = [replace(row, gpu_usd=0.75 if row.backbone == "mock-pro" else 0.0) for row in report.cost]
    report = replace(report, served_by=served_by, cost=cost)
    page = render_html(report)
    facts = _summary_facts(page)
    assert facts["Served by"] == "mock-pro: served by vLLM 0.8.5, 2 replicas on 4 GPUs, GPU time 1.5000 USD"
    usd = sum(r.cost_usd for r in report.cost if r.cost_usd is not None)
    assert facts["Spend"].startswith(f"{usd:.4f} USD API + 1.5000 USD GPU time = {usd + 1.5:.4f} USD;")
    assert f"--port 8001 {html_escaped(EVIL)}</pre>" in page
    cost = page.split('<section id="cost">', 1)[1].split("</section>", 1)[0]
    assert '<th class="num start">API USD</th><th class="num">GPU USD</th>' in cost
    # mock-pro · all-at-once: API 20.0000, GPU 0.7500, per trajectory 0.25 + 0.75 / 80 items.
    row = re.search(r"<td>all-at-once</td>(.*?)</tr>", cost, flags=re.S)
    assert row is not None
    assert re.findall(r">([\d.]+)</td>", row.group(1))[3:] == ["20.0000", "0.7500", f"{0.25 + 0.75 / 80:.4f}"]
    assert "GPU USD: the self-hosted replicas&#x27; GPU time" in cost


def test_the_page_is_balanced_html_with_every_section_in_its_contents() -> None:
    page = render_html(make_failing_report())
    checker = _Balance()
    checker.feed(page)
    assert checker.stack == [] and checker.errors == []
    ids = re.findall(r'<section id="([^"]+)">', page)
    toc = page.split('<nav id="toc"', 1)[1].split("</nav>", 1)[0]
    assert re.findall(r'href="#([^"]+)"', toc) == ids
    assert ids[:5] == ["summary", "accuracy", "paired", "repeatability", "cost"]
    for folded in ("outcomes", "full-metrics", "per-source", "complementarity", "length-groups", "protocol"):
        assert f'<section id="{folded}"><details class="tail">' in page, folded


class _Balance(HTMLParser):
    """Every element the page opens is closed, in order (void elements aside)."""

    VOID = frozenset({"meta", "img", "br", "hr", "input", "link"})

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()
