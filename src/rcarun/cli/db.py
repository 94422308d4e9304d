"""`rcarun show`, `rcarun merge` and `rcarun db fts`: the commands' parsers, joining the parts of a split sweep,
and full-text search over what the models said (`show` itself lives in `rcarun.cli.show`).

`merge` is `rcarun.store.merge` with the sweep's own rule for what makes two
configurations one (`rcarun.runner.drift`). `db fts` builds the ``search_texts`` table with sqlite-utils, whose
``enable_fts`` datasette and ``sqlite-utils search`` then use.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from rcarun.cli.show import AnswerReader, cmd_show
from rcarun.errors import StoreError
from rcarun.store import MergeSummary, Store, merge_databases, open_connection, open_store
from rcarun.text import terminal_safe

__all__ = ["DB_COMMANDS", "add_db_commands", "run_db_command"]

DB_COMMANDS: Final = ("show", "merge", "db")
SEARCH_TABLE: Final = "search_texts"
_SEARCH_COLUMNS: Final[dict[str, Any]] = {
    "id": int,
    "kind": str,
    "run": str,
    "backbone": str,
    "method": str,
    "qid": str,
    "realization": int,
    "call_id": int,
    "stage": str,
    "text": str,
}
_EXIT_CONFLICTS: Final = 1


def add_db_commands(commands: Any, default_db: str) -> None:
    """Register show, merge and db on the top-level subparsers."""
    show = commands.add_parser(
        "show",
        help="one item (or one call) of a run: prediction, reference, each call with its prompt and answer",
        description="One trajectory's work items of a run, or one call: the prediction (role, step, validity, "
        "reason), the reference, and each call's stage, attempt, status, tokens, USD, latency, prompt and "
        "answer. Texts are cut at 1,500 characters unless --full; --json prints everything as one document.",
    )
    show.add_argument(
        "--db", help=f"results database, opened read-only (env RCARUN_DB, default {default_db})"
    )
    show.add_argument("--run", help="run name (env RCARUN_RUN; default: the most recently updated run)")
    show.add_argument("--qid", help="trajectory id (required unless --call)")
    show.add_argument("--backbone", help="only this backbone's items")
    show.add_argument("--method", help="only this method's items (its label)")
    show.add_argument("--realization", type=int, metavar="N", help="only this realization (0-based)")
    show.add_argument("--call", type=int, metavar="ID", help="only this call (a calls.call_id of the run)")
    show.add_argument("--full", action="store_true", help="print every text whole")
    show.add_argument("--json", action="store_true", help="print as JSON (texts whole)")

    merge = commands.add_parser(
        "merge",
        help="merge results.db files of one sweep split across machines into one",
        description="Merge the runs of each file into --into (created if new): runs matched by name (their "
        "answer-deciding settings must agree), blobs stored once, ids renumbered, identical rows skipped. A "
        "prediction that disagrees with one already kept is listed, never written. Exit 0: merged; 1: merged, "
        "with conflicts listed; 2: refused, nothing written.",
    )
    merge.add_argument("sources", nargs="+", metavar="DB", help="results databases to merge, in order")
    merge.add_argument("--into", required=True, metavar="DB", help="the merged results database")
    merge.add_argument("--json", action="store_true", help="print the summary as JSON")

    db = commands.add_parser("db", help="results.db upkeep: full-text search")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    fts = db_commands.add_parser(
        "fts",
        help=f"(re)build the full-text index {SEARCH_TABLE} over answers, thinking texts and reasons",
        description=f"Fill the table {SEARCH_TABLE} with every answer, thinking text and prediction reason "
        "of the file and enable SQLite FTS5 on it (sqlite-utils): datasette shows a search box, and "
        f"`sqlite-utils search results.db {SEARCH_TABLE} WORDS` searches it. Run it again after a sweep.",
    )
    fts.add_argument("--db", help=f"results database (env RCARUN_DB, default {default_db})")


def run_db_command(args: argparse.Namespace, default_db: str) -> int:
    db = Path(args.db or os.environ.get("RCARUN_DB") or default_db) if hasattr(args, "db") else None
    if args.command == "show":
        assert db is not None
        return cmd_show(args, _existing(db))
    if args.command == "merge":
        return _cmd_merge(args)
    assert db is not None
    return _cmd_fts(_existing(db))


def _existing(db: Path) -> Path:
    if not db.is_file():
        raise StoreError(f"{db}: no such results database (run a sweep first, or pass --db)")
    return db


# -- show -----------------------------------------------------------------------------------------------------


# -- merge ----------------------------------------------------------------------------------------------------


def reconcile_configs(kept_json: str, incoming_json: str) -> tuple[list[str], str]:
    """What differs between two parts' sweep configs (answer-deciding settings, `rcarun.runner.drift`), and the
    config the merged run keeps: the first's, with the backbones and methods only the later one has added."""
    from rcarun.runner import SweepConfig
    from rcarun.runner.drift import answer_changes

    try:
        kept, incoming = json.loads(kept_json), json.loads(incoming_json)
        config = SweepConfig.model_validate(incoming)
    except ValueError:
        # A config this rcarun cannot read (an older one's, or damaged) is one only when it is the same text.
        return (
            [] if kept_json == incoming_json else ["the stored configs differ and cannot be read"]
        ), kept_json
    if not isinstance(kept, dict) or not kept:
        return [], incoming_json
    differences = answer_changes(kept_json, config)
    merged = dict(kept)
    backbones = dict(kept.get("backbones") or {})
    for name, backbone in (incoming.get("backbones") or {}).items():
        backbones.setdefault(name, backbone)
    merged["backbones"] = backbones
    methods = list(kept.get("methods") or [])
    labels = {m.get("label") or m.get("name") for m in methods if isinstance(m, dict)}
    for method in incoming.get("methods") or []:
        if isinstance(method, dict) and (method.get("label") or method.get("name")) not in labels:
            methods.append(method)
    merged["methods"] = methods
    return differences, json.dumps(merged)


def _summary_json(summary: MergeSummary) -> dict[str, Any]:
    return {
        "into": str(summary.into),
        "runs_created": summary.runs_created,
        "runs_matched": summary.runs_matched,
        "blobs_added": summary.blobs_added,
        "calls_added": summary.calls_added,
        "predictions_added": summary.predictions_added,
        "items_added": summary.items_added,
        "trajectories_added": summary.trajectories_added,
        "events_added": summary.events_added,
        "duplicates_skipped": summary.duplicates,
        "calls_not_copied": summary.calls_not_copied,
        "conflicts": [
            {"run": c.run, "key": c.key, "source": str(c.source), "kept": c.kept, "refused": c.refused}
            for c in summary.conflicts
        ],
    }


def _cmd_merge(args: argparse.Namespace) -> int:
    sources = [Path(source) for source in args.sources]
    for source in sources:
        _existing(source)
    summary = merge_databases(sources, Path(args.into), reconcile_configs)
    if args.json:
        print(json.dumps(_summary_json(summary), indent=2))
    else:
        runs = ", ".join(repr(name) for name in [*summary.runs_created, *summary.runs_matched]) or "none"
        print(
            f"merged {len(sources)} files into {summary.into}: runs {runs}; added {summary.predictions_added:,} "
            f"predictions, {summary.items_added:,} items, {summary.calls_added:,} calls, "
            f"{summary.blobs_added:,} blobs, {summary.trajectories_added:,} trajectories, "
            f"{summary.events_added:,} events; {summary.duplicates:,} identical predictions skipped "
            f"({summary.calls_not_copied:,} calls of items already kept not copied)"
        )
        for conflict in summary.conflicts:
            print(
                terminal_safe(
                    f"conflict: run {conflict.run!r} {conflict.key}: kept {conflict.kept}; not written from "
                    f"{conflict.source}: {conflict.refused}"
                ),
                file=sys.stderr,
            )
    if summary.conflicts:
        print(
            f"rcarun: {len(summary.conflicts)} conflicting rows were left out (listed above); the first file's "
            "rows are kept",
            file=sys.stderr,
        )
        return _EXIT_CONFLICTS
    return 0


# -- db fts ---------------------------------------------------------------------------------------------------


def _search_rows(store: Store) -> Iterator[dict[str, Any]]:
    from rcarun.analysis.results import backbone_providers, run_config
    from rcarun.analysis.viewer.model import reason_and_evidence

    runs = {run.run_id: run for run in store.runs()}
    readers = {
        run_id: AnswerReader(store, backbone_providers(run_config(run))) for run_id, run in runs.items()
    }
    calls = store.connection.execute(
        "SELECT * FROM calls WHERE status IN ('ok', 'length') AND (response_sha256 IS NOT NULL "
        "OR response_text_sha256 IS NOT NULL) ORDER BY call_id"
    )
    while batch := calls.fetchmany(500):
        for call in batch:
            answer, reasoning = readers[int(call["run_id"])].answer(call)
            base = {
                key: call[key] for key in ("backbone", "method", "qid", "realization", "call_id", "stage")
            }
            base["run"] = runs[int(call["run_id"])].name
            for kind, text in (("answer", answer), ("reasoning", reasoning)):
                if text and text.strip():
                    yield {"kind": kind, **base, "text": text}
    for run in runs.values():
        for prediction in store.predictions(run.run_id):
            try:
                output = json.loads(prediction.output_json) if prediction.output_json else {}
            except ValueError:
                continue
            reason, _ = reason_and_evidence(output) if isinstance(output, dict) else (None, None)
            if reason:
                yield {
                    "kind": "reason",
                    "backbone": prediction.backbone,
                    "method": prediction.method,
                    "qid": prediction.qid,
                    "realization": prediction.realization,
                    "call_id": None,
                    "stage": None,
                    "run": run.name,
                    "text": reason,
                }


def build_search_index(db: Path) -> dict[str, int]:
    """(Re)build ``search_texts`` with FTS5 (sqlite-utils), from every answer, thinking text and reason.

    Returns:
        rows indexed per kind.
    """
    import sqlite_utils

    open_connection(db).close()  # a results.db this rcarun can write (migrated), or a clear refusal
    counts: dict[str, int] = {"answer": 0, "reasoning": 0, "reason": 0}
    database = sqlite_utils.Database(db)
    try:
        table = database.table(SEARCH_TABLE)
        if table.exists():
            if table.detect_fts() is not None:
                table.disable_fts()
            table.drop()

        def counted(rows: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
            for row in rows:
                counts[row["kind"]] += 1
                yield row

        with open_store(db, read_only=True) as store:
            table.insert_all(counted(_search_rows(store)), pk="id", columns=_SEARCH_COLUMNS, batch_size=500)
        if (
            not table.exists()
        ):  # nothing to index: the table still exists, empty, for searches to find nothing
            table.create(_SEARCH_COLUMNS, pk="id")
        table.enable_fts(["text"], fts_version="FTS5", tokenize="porter", replace=True)
    except sqlite3.Error as error:
        raise StoreError(f"{db}: building {SEARCH_TABLE} failed: {error}") from error
    finally:
        database.close()
    return counts


def _cmd_fts(db: Path) -> int:
    counts = build_search_index(db)
    print(
        f"rcarun: indexed {counts['answer']:,} answers, {counts['reasoning']:,} thinking texts and "
        f"{counts['reason']:,} prediction reasons in {db} table {SEARCH_TABLE} (FTS5); search with "
        f"`sqlite-utils search {db} {SEARCH_TABLE} WORDS`, or in datasette"
    )
    return 0
