"""Writing the viewer's static site for one run (layout in the package docstring).

Memory stays bounded by one trajectory: the dataset is walked once, lazily, each page written as its record
arrives, and a page reads only its own predictions and calls (by rowid and by the ``(run_id, item_id)`` index).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final

from rcarun.analysis.protocol import scoring_rule
from rcarun.analysis.render import render_html
from rcarun.analysis.report.model import Report
from rcarun.analysis.results import backbone_providers, run_config
from rcarun.analysis.viewer.model import (
    CallView,
    PredictionView,
    Rules,
    TrajectoryFacts,
    read_calls,
    read_predictions,
)
from rcarun.analysis.viewer.pages import (
    VIEWER_CSS,
    VIEWER_JS,
    IndexRow,
    PageText,
    index_page,
    trajectory_data,
    trajectory_page,
)
from rcarun.analysis.viewer.texts import TextFiles
from rcarun.data import Record, iter_dataset, natural_sort_key
from rcarun.errors import ConfigError, DataError
from rcarun.store import ItemRow, PredictionRow, RunRow, Store

__all__ = ["SITE_MARKER", "SiteFiles", "is_site_target", "page_name", "write_site"]

SITE_MARKER: Final = "rcarun-site.json"
# The folders this writes; a rewrite of a site removes them first, so no page of an earlier run is left behind.
_OWNED: Final = ("t", "texts", "assets")
_PAGE_SUFFIXES: Final = (".html", ".htm")
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]+")
_PREDICTION_FIELDS: Final = tuple(f.name for f in fields(PredictionRow))


@dataclass(frozen=True, slots=True)
class SiteFiles:
    """What `write_site` wrote.

    Attributes:
        root: the site's folder.
        index: the aggregate page (``index.html``), which links to the viewer.
        trajectories: the trajectory index (``trajectories.html``).
        pages: how many trajectory pages.
        with_contents: how many of them show step contents (their dataset record was found unchanged).
        texts: how many text files (prompts, answers, ...), each written once.
        text_bytes: their size in bytes.
        contents_note: where step contents came from, or why they are missing, in words.
    """

    root: Path
    index: Path
    trajectories: Path
    pages: int
    with_contents: int
    texts: int
    text_bytes: int
    contents_note: str


def is_site_target(path: str) -> bool:
    """Whether ``--html PATH`` asks for the site (a folder) rather than one page.

    A folder is meant when PATH ends with a path separator, is an existing directory, or does not end in
    ``.html`` / ``.htm``; ``report.html`` keeps the single self-contained page.
    """
    if path.endswith(("/", os.sep)) or Path(path).is_dir():
        return True
    return not path.lower().endswith(_PAGE_SUFFIXES)


def page_name(qid: str) -> str:
    """A trajectory page's file stem: the qid made filesystem- and URL-safe, and a hash of the exact qid, so two
    qids that differ only in unsafe characters or in case never share a file."""
    readable = _UNSAFE.sub("_", qid).strip("._-")[:60] or "trajectory"
    return f"{readable}-{hashlib.sha256(qid.encode('utf-8', errors='surrogatepass')).hexdigest()[:10]}"


def _prepare(root: Path) -> None:
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--html {root}: exists and is not a directory (name a FILE.html for one page)")
    if root.is_dir() and any(root.iterdir()) and not (root / SITE_MARKER).is_file():
        raise ConfigError(
            f"--html {root}: the directory is not empty and holds no {SITE_MARKER} (not a site rcarun wrote); "
            "name a new or empty directory"
        )
    root.mkdir(parents=True, exist_ok=True)
    for name in _OWNED:
        shutil.rmtree(root / name, ignore_errors=True)
    (root / "t").mkdir()
    (root / "assets").mkdir()


def _dataset(config: Mapping[str, Any]) -> Path | None:
    sweep = config.get("sweep")
    dataset = sweep.get("dataset") if isinstance(sweep, dict) else None
    return Path(dataset) if isinstance(dataset, str) and dataset else None


def _prediction_rowids(store: Store, run_id: int) -> dict[str, list[int]]:
    found: dict[str, list[int]] = defaultdict(list)
    for row in store.connection.execute("SELECT rowid, qid FROM predictions WHERE run_id = ?", (run_id,)):
        found[str(row[1])].append(int(row[0]))
    return found


def _predictions(store: Store, rowids: Sequence[int]) -> list[PredictionRow]:
    rows: list[PredictionRow] = []
    for start in range(0, len(rowids), 400):
        chunk = rowids[start : start + 400]
        marks = ", ".join("?" for _ in chunk)
        for row in store.connection.execute(f"SELECT * FROM predictions WHERE rowid IN ({marks})", chunk):
            values = {name: row[name] for name in _PREDICTION_FIELDS}
            for flag in ("role_valid", "step_valid", "abstained"):
                values[flag] = bool(values[flag])
            rows.append(PredictionRow(**values))
    return rows


def _call_json(call: CallView, texts: TextFiles) -> dict[str, Any]:
    keys: dict[str, str] = {}
    if call.request_sha256:
        keys["prompt"] = texts.prompt(call.request_sha256)
    if call.response_sha256:
        keys |= texts.body(call.response_sha256, call.backbone)
    if call.response_text_sha256:
        keys["answer"] = texts.text(call.response_text_sha256)
    if call.reasoning_text_sha256:
        keys["reasoning"] = texts.text(call.reasoning_text_sha256)
    return {
        "id": call.call_id,
        "backbone": call.backbone,
        "stage": call.stage,
        "attempt": call.attempt,
        "status": call.status,
        "finish": call.finish_reason,
        "prompt_tokens": call.prompt_tokens,
        "completion_tokens": call.completion_tokens,
        "reasoning_tokens": call.reasoning_tokens,
        "usd": call.cost_usd,
        "latency_ms": call.latency_ms,
        "error": call.error,
        "texts": keys,
    }


def _output_key(view: PredictionView, texts: TextFiles) -> str | None:
    if view.prediction is None or not view.prediction.output_json:
        return None
    try:
        output = json.loads(view.prediction.output_json)
    except ValueError:
        output = {"unreadable output_json": view.prediction.output_json}
    return texts.output(output if isinstance(output, dict) else {"output": output})


class _Writer:
    def __init__(self, store: Store, run: RunRow, root: Path, rules: Rules, texts: TextFiles) -> None:
        self.store = store
        self.run = run
        self.root = root
        self.rules = rules
        self.texts = texts
        self.rowids = _prediction_rowids(store, run.run_id)
        self.items: dict[str, list[ItemRow]] = defaultdict(list)
        for item in store.items(run.run_id):
            self.items[item.qid].append(item)
        self.rows: list[IndexRow] = []

    def page(self, facts: TrajectoryFacts, record: Record | None, text: PageText) -> None:
        qid = facts.row.qid
        predictions = _predictions(self.store, self.rowids.get(qid, []))
        views = read_predictions(facts, predictions, self.items.get(qid, []), self.rules)
        calls = read_calls(self.store, self.run.run_id, [v.item_id for v in views])
        name = page_name(qid)
        html, contents = trajectory_page(facts, record, views, calls, text, f"{name}.data.js")
        data = [
            {
                "calls": [_call_json(c, self.texts) for c in calls.get(v.item_id, [])],
                "output": _output_key(v, self.texts),
            }
            for v in views
        ]
        (self.root / "t" / f"{name}.html").write_text(html, encoding="utf-8")
        (self.root / "t" / f"{name}.data.js").write_text(
            trajectory_data(qid, contents, data), encoding="ascii"
        )
        scored = [v.score for v in views if v.score is not None]
        self.rows.append(
            IndexRow(
                qid=qid,
                page=f"t/{name}.html",
                source=facts.row.source,
                n_steps=facts.row.n_steps,
                ref_role=facts.row.ref_role,
                ref_step=facts.row.ref_step,
                predictions=sum(1 for v in views if v.prediction is not None),
                step_hits=sum(1 for s in scored if s.step_exact),
                role_hits=sum(1 for s in scored if s.role_correct),
                joint_hits=sum(1 for s in scored if s.joint_exact),
                without_prediction=sum(1 for v in views if v.prediction is None),
                contents=record is not None,
            )
        )


def _with_viewer_link(page: str, trajectories: int) -> str:
    link = (
        '<p class="meta"><a id="viewer-link" href="trajectories.html">Trajectory viewer</a>: each of the '
        f"{trajectories} trajectories with every backbone × method verdict on its steps, and the calls behind "
        "them</p>"
    )
    if "</header>" in page:
        return page.replace("</header>", "</header>\n" + link, 1)
    return page.replace("<body>", "<body>\n" + link, 1)


def write_site(store: Store, run: RunRow, directory: Path, report: Report) -> SiteFiles:
    """Write the report and the trajectory viewer of ``run`` as a static site in ``directory``.

    Args:
        store: results.db, open (read-only is enough).
        run: the run the report is about.
        directory: the site's folder: created when missing; an earlier site there is replaced, any other
            non-empty folder refused.
        report: the `Report` of ``run`` (`rcarun.analysis.report.build_report`); its page becomes
            ``index.html`` and its scoring rules decide every verdict the viewer shows.

    Raises:
        ConfigError: ``directory`` is a file, or a non-empty folder that is not an earlier site.
    """
    root = Path(directory)
    _prepare(root)
    config = run_config(run)
    rules = Rules.of_report(report)
    texts = TextFiles(root, store, backbone_providers(config))
    writer = _Writer(store, run, root, rules, texts)
    facts = {row.qid: TrajectoryFacts.of(row) for row in store.trajectories(run.run_id)}
    rule = scoring_rule(rules.abstentions, rules.keep_handoff)
    dataset = _dataset(config)
    left = dict(facts)
    differ: list[str] = []
    problems: list[DataError] = []
    if dataset is not None and dataset.exists():
        found = PageText(run.name, f"step contents from {dataset}", rule)
        for record in iter_dataset(dataset, strict=False, on_problem=problems.append):
            qid = record.trajectory.qid
            if qid not in left:
                continue
            if record.trajectory.sha256 != left[qid].row.sha256:
                differ.append(qid)
                continue
            writer.page(left.pop(qid), record, found)
    with_contents = len(facts) - len(left)
    if dataset is None:
        note = "step contents not available: the run's config names no dataset"
    elif not dataset.exists():
        note = f"step contents not available: the run's dataset {dataset} is not on this machine"
    else:
        note = f"step contents from {dataset}"
        if differ:
            note += f"; {len(differ)} trajectories differ there from what the run saw (SHA-256): roles only"
        if len(left) > len(differ):
            note += f"; {len(left) - len(differ)} trajectories are not in it: roles only"
    for qid in sorted(left, key=natural_sort_key):
        if dataset is None or not dataset.exists():
            why = note
        elif qid in differ:
            why = (
                f"step contents not shown: the record in {dataset} differs from the one the run saw (SHA-256)"
            )
        else:
            why = f"step contents not available: {qid} is not in {dataset}"
        writer.page(left[qid], None, PageText(run.name, why, rule))
    rows = sorted(writer.rows, key=lambda r: natural_sort_key(r.qid))
    index = root / "index.html"
    trajectories = root / "trajectories.html"
    trajectories.write_text(index_page(rows, PageText(run.name, note, rule)), encoding="utf-8")
    index.write_text(_with_viewer_link(render_html(report), len(rows)), encoding="utf-8")
    (root / "assets" / "viewer.css").write_text(VIEWER_CSS.lstrip(), encoding="utf-8")
    (root / "assets" / "viewer.js").write_text(VIEWER_JS.lstrip(), encoding="utf-8")
    marker = {"run": run.name, "db": str(store.path), "trajectories": len(rows)}
    (root / SITE_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    return SiteFiles(
        root=root,
        index=index,
        trajectories=trajectories,
        pages=len(rows),
        with_contents=with_contents,
        texts=texts.count,
        text_bytes=texts.bytes_written,
        contents_note=note,
    )
