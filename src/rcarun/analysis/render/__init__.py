"""Render a `Report` as terminal tables (`text`) or as one self-contained HTML page (`html`, `plots`).

The report's numbers are built once (`rcarun.analysis.report`); this package only lays them out, so the text and
the HTML never disagree about a number. Every section is built once as a `model._Section` of plain-text cells
(`cells`, `paired`, `studies`, `cost`, `sections`) and drawn by `text` or `html`. Conventions, as in the LongRCA
paper's tables: accuracies in %, one decimal; differences in pp; Root MAE in steps; USD with four decimals;
p-values with three significant digits; a missing number is "–". Table 3's best value per backbone and metric
is marked (``*`` / bold), only among cells whose numbers rest on answers; a failed cell shows its status, never a
zero. The page has no scripts and no external resources (inline CSS, PNG plots drawn on the Agg canvas without
pyplot); every string from the data goes through `html.escape`. A simulated run opens with a banner. What
each section shows: docs/analysis.md (below the report's JSON schema).
"""

from __future__ import annotations

from ..scoring import metric_label
from .html import render_html
from .plots import PALETTE, method_styles
from .text import render_text

__all__ = ["PALETTE", "method_styles", "metric_label", "render_html", "render_text"]
