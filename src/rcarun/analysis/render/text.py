"""The report as fixed-width terminal tables."""

from __future__ import annotations

import textwrap
from collections.abc import Collection, Sequence

from ..report.model import Report
from .model import _GAP, _SIMULATED, _TEXT_WIDTH, _Table
from .sections import _header_lines, _sections


def _text_table(table: _Table) -> list[str]:
    n = len(table.columns)
    marked = [any(r.cells[i].best for r in table.rows) for i in range(n)]
    # A marked column pads unmarked numbers with a space so that the digits stay aligned.
    body = [
        [c.text + ("*" if c.best else " " if marked[i] else "") for i, c in enumerate(r.cells)]
        for r in table.rows
    ]
    widths = [max([len(table.columns[i])] + [len(row[i]) for row in body]) for i in range(n)]
    start = table.label_columns
    for label, span in table.groups:
        have = sum(widths[start : start + span]) + len(_GAP) * (span - 1)
        if have < len(label):
            widths[start + span - 1] += len(label) - have
        start += span

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.ljust(widths[i]) if i < table.label_columns else c.rjust(widths[i]) for i, c in enumerate(cells)
        ]
        return _GAP.join(parts).rstrip()

    lines = [table.caption] if table.caption else []
    if table.groups:
        parts = [" " * w for w in widths[: table.label_columns]]
        start = table.label_columns
        for label, span in table.groups:
            parts.append(label.center(sum(widths[start : start + span]) + len(_GAP) * (span - 1)))
            start += span
        lines.append(_GAP.join(parts).rstrip())
    lines.append(line(table.columns))
    lines.append(_GAP.join("-" * w for w in widths))
    lines.extend(line(row) for row in body)
    return lines


def render_text(report: Report, sections: Collection[str] | None = None) -> str:
    """Render a report as fixed-width terminal tables.

    Args:
        report: the `Report` of ``build_report`` (accuracies as fractions, None for "not available").
        sections: only these section keys (``accuracy``, ``outcomes``, ``full-metrics``, ``per-source``, ``paired``,
            ``components``, ``complementarity``, ``repeatability``, ``recall``, ``turns``, ``length-groups``,
            ``fidelity``, ``calibration``, ``label-sensitivity``, ``cost``, ``call-timing``); all when None.

    Returns:
        The text, ending with a newline.
    """
    title, details = _header_lines(report)
    lines = [title, "=" * len(title), *details, ""]
    if report.simulated:
        banner = textwrap.wrap(_SIMULATED, _TEXT_WIDTH - 4)
        rule = "!" * _TEXT_WIDTH
        lines += [rule, *(f"!! {w}" for w in banner), rule, ""]
    for section in _sections(report):
        if sections is not None and section.key not in sections:
            continue
        lines += [section.title, "-" * len(section.title)]
        for table in section.tables:
            lines += [*_text_table(table), ""]
        for note in section.notes:
            lines += [*textwrap.wrap(note, _TEXT_WIDTH), ""]
        if not section.notes and not section.tables:
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"
