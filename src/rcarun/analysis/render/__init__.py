"""Render a report dict as terminal tables (`text`) or as one self-contained HTML page (`html`, `plots`).

``rcarun report`` builds its numbers once, as a plain JSON-able dict (the schema is documented with the report
builder); this module only lays them out, so the text and the HTML can never disagree about a number. Both
renderers share one table model: every section is built once as `_Section` (plain-text cells) and then drawn by
`_text_table` or `_html_table`.

Conventions, as in the LongRCA paper's tables:

* Accuracies are fractions in the dict and percentages here, with one decimal; differences are percentage
  points (pp). Root MAE is in steps, one decimal. USD has four decimals, p-values three significant digits,
  token counts thousands separators. A missing number (``None``) is shown as "–".
* The headline table follows Table 3: rows are methods, columns are Agent and Step Acc per backbone, using the
  report's aggregate (``macro`` or ``pooled``) of each backbone × method's first realization. The highest point
  estimate per backbone and metric, as displayed, is marked (``*`` in text, bold in HTML); ties are all marked.
  Only numbers that rest on answers compete, and only above 0: a cell fails when the report does not show it
  (``shown`` false: readable answers for less than half the expected trajectories), when nothing of it was
  scored, or when its outcome's readable answers fall below the report's ``min_readable_share`` (checked here
  too, so that no flag alone decides). A failed cell prints its status (``failed``, ``skipped``,
  ``unreadable``, ...) instead of a number, in HTML with its most frequent message; a shown number that counts
  failed, skipped or unreadable items as errors carries ``†``. The footnotes say, per backbone × method, how
  many items each number counts as errors and why.
* The outcomes (predictions, unreadable answers, fallback decisions, failed, skipped, interrupted or never-run
  items) open the report: totals in the header, then the ``Outcomes`` section.
* The HTML page reads at a glance: a summary first (run, items and failures by cause, coverage, spend, what
  served each self-hosted backbone), then Table 3 with an interval beside each number, paired comparisons,
  repeatability and cost as compact tables with every row folded under them; the long tail (outcomes per
  cell, full metrics, per-source tables, complementarity, the protocol's settings, ...) folded in
  ``<details>``; a table of contents. Each cell's interval is the report's (`_interval`). Keys that newer
  report dicts add (``served_by``, cost rows' ``gpu_usd``, ``call_timing``) are shown when present.
* The page has no external resources and no scripts: inline CSS and three matplotlib plots embedded as base64
  PNG, drawn on `matplotlib.figure.Figure` with the Agg canvas (no pyplot, so no global state and nothing to
  close). Plots run from 0 to 100%, carry intervals as error bars, size themselves by the number of bars, and
  tell up to 16 methods apart by colour (`PALETTE`), more by hatch and marker; a failed cell is marked as one,
  never drawn as a zero. A plot without data is replaced by a sentence saying why. Every string that comes
  from the data (method, backbone and source names are user-controlled) goes through `html.escape`.
* When the report is ``simulated``, both renderers open with a banner: the backbones were rcarun's mock server,
  and the numbers exercise the engine, not any model.
"""

from __future__ import annotations

from ..scoring import metric_label
from .html import render_html
from .plots import PALETTE, method_styles
from .text import render_text

__all__ = ["PALETTE", "method_styles", "metric_label", "render_html", "render_text"]
