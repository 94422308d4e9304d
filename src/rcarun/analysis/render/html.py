"""The report as one self-contained HTML page: inline CSS, the summary, tables and embedded plots."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..cost import CostRow
from ..report.model import PairedRow, Report
from ..scoring import metric_label
from .cost import _sum
from .model import (
    _PARTIAL,
    _SIMULATED,
    DASH,
    _Cell,
    _confidence,
    _finite,
    _has_gpu,
    _min_share,
    _pct,
    _row,
    _Section,
    _Table,
    _unique,
    _usd,
    _usd_per_trajectory,
)
from .paired import _paired_cells
from .plots import _PLOTS, _Plot
from .sections import _header_lines, _sections
from .summary import _summary

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1320px;
       padding: 0 16px; color: #1a1a1a; line-height: 1.4; }
h1 { font-size: 1.5em; margin-bottom: 4px; }
h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; padding-bottom: 2px; margin-top: 28px; }
.meta { color: #555; margin: 0; }
.banner { border: 2px solid #b00020; background: #fdecee; color: #6b0012; padding: 8px 14px; margin: 12px 0;
          font-weight: 600; }
nav { font-size: 0.9em; margin: 12px 0; padding: 6px 10px; background: #f6f8fa; border: 1px solid #e1e4e8; }
nav ol { display: inline; padding: 0; margin: 0; }
nav li { display: inline-block; margin-right: 12px; white-space: nowrap; }
nav a { color: #0b4f8a; }
nav .more { color: #555; margin-right: 8px; }
table { border-collapse: collapse; margin: 0 0 12px; font-size: 0.88em; }
.scroll { overflow-x: auto; }
.caption { font-weight: 600; margin: 10px 0 4px; color: #333; font-size: 0.92em; }
th, td { padding: 3px 9px; border-bottom: 1px solid #e4e4e4; white-space: nowrap; }
th { background: #f3f5f7; text-align: left; }
th.group { text-align: center; border-left: 1px solid #d8d8d8; }
th.num, td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.start, th.start { border-left: 1px solid #d8d8d8; }
tr.total td { font-weight: 600; background: #fafafa; border-top: 1px solid #bbb; }
table.kv th { background: none; width: 10em; vertical-align: top; }
table.kv td { white-space: normal; max-width: 70em; }
.note { color: #444; font-size: 0.9em; max-width: 60em; }
.legend { color: #333; font-size: 0.88em; max-width: 70em; margin: 4px 0 8px; }
figure { margin: 10px 0 16px; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.88em; color: #444; max-width: 70em; }
.na { color: #8a1c1c; font-style: italic; }
.fail { color: #8a1c1c; white-space: normal; }
.ci { display: block; color: #666; font-size: 0.8em; line-height: 1.1; }
details > summary { cursor: pointer; }
details.notes > summary, details.rows > summary { color: #0b4f8a; font-size: 0.9em; margin: 4px 0; }
details.tail { border-bottom: 1px solid #ddd; }
details.tail > summary h2 { display: inline-block; border: none; margin: 14px 0 0; }
details.tail .hint { color: #666; font-size: 0.88em; margin-left: 8px; }
pre.command { font-size: 0.85em; background: #f6f8fa; padding: 6px; white-space: pre-wrap; }
"""


def _html_table(table: _Table) -> str:
    starts = set()  # first column of each group: a rule on its left, as in the paper's grouped columns
    position = table.label_columns
    for label, span in table.groups:
        if label:
            starts.add(position)
        position += span

    def classes(i: int) -> str:
        names = (["num"] if i >= table.label_columns else []) + (["start"] if i in starts else [])
        return f' class="{" ".join(names)}"' if names else ""

    # The caption is a paragraph, not <caption>, so that a long caption does not wrap to a narrow table's width.
    out = [f'<p class="caption">{html.escape(table.caption)}</p>'] if table.caption else []
    out.append('<div class="scroll"><table><thead>')
    if table.groups:
        group_cells = [f'<th colspan="{table.label_columns}"></th>']
        for label, span in table.groups:
            kind = ' class="group"' if label else ""
            group_cells.append(f'<th colspan="{span}"{kind}>{html.escape(label)}</th>')
        out.append(f"<tr>{''.join(group_cells)}</tr>")
    out.append(
        "<tr>"
        + "".join(f"<th{classes(i)}>{html.escape(c)}</th>" for i, c in enumerate(table.columns))
        + "</tr>"
    )
    out.append("</thead><tbody>")
    for row in table.rows:
        cells = []
        for i, cell in enumerate(row.cells):
            cells.append(f"<td{classes(i)}>{_html_cell(cell)}</td>")
        opening = '<tr class="total">' if row.total else "<tr>"
        out.append(f"{opening}{''.join(cells)}</tr>")
    out.append("</tbody></table></div>")
    return "\n".join(out)


def _html_cell(cell: _Cell) -> str:
    """A cell's text; a best number in bold, its interval beside it; a failure as one, with its reason."""
    text = html.escape(cell.text)
    if cell.muted:
        text = f'<span class="na">{text}</span>'
        if cell.reason:
            return f'<span class="fail">— {text}: {html.escape(cell.reason)}</span>'
        return text
    if cell.best:
        text = f"<strong>{text}</strong>"
    if cell.interval:
        text += f' <span class="ci">{html.escape(cell.interval)}</span>'
    return text


def _html_plot(plot: _Plot | str) -> str:
    if isinstance(plot, str):
        return f'<p class="note">{html.escape(plot)}</p>'
    data = base64.b64encode(plot.png).decode("ascii")
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(plot.alt)}">'
        f"<figcaption>{html.escape(plot.caption)}</figcaption></figure>"
    )


# The page's order: what a reader looks at first, then the long tail, each part folded (<details>). Sections
# not named here (none today) would join the tail, so that nothing the text report has is ever dropped.
_HEADLINE = ("accuracy", "paired", "components", "repeatability", "cost", "fidelity", "calibration")
_TAIL = (
    *("label-sensitivity", "outcomes", "full-metrics", "per-source", "task-clusters", "leave-one-source-out"),
    *("complementarity", "recall", "turns"),
    "length-groups",
    "call-timing",
)

_LEGEND = (
    "Cells: the number (%) and its {level} interval in brackets; bold: the highest number per backbone and "
    "metric among those that rest on answers; {partial}: a number that counts failed, skipped or unreadable "
    "items as errors; “— failed: …” (or skipped, unreadable, …): a cell whose readable answers cover less than "
    "{share} of its trajectories, never a score and never best."
)


@dataclass(frozen=True, slots=True)
class _Part:
    """One section of the page: the shared section, what shows before its fold, and whether it is folded."""

    section: _Section
    lead: tuple[_Table, ...] | None = None  # shown first, with the section's own tables folded under them
    legend: str = ""
    collapsed: bool = False


def _rows_count(section: _Section) -> int:
    return sum(len(t.rows) for t in section.tables)


def _html_part(part: _Part, report: Report) -> str:
    section = part.section
    body: list[str] = []
    if part.legend:
        body.append(f'<p class="legend">{html.escape(part.legend)}</p>')
    if part.lead is not None:
        body += [_html_table(t) for t in part.lead]
        if section.tables:
            rows = _rows_count(section)
            body.append(f'<details class="rows"><summary>Every row ({rows:,})</summary>')
            body += [_html_table(t) for t in section.tables]
            body.append("</details>")
    else:
        body += [_html_table(t) for t in section.tables]
    plot = _PLOTS.get(section.key)
    if plot is not None:
        body.append(_html_plot(plot(report)))
    notes = [f'<p class="note">{html.escape(n)}</p>' for n in section.notes]
    title = html.escape(section.title)
    if part.collapsed:
        rows = _rows_count(section)
        hint = f"{rows:,} rows" if rows else "notes"
        return "\n".join(
            [
                f'<section id="{section.key}"><details class="tail">',
                f'<summary><h2>{title}</h2><span class="hint">{hint}</span></summary>',
                *body,
                *notes,
                "</details></section>",
            ]
        )
    if len(notes) == 1 and not section.tables:
        folded = notes  # a section that is only a sentence ("No ... in this report.") says it openly
    elif notes:
        folded = [f'<details class="notes"><summary>Notes ({len(notes)})</summary>', *notes, "</details>"]
    else:
        folded = []
    return "\n".join([f'<section id="{section.key}">', f"<h2>{title}</h2>", *body, *folded, "</section>"])


def _parts(report: Report) -> list[_Part]:
    sections = {s.key: s for s in _sections(report)}
    level = f"{_confidence(report):.0%}"
    legend = _LEGEND.format(level=level, partial=_PARTIAL, share=f"{_min_share(report):.0%}")
    leads = {
        "paired": _paired_lead(report),
        "repeatability": _repeatability_lead(report),
        "cost": _cost_lead(report),
    }
    parts = []
    for key in _HEADLINE:
        if key in sections:
            lead = leads.get(key)
            parts.append(
                _Part(sections.pop(key), lead=lead or None, legend=legend if key == "accuracy" else "")
            )
    for key in (*_TAIL, *sections):
        if key in sections:
            parts.append(_Part(sections.pop(key), collapsed=True))
    parts.append(_Part(_protocol_section(report), collapsed=True))
    return parts


def _protocol_section(report: Report) -> _Section:
    """The header's long lines (database, protocol, scoring rule, aggregate, statistics, totals), folded."""
    _, details = _header_lines(report)
    return _Section("protocol", "Protocol and settings", notes=tuple(d[0].upper() + d[1:] for d in details))


# --- the page's own condensed tables -------------------------------------------------------------------------


def _pivot(
    cells: Mapping[tuple[str, str], Sequence[str]], heads: Sequence[str], caption: str, label: str = "Method"
) -> _Table:
    """Rows of (backbone, row label) -> values as Table 3 lays them out: one row per label, a column group of
    ``heads`` per backbone, a dash where a backbone has no such row."""
    backbones = _unique(b for b, _ in cells)
    labels = _unique(m for _, m in cells)
    rows = []
    for name in labels:
        values = []
        for backbone in backbones:
            values += list(cells.get((backbone, name), [DASH] * len(heads)))
        rows.append(_row(name, *values))
    return _Table(
        columns=(label, *(list(heads) * len(backbones))),
        rows=tuple(rows),
        groups=tuple((b, len(heads)) for b in backbones),
        caption=caption,
    )


def _repeatability_lead(report: Report) -> tuple[_Table, ...]:
    """Step Acc over realizations and the root-step agreement, one row per method, a column group per backbone."""
    cells: dict[tuple[str, str], Sequence[str]] = {}
    for row in report.repeatability:
        step = row.metrics.get("step_acc")
        mean, sd = (None, None) if step is None else (_finite(step.mean), _finite(step.sd))
        cells[row.backbone, row.method] = (f"{_pct(mean)} ± {_pct(sd)}", _pct(_finite(row.mean_agreement)))
    if not cells:
        return ()
    caption = (
        "Step Acc over realizations (mean ± SD, %; SD with ddof = 1) and the mean pairwise agreement of root "
        "steps (%); every metric and pair below the fold."
    )
    return (_pivot(cells, ("Step", "Agree"), caption),)


def _paired_lead(report: Report) -> tuple[_Table, ...]:
    """The comparisons between methods with both metrics on one row: Δ and interval, W/L, Holm p each."""
    grouped: dict[tuple[str, str], dict[str, PairedRow]] = {}
    for row in report.paired:
        key = (row.backbone_a, f"{row.method_a} vs {row.method_b}")
        grouped.setdefault(key, {})[row.metric] = row
    if not grouped:
        return ()
    metrics = _unique(m for found in grouped.values() for m in found)
    rows = []
    for (backbone, pair), found in grouped.items():
        values = []
        for metric in metrics:
            entry = found.get(metric)
            if entry is None:
                values += [DASH] * 3
                continue
            _, delta, interval, wl, _, holm, *_ = _paired_cells(entry)
            values += [f"{delta} {interval}", wl, holm]
        rows.append(_row(backbone, pair, *values))
    reference = report.reference_method
    table = _Table(
        columns=("Backbone", "A vs B", *(["Δ (pp) [95% CI]", "W/L", "p (Holm)"] * len(metrics))),
        rows=tuple(rows),
        label_columns=2,
        groups=tuple((metric_label(m), 3) for m in metrics),
        caption=f"Paired differences A − B between methods{f' against {reference}' if reference else ''}, first "
        "realization; McNemar p, families and any other comparison below the fold.",
    )
    return (table,)


def _cost_lead(report: Report) -> tuple[_Table, ...]:
    """USD and USD per trajectory (API, and GPU time when charged), one row per method, a group per backbone."""
    if not report.cost:
        return ()
    gpu = _has_gpu(report)
    per_trajectory = _usd_per_trajectory(report, with_gpu=gpu)
    grouped: dict[tuple[str, str], list[CostRow]] = {}
    for row in report.cost:
        grouped.setdefault((row.backbone, row.method), []).append(row)
    cells: dict[tuple[str, str], Sequence[str]] = {}
    for key, mine in grouped.items():
        charged = (_usd(_sum(r.gpu_usd for r in mine)),) if gpu else ()
        cells[key] = (_usd(_sum(r.cost_usd for r in mine)), *charged, _usd(per_trajectory.get(key)))
    heads = ("API USD", "GPU USD", "per traj.") if gpu else ("USD", "per traj.")
    per = "API + GPU USD" if gpu else "USD"
    caption = (
        f"USD spent per backbone × method (summed over stages and realizations) and {per} per trajectory; calls, "
        "tokens, latency and budget use per stage below the fold."
    )
    return (_pivot(cells, heads, caption),)


def _html_summary(report: Report) -> str:
    rows = []
    for fact in _summary(report):
        more = ""
        if fact.more:
            commands = "".join(f'<pre class="command">{html.escape(c)}</pre>' for c in fact.more)
            more = f"<details><summary>commands</summary>{commands}</details>"
        rows.append(f"<tr><th>{html.escape(fact.label)}</th><td>{html.escape(fact.text)}{more}</td></tr>")
    return "\n".join(
        [
            '<section id="summary">',
            "<h2>Summary</h2>",
            '<table class="kv"><tbody>',
            *rows,
            "</tbody></table>",
            "</section>",
        ]
    )


def render_html(report: Report) -> str:
    """Render a report as one self-contained HTML page that reads at a glance.

    A summary first (run, items and their failures by cause, coverage, spend, what served the backbones), then
    the accuracy table with intervals and its plot, paired comparisons, repeatability and cost; the long tail
    (outcomes per cell, full metrics, per-source tables, complementarity, protocol, ...) folded in
    ``<details>``, every section in the table of contents. Inline CSS, no scripts and no external URLs; the
    three plots are embedded PNGs, each replaced by a sentence when there is no data.

    Args:
        report: the `Report` of ``build_report``.

    Returns:
        The HTML document.
    """
    title, details = _header_lines(report)
    parts = _parts(report)
    head = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<header><h1>{html.escape(title)}</h1>",
        *(
            f'<p class="meta">{html.escape(d)}</p>' for d in details[:2]
        ),  # run and database; the rest is folded
        "</header>",
    ]
    if report.simulated:
        head.append(f'<div class="banner" role="alert">{html.escape(_SIMULATED)}</div>')
    first = [("summary", "Summary")] + [(p.section.key, p.section.title) for p in parts if not p.collapsed]
    folded = [(p.section.key, p.section.title) for p in parts if p.collapsed]

    def links(entries: Sequence[tuple[str, str]]) -> str:
        return "".join(f'<li><a href="#{key}">{html.escape(title)}</a></li>' for key, title in entries)

    head.append(
        f'<nav id="toc" aria-label="Contents"><ol>{links(first)}</ol>'
        f'<span class="more">Folded:</span><ol>{links(folded)}</ol></nav>'
    )
    body = [_html_summary(report), *(_html_part(p, report) for p in parts)]
    return "\n".join([*head, *body, "</body></html>"]) + "\n"
