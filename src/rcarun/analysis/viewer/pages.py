"""The viewer's HTML: the trajectory index and one page per trajectory, plus the stylesheet and script they share.

Everything a page holds from results.db or the dataset is untrusted text: it goes into HTML only through
`html.escape`, and into scripts only as JSON (every non-ASCII character escaped); the page script puts it into
the document with ``textContent``, never as markup. A 700-step trajectory stays usable because a page carries
only each step's head and a short preview: the full contents, the call lists and the texts behind them are
rendered when a person opens them.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from rcarun.analysis.viewer.model import PredictionView, TrajectoryFacts
from rcarun.data import Record

__all__ = [
    "VIEWER_CSS",
    "VIEWER_JS",
    "IndexRow",
    "PageText",
    "index_page",
    "trajectory_data",
    "trajectory_page",
]

# A step whose content is longer than this is collapsed, its first PREVIEW_CHARS shown in its summary.
COLLAPSE_CHARS: Final = 400
PREVIEW_CHARS: Final = 160
_PREDICTION_COLUMNS: Final = 11
# More predictions than this on one step are listed collapsed.
_OPEN_CHIPS: Final = 6


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _usd(value: float) -> str:
    return f"${value:.4f}" if value < 1 else f"${value:,.2f}"


@dataclass(frozen=True, slots=True)
class IndexRow:
    """One line of the trajectory index."""

    qid: str
    page: str
    source: str
    n_steps: int
    ref_role: str | None
    ref_step: int | None
    predictions: int
    step_hits: int
    role_hits: int
    joint_hits: int
    without_prediction: int
    contents: bool


@dataclass(frozen=True, slots=True)
class PageText:
    """Where a page's step contents came from, in words, and the run facts its header names."""

    run_name: str
    contents_note: str
    rule: str


def _head(title: str, root: str) -> list[str]:
    return [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title>",
        f'<link rel="stylesheet" href="{root}assets/viewer.css">',
        f'</head><body data-root="{root}">',
    ]


def _hits(hits: int, total: int) -> str:
    return f'<td class="num" data-value="{hits}">{hits} / {total}</td>'


def index_page(rows: Sequence[IndexRow], text: PageText) -> str:
    """The trajectory index: one row per trajectory, filterable by text and sortable by any column."""
    predictions = sum(r.predictions for r in rows)
    parts = _head(f"Trajectories of run {text.run_name}", "")
    parts += [
        '<header><p class="crumbs"><a href="index.html">← aggregate report</a></p>',
        f"<h1>Trajectories of run {_e(text.run_name)}</h1>",
        f'<p class="meta">{len(rows)} trajectories · {predictions} predictions '
        f"(backbone × method × realization) · verdicts by the report's rule: {_e(text.rule)}</p>",
        f'<p class="meta">{_e(text.contents_note)}</p></header>',
        '<p><input class="filter" id="filter" data-table="trajectories" type="search" '
        'placeholder="filter by trajectory, source, role…" aria-label="filter trajectories" autocomplete="off"> '
        '<span class="shown meta"></span></p>',
        '<div class="scroll"><table id="trajectories" class="sortable"><thead><tr>',
        '<th data-type="text">trajectory</th><th data-type="text">source</th>',
        '<th data-type="num" class="num">steps</th><th data-type="text">reference role</th>',
        '<th data-type="num" class="num">reference step</th><th data-type="num" class="num">predictions</th>',
        '<th data-type="num" class="num" title="predictions whose step is the reference step">step hits</th>',
        '<th data-type="num" class="num" title="predictions whose role matches the reference role">role hits</th>',
        '<th data-type="num" class="num" title="role and step both right">joint hits</th>',
        '<th data-type="num" class="num" title="work items that ended without a prediction">no prediction</th>',
        "</tr></thead><tbody>",
    ]
    for row in rows:
        labelled = row.ref_role is not None and row.ref_step is not None
        ref_step = "" if row.ref_step is None else str(row.ref_step)
        missing = (
            ""
            if row.contents
            else ' <span class="na" title="step contents not available">(roles only)</span>'
        )
        cells = [
            f'<td><a href="{_e(row.page)}">{_e(row.qid)}</a>{missing}</td>',
            f"<td>{_e(row.source)}</td>",
            f'<td class="num" data-value="{row.n_steps}">{row.n_steps}</td>',
            f"<td>{_e(row.ref_role or '—')}</td>",
            f'<td class="num" data-value="{ref_step or -1}">{ref_step or "—"}</td>',
            f'<td class="num" data-value="{row.predictions}">{row.predictions}</td>',
        ]
        if labelled:
            cells += [_hits(h, row.predictions) for h in (row.step_hits, row.role_hits, row.joint_hits)]
        else:
            cells += ['<td class="num na" data-value="-1">no reference</td>'] * 3
        cells.append(f'<td class="num" data-value="{row.without_prediction}">{row.without_prediction}</td>')
        parts.append(f"<tr>{''.join(cells)}</tr>")
    parts += ["</tbody></table></div>", '<script src="assets/viewer.js"></script>', "</body></html>"]
    return "\n".join(parts) + "\n"


def _role_verdict(view: PredictionView) -> tuple[str, str]:
    prediction, score = view.prediction, view.score
    if prediction is None:
        return "na", "—"
    if score is None:
        return "na", "no reference"
    if prediction.abstained and not score.predicted:
        return "bad", "✗ abstained"
    if score.role_correct:
        return "ok", "✓ correct"
    if prediction.pred_role is None:
        return "bad", "✗ none given"
    return "bad", "✗ wrong" if score.role_valid else "✗ invalid (not a recorded role)"


def _step_verdict(view: PredictionView) -> tuple[str, str]:
    prediction, score = view.prediction, view.score
    if prediction is None:
        return "na", "—"
    if score is None:
        return "na", "no reference"
    if score.step_exact:
        return "ok", "✓ exact"
    if score.abs_err is not None:
        kind = "near" if score.step_pm5 else "bad"
        mark = "≈ within ±5" if score.step_pm5 else "✗ wrong"
        return kind, f"{mark} (off by {score.abs_err})"
    if prediction.abstained and prediction.pred_step is None:
        return "bad", "✗ abstained"
    if prediction.pred_step is None:
        return "bad", "✗ none given"
    return "bad", "✗ invalid (out of range)"


def _notes(view: PredictionView) -> str:
    notes = []
    prediction = view.prediction
    if prediction is None:
        error = f": {view.item_error}" if view.item_error else ""
        notes.append(f'<span class="flag bad">no prediction ({_e(view.status)}{_e(error)})</span>')
        return " ".join(notes)
    if prediction.abstained:
        notes.append('<span class="flag bad">abstained</span>')
    if prediction.error:
        notes.append(f'<span class="flag bad" title="{_e(prediction.error)}">unreadable answer</span>')
    if prediction.fallback:
        notes.append(f'<span class="flag near" title="{_e(prediction.fallback)}">fallback decided</span>')
    return " ".join(notes)


def _clipped(text: str | None, limit: int = 220) -> str:
    if not text:
        return '<span class="na">—</span>'
    if len(text) <= limit:
        return f'<span class="prose">{_e(text)}</span>'
    return (
        f'<details class="prose"><summary>{_e(text[:limit])}…</summary>'
        f'<div class="prose-full">{_e(text)}</div></details>'
    )


def _prediction_label(view: PredictionView) -> str:
    return f"{view.backbone} · {view.method} · r{view.realization}"


def _axis(facts: TrajectoryFacts, views: Sequence[PredictionView]) -> str:
    n = max(facts.row.n_steps, 1)
    at: dict[int, list[tuple[int, PredictionView]]] = {}
    for index, view in enumerate(views):
        if view.prediction is not None and view.prediction.pred_step is not None:
            step = view.prediction.pred_step
            if 0 <= step < n:
                at.setdefault(step, []).append((index, view))

    def left(step: int) -> str:
        return f"{(step + 0.5) * 100 / n:.3f}%"

    marks = []
    ref = facts.row.ref_step
    if ref is not None and 0 <= ref < n:
        marks.append(
            f'<a class="mark ref" style="left:{left(ref)}" href="#s-{ref}" '
            f'title="reference root: step {ref}">▼</a>'
        )
    for step, found in sorted(at.items()):
        kind = "ok" if step == ref else ("near" if ref is not None and abs(step - ref) <= 5 else "bad")
        who = "; ".join(_prediction_label(v) for _, v in found)
        marks.append(
            f'<a class="mark pred {kind}" style="left:{left(step)}" href="#s-{step}" '
            f'title="step {step}: {len(found)} prediction(s): {_e(who)}">{len(found)}</a>'
        )
    return (
        f'<div class="axis" aria-label="the step axis, 0 to {n - 1}: the reference root above, each predicted '
        f'step below with how many predictions chose it">'
        f'<div class="line"></div>{"".join(marks)}'
        f'<span class="tick start">0</span><span class="tick end">{n - 1}</span></div>'
    )


def _predictions_table(views: Sequence[PredictionView], calls: Mapping[str, Sequence[Any]]) -> list[str]:
    parts = [
        '<div class="scroll"><table id="predictions"><thead><tr>',
        "<th>backbone</th><th>method</th><th>r</th><th>role</th><th>role verdict</th>",
        '<th class="num">step</th><th>step verdict</th><th>notes</th><th>reason</th><th>evidence</th>',
        "<th>calls</th></tr></thead><tbody>",
    ]
    for index, view in enumerate(views):
        prediction = view.prediction
        role_kind, role_text = _role_verdict(view)
        step_kind, step_text = _step_verdict(view)
        role = prediction.pred_role if prediction is not None else None
        step = prediction.pred_step if prediction is not None else None
        step_cell = (
            f'<a href="#s-{step}">{step}</a>'
            if step is not None and view.score is not None and view.score.step_valid
            else _e("—" if step is None else step)
        )
        found = calls.get(view.item_id, ())
        tokens = sum(c.prompt_tokens + c.completion_tokens for c in found)
        usd = sum(c.cost_usd for c in found)
        buttons = (
            f'<button type="button" class="calls-toggle" data-pred="{index}" aria-expanded="false">'
            f"{len(found)} call{'s' if len(found) != 1 else ''}</button>"
            if found
            else '<span class="na">no calls</span>'
        )
        if prediction is not None:
            buttons += f' <button type="button" class="output-toggle" data-pred="{index}">output</button>'
        summary = f'<div class="meta">{tokens:,} tokens · {_usd(usd)}</div>' if found else ""
        parts += [
            f'<tr class="pred" id="p-{index}">',
            f"<td>{_e(view.backbone)}</td><td>{_e(view.method)}</td><td>{view.realization}</td>",
            f'<td class="pred-role">{_e(role) if role is not None else "—"}</td>',
            f'<td class="verdict-role {role_kind}">{_e(role_text)}</td>',
            f'<td class="num pred-step">{step_cell}</td>',
            f'<td class="verdict-step {step_kind}">{_e(step_text)}</td>',
            f"<td>{_notes(view)}</td>",
            f'<td class="reason">{_clipped(view.reason)}</td>',
            f'<td class="evidence">{_clipped(view.evidence, 120)}</td>',
            f"<td>{buttons}{summary}</td></tr>",
            f'<tr class="detail-row" id="detail-{index}" hidden><td colspan="{_PREDICTION_COLUMNS}"></td></tr>',
        ]
    parts.append("</tbody></table></div>")
    return parts


def _steps(
    facts: TrajectoryFacts, record: Record | None, views: Sequence[PredictionView]
) -> tuple[list[str], list[str | None]]:
    """The step list's HTML and the full contents the page script fills in when a long step is opened."""
    chips: dict[int, list[str]] = {}
    ref = facts.row.ref_step
    for index, view in enumerate(views):
        if view.prediction is None or view.prediction.pred_step is None:
            continue
        step = view.prediction.pred_step
        kind, text = _step_verdict(view)
        role_kind, role_text = _role_verdict(view)
        chips.setdefault(step, []).append(
            f'<a class="chip {kind}" href="#p-{index}" title="step: {_e(text)}; role '
            f'{_e(view.prediction.pred_role or "none")}: {_e(role_text)}">{_e(_prediction_label(view))}'
            f'<span class="chip-role {role_kind}">{_e(view.prediction.pred_role or "no role")}</span></a>'
        )
    contents: list[str | None] = []
    parts = ['<div id="step-list">']
    steps = record.trajectory.steps if record is not None else None
    for index in range(facts.row.n_steps):
        if steps is not None:
            agent, raw_role, content = steps[index].agent, steps[index].role, steps[index].content
        else:
            agent = facts.roles[index] if index < len(facts.roles) else "?"
            raw_role, content = agent, None
        is_ref = index == ref
        head = [f'<span class="idx">{index}</span>', f'<span class="role">{_e(agent)}</span>']
        if raw_role != agent:
            head.append(f'<span class="meta">({_e(raw_role)})</span>')
        if is_ref:
            head.append('<span class="badge ref">reference root</span>')
        here = chips.get(index, [])
        if len(here) > _OPEN_CHIPS:  # a step most predictions chose would bury its own content
            head.append(
                f'<details class="chips"><summary>{len(here)} predictions chose this step</summary>'
                f'<span class="chips">{"".join(here)}</span></details>'
            )
        elif here:
            head.append(f'<span class="chips">{"".join(here)}</span>')
        classes = "step ref" if is_ref else "step"
        parts.append(f'<div class="{classes}" id="s-{index}"><div class="head">{"".join(head)}</div>')
        if content is None:
            parts.append('<p class="na">content not available</p>')
            contents.append(None)
        elif len(content) <= COLLAPSE_CHARS:
            parts.append(f'<pre class="content">{_e(content) if content else "(empty)"}</pre>')
            contents.append(None)
        else:
            parts.append(
                f'<details class="content" data-step="{index}"><summary>{_e(content[:PREVIEW_CHARS])}… '
                f'<span class="meta">({len(content):,} characters)</span></summary><pre></pre></details>'
            )
            contents.append(content)
        parts.append("</div>")
    parts.append("</div>")
    return parts, contents


def trajectory_page(
    facts: TrajectoryFacts,
    record: Record | None,
    views: Sequence[PredictionView],
    calls: Mapping[str, Sequence[Any]],
    text: PageText,
    data_file: str,
) -> tuple[str, list[str | None]]:
    """One trajectory's page, and the step contents its data file must carry (`trajectory_data`)."""
    row = facts.row
    parts = _head(f"{row.qid} · run {text.run_name}", "../")
    if row.ref_role is not None and row.ref_step is not None:
        reference = (
            f'reference root: <a href="#s-{row.ref_step}">step {row.ref_step}</a>, '
            f'role <strong class="ref-role">{_e(row.ref_role)}</strong>'
        )
    else:
        reference = '<span class="na">no reference label</span>'
    hits = [v for v in views if v.score is not None]
    parts += [
        '<header><p class="crumbs"><a href="../trajectories.html">← trajectories</a> · '
        '<a href="../index.html">aggregate report</a></p>',
        f'<h1 id="qid">{_e(row.qid)}</h1>',
        f'<p class="meta">{_e(row.source)} · {row.n_steps} steps · {reference}</p>',
        f'<p class="meta">{len(views)} work items (backbone × method × realization) · '
        f"{sum(1 for v in hits if v.score is not None and v.score.step_exact)} exact steps · "
        f"{sum(1 for v in hits if v.score is not None and v.score.role_correct)} correct roles · "
        f"verdicts by the report's rule: {_e(text.rule)}</p>",
        f'<p class="meta">{_e(text.contents_note)}</p>',
    ]
    if record is not None:
        trajectory = record.trajectory
        if trajectory.task:
            parts.append(
                f'<details class="task"><summary>task ({_e(trajectory.task_source)})</summary>'
                f'<pre class="content">{_e(trajectory.task)}</pre></details>'
            )
        if record.reference is not None and record.reference.rationale:
            parts.append(
                '<details class="task"><summary>the annotator\'s rationale</summary>'
                f'<pre class="content">{_e(record.reference.rationale)}</pre></details>'
            )
    to_root = f' · <a href="#s-{row.ref_step}">reference root</a>' if row.ref_step is not None else ""
    parts += [
        '<nav class="jump">jump to: <a href="#axis">step axis</a> · <a href="#verdicts">predictions</a> · '
        f'<a href="#steps">steps</a>{to_root}</nav>',
        "</header>",
        '<section id="axis"><h2>Verdicts on the step axis</h2>',
        _axis(facts, views),
    ]
    parts.append("</section>")
    parts += [
        '<section id="verdicts"><h2>Predictions</h2>',
        '<p><input class="filter" data-table="predictions" type="search" placeholder="filter by backbone, '
        'method, role, verdict…" aria-label="filter predictions" autocomplete="off"> '
        '<span class="shown meta"></span></p>',
        *_predictions_table(views, calls),
        "</section>",
    ]
    step_parts, contents = _steps(facts, record, views)
    parts += ['<section id="steps"><h2>Steps</h2>', *step_parts, "</section>"]
    parts += [
        f'<script src="{_e(data_file)}"></script>',
        '<script src="../assets/viewer.js"></script>',
        "</body></html>",
    ]
    return "\n".join(parts) + "\n", contents


def trajectory_data(
    qid: str, contents: Sequence[str | None], predictions: Sequence[Mapping[str, Any]]
) -> str:
    """The data script of one trajectory page: the long step contents and each prediction's calls."""
    data = {"qid": qid, "steps": list(contents), "predictions": list(predictions)}
    return f"window.RCARUN_TRAJECTORY = {json.dumps(data, ensure_ascii=True, separators=(',', ':'))};\n"


VIEWER_CSS: Final = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 20px auto; max-width: 1400px;
       padding: 0 16px; color: #1a1a1a; line-height: 1.4; }
h1 { font-size: 1.4em; margin: 4px 0; word-break: break-all; }
h2 { font-size: 1.15em; border-bottom: 1px solid #ccc; padding-bottom: 2px; margin-top: 26px; }
a { color: #0b4f8a; }
.crumbs { margin: 0; font-size: 0.92em; }
.meta { color: #555; margin: 2px 0; font-size: 0.9em; }
.na { color: #777; font-style: italic; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.86em; margin-bottom: 12px; }
th, td { padding: 3px 8px; border-bottom: 1px solid #e4e4e4; text-align: left; vertical-align: top; }
th { background: #f3f5f7; position: sticky; top: 0; }
th.num, td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.sortable th { cursor: pointer; user-select: none; }
table.sortable th[aria-sort="ascending"]::after { content: " ▲"; }
table.sortable th[aria-sort="descending"]::after { content: " ▼"; }
input.filter { width: 28em; max-width: 90%; padding: 4px 6px; font-size: 0.95em; }
.ok { color: #11612b; } .near { color: #8a5a00; } .bad { color: #a11a1a; }
td.ok, td.near, td.bad { font-weight: 600; white-space: nowrap; }
.flag { display: inline-block; border: 1px solid currentColor; border-radius: 3px; padding: 0 4px;
        font-size: 0.85em; margin: 1px 2px 1px 0; }
td.reason, td.evidence { max-width: 30em; }
.prose summary { cursor: pointer; }
.axis { position: relative; height: 64px; margin: 8px 12px 4px; }
.axis .line { position: absolute; left: 0; right: 0; top: 30px; height: 4px; background: #d5dbe1;
              border-radius: 2px; }
.axis .mark { position: absolute; transform: translateX(-50%); text-decoration: none; font-size: 0.78em;
              line-height: 1; }
.axis .mark.ref { top: 8px; color: #6a1b9a; font-size: 1.1em; }
.axis .mark.pred { top: 38px; min-width: 1.3em; text-align: center; padding: 2px 2px; border-radius: 8px;
                   color: #fff; background: #a11a1a; }
.axis .mark.pred.ok { background: #11612b; } .axis .mark.pred.near { background: #b07800; }
.axis .tick { position: absolute; top: 48px; font-size: 0.75em; color: #666; }
.axis .tick.start { left: 0; } .axis .tick.end { right: 0; }
.step { border-left: 3px solid #e1e5ea; padding: 2px 0 2px 10px; margin: 6px 0; }
.step.ref { border-left-color: #6a1b9a; background: #f8f2fb; }
.step .head { display: flex; flex-wrap: wrap; gap: 6px; align-items: baseline; font-size: 0.9em; }
.idx { font-weight: 700; font-variant-numeric: tabular-nums; min-width: 2.5em; }
.role { font-weight: 600; }
.badge.ref { background: #6a1b9a; color: #fff; border-radius: 3px; padding: 0 6px; font-size: 0.85em; }
nav.jump { font-size: 0.9em; margin-top: 6px; }
details.chips > summary { cursor: pointer; font-size: 0.85em; color: #0b4f8a; }
.chips { display: inline-flex; flex-wrap: wrap; gap: 4px; }
.chip { border: 1px solid currentColor; border-radius: 10px; padding: 0 6px; font-size: 0.8em;
        text-decoration: none; }
.chip-role { margin-left: 4px; font-style: italic; }
pre { white-space: pre-wrap; word-break: break-word; font-size: 0.84em; margin: 4px 0; max-height: 40em;
      overflow: auto; background: #fafbfc; padding: 4px 6px; }
details.content > summary { cursor: pointer; font-size: 0.86em; color: #333; white-space: pre-wrap;
                            word-break: break-word; }
details.task { margin: 4px 0; font-size: 0.92em; }
.detail-row > td { background: #f6f8fa; }
.calls td, .calls th { font-size: 0.95em; }
button { font-size: 0.85em; cursor: pointer; }
pre.text { max-height: 30em; border: 1px solid #dde; }
"""


VIEWER_JS: Final = r"""
"use strict";
(function () {
  var root = document.body.getAttribute("data-root") || "";
  var loaded = new Map();
  var pending = new Map();

  // Each texts/ file calls this with its key and text.
  window.rcarunText = function (key, text) {
    loaded.set(key, text);
    var waiters = pending.get(key) || [];
    pending.delete(key);
    waiters.forEach(function (w) { w.resolve(text); });
  };

  function loadText(key) {
    if (loaded.has(key)) return Promise.resolve(loaded.get(key));
    return new Promise(function (resolve, reject) {
      var waiters = pending.get(key);
      if (!waiters) {
        waiters = [];
        pending.set(key, waiters);
        var script = document.createElement("script");
        script.src = root + "texts/" + key.slice(2, 4) + "/" + key + ".js";
        script.onerror = function () {
          var failed = pending.get(key) || [];
          pending.delete(key);
          failed.forEach(function (w) { w.reject(new Error("could not load " + script.src)); });
        };
        document.head.appendChild(script);
      }
      waiters.push({ resolve: resolve, reject: reject });
    });
  }

  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  // --- the trajectory index: filter and sort -------------------------------------------------------------
  // Detail rows (a prediction's calls) are left as they are: they follow their prediction's row.
  Array.prototype.forEach.call(document.querySelectorAll("input.filter"), function (filter) {
    var table = document.getElementById(filter.getAttribute("data-table"));
    var shown = filter.parentNode.querySelector(".shown");
    if (!table) return;
    var applyFilter = function () {
      var query = filter.value.trim().toLowerCase();
      var count = 0, total = 0;
      Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
        if (row.classList.contains("detail-row")) return;
        var hit = !query || row.textContent.toLowerCase().indexOf(query) !== -1;
        row.hidden = !hit;
        total += 1;
        if (hit) count += 1;
      });
      if (shown) shown.textContent = count + " of " + total + " shown";
    };
    filter.addEventListener("input", applyFilter);
    applyFilter();
  });
  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (sortable) {
    var heads = sortable.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th, column) {
      th.addEventListener("click", function () {
        var ascending = th.getAttribute("aria-sort") !== "ascending";
        Array.prototype.forEach.call(heads, function (other) { other.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
        var numeric = th.getAttribute("data-type") === "num";
        var rows = Array.prototype.slice.call(sortable.tBodies[0].rows);
        var value = function (row) {
          var cell = row.cells[column];
          var raw = cell.getAttribute("data-value");
          return numeric ? parseFloat(raw !== null ? raw : cell.textContent) : cell.textContent.trim();
        };
        rows.sort(function (a, b) {
          var x = value(a), y = value(b);
          var order = numeric ? x - y : x.localeCompare(y, undefined, { numeric: true });
          return ascending ? order : -order;
        });
        rows.forEach(function (row) { sortable.tBodies[0].appendChild(row); });
      });
    });
  });

  // --- one trajectory: long steps, calls, texts ------------------------------------------------------------
  var data = window.RCARUN_TRAJECTORY;
  if (!data) return;

  document.addEventListener("toggle", function (event) {
    var details = event.target;
    if (!details.matches || !details.matches("details[data-step]") || !details.open) return;
    if (details.getAttribute("data-loaded")) return;
    details.querySelector("pre").textContent = data.steps[Number(details.getAttribute("data-step"))] || "";
    details.setAttribute("data-loaded", "1");
  }, true);

  function textToggle(label, key, holder) {
    var button = el("button", "text-toggle", label);
    button.type = "button";
    button.setAttribute("data-kind", label);
    button.setAttribute("aria-expanded", "false");
    var pre = null;
    button.addEventListener("click", function () {
      if (pre) {
        pre.hidden = !pre.hidden;
        button.setAttribute("aria-expanded", String(!pre.hidden));
        return;
      }
      pre = el("pre", "text", "loading…");
      pre.setAttribute("data-kind", label);
      holder.appendChild(pre);
      button.setAttribute("aria-expanded", "true");
      loadText(key).then(function (text) { pre.textContent = text === "" ? "(empty)" : text; },
                         function (error) { pre.textContent = String(error); });
    });
    return button;
  }

  var CALL_HEADS = ["call", "backbone", "stage", "attempt", "status", "prompt tok", "completion tok",
                    "reasoning tok", "USD", "latency ms", "texts"];

  function renderCalls(prediction, cell) {
    var calls = prediction.calls || [];
    var tableNode = el("table", "calls");
    var head = tableNode.createTHead().insertRow();
    CALL_HEADS.forEach(function (name) { head.appendChild(el("th", null, name)); });
    var tbody = tableNode.createTBody();
    calls.forEach(function (call) {
      var row = tbody.insertRow();
      row.className = "call";
      var values = [call.id, call.backbone, call.stage, call.attempt,
                    call.status + (call.finish ? " (" + call.finish + ")" : ""),
                    call.prompt_tokens, call.completion_tokens, call.reasoning_tokens,
                    "$" + call.usd.toFixed(5), call.latency_ms === null ? "—" : call.latency_ms.toFixed(0)];
      values.forEach(function (value) { row.appendChild(el("td", null, value)); });
      var texts = row.insertCell();
      var holderRow = tbody.insertRow();
      holderRow.className = "call-texts";
      var holder = holderRow.insertCell();
      holder.colSpan = CALL_HEADS.length;
      if (call.error) holder.appendChild(el("div", "bad", "error: " + call.error));
      [["prompt", call.texts.prompt], ["answer", call.texts.answer], ["reasoning", call.texts.reasoning],
       ["raw body", call.texts.raw]].forEach(function (pair) {
        if (pair[1]) texts.appendChild(textToggle(pair[0], pair[1], holder));
      });
    });
    cell.appendChild(tableNode);
  }

  function detailCell(index) {
    var row = document.getElementById("detail-" + index);
    row.hidden = false;
    return row.cells[0];
  }

  // The detail row shows while any of its boxes (calls, output) is open.
  function syncRow(index) {
    var row = document.getElementById("detail-" + index);
    row.hidden = !Array.prototype.some.call(row.cells[0].children, function (box) { return !box.hidden; });
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("button") : null;
    if (!button) return;
    var index = button.getAttribute("data-pred");
    if (index === null) return;
    var prediction = data.predictions[Number(index)];
    if (button.classList.contains("calls-toggle")) {
      var box = document.getElementById("calls-" + index);
      if (box) {
        box.hidden = !box.hidden;
        syncRow(index);
      } else {
        box = el("div", "calls-box");
        box.id = "calls-" + index;
        renderCalls(prediction, box);
        detailCell(index).appendChild(box);
      }
      button.setAttribute("aria-expanded", String(!box.hidden));
    } else if (button.classList.contains("output-toggle") && prediction.output) {
      var existing = document.getElementById("output-" + index);
      if (existing) {
        existing.hidden = !existing.hidden;
        syncRow(index);
        return;
      }
      var holder = el("div", "output-box");
      holder.id = "output-" + index;
      detailCell(index).appendChild(holder);
      var pre = el("pre", "text output", "loading…");
      holder.appendChild(pre);
      loadText(prediction.output).then(function (text) { pre.textContent = text; },
                                       function (error) { pre.textContent = String(error); });
    }
  });
})();
"""
