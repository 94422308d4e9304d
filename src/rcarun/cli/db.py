"""`rcarun show`, `rcarun merge` and `rcarun db fts`: reading one item in the terminal, joining the parts of a
split sweep, and full-text search over what the models said.

`show` reads through the store (`Store.read_blob`), so a prompt kept compressed (over 64 KiB, or written before
migration 4) reads like any other; answers are read from the raw body with the backbone's preset, as the
trajectory viewer reads them. `merge` is `rcarun.store.merge` with the sweep's own rule for what makes two
configurations one (`rcarun.runner.drift`). `db fts` builds the ``search_texts`` table with sqlite-utils, whose
``enable_fts`` datasette and ``sqlite-utils search`` then use.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from rcarun.backends import get_preset, parse_completion
from rcarun.cli.analysis import check_names, open_results
from rcarun.cli.output import survives_closed_stdout
from rcarun.data.roles import role_matches
from rcarun.errors import ConfigError, RcarunError, StoreError
from rcarun.store import MergeSummary, RunRow, Store, merge_databases, open_connection, open_store
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
# Characters of each text `show` prints without --full.
_SHOWN_CHARS: Final = 1_500
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
        return _cmd_show(args, _existing(db))
    if args.command == "merge":
        return _cmd_merge(args)
    assert db is not None
    return _cmd_fts(_existing(db))


def _existing(db: Path) -> Path:
    if not db.is_file():
        raise StoreError(f"{db}: no such results database (run a sweep first, or pass --db)")
    return db


# -- show -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Reader:
    store: Store
    providers: Mapping[str, str]

    def blob(self, sha256: str | None) -> bytes | None:
        if sha256 is None:
            return None
        try:
            return self.store.read_blob(sha256)
        except RcarunError as error:
            return f"({error})".encode()

    def answer(self, call: sqlite3.Row) -> tuple[str | None, str | None]:
        """The call's answer and thinking text: their own blobs, else read from the raw body."""
        text, reasoning = self.blob(call["response_text_sha256"]), self.blob(call["reasoning_text_sha256"])
        if text is not None:
            return text.decode("utf-8", "replace"), None if reasoning is None else reasoning.decode(
                "utf-8", "replace"
            )
        body = self.blob(call["response_sha256"])
        if body is None:
            return None, None
        try:
            # A local backbone's forward pass has no preset: its body (a JSON summary) is shown as stored.
            preset = get_preset(self.providers.get(str(call["backbone"]), "openai-compatible"))
            result = parse_completion(200, {}, body, preset, 0.0, "", backbone=str(call["backbone"]))
        except (RcarunError, KeyError, ValueError):
            return body.decode("utf-8", "replace"), None
        answer = result.text
        for tool_call in result.tool_calls:
            answer += f"\n→ tool call {tool_call.name}({tool_call.arguments})"
        return answer, result.reasoning_text or None


def _call_json(reader: _Reader, call: sqlite3.Row) -> dict[str, Any]:
    from rcarun.analysis.viewer.texts import prompt_text

    request = reader.blob(call["request_sha256"])
    answer, reasoning = reader.answer(call)
    fields = (
        "call_id", "item_id", "backbone", "model", "stage", "attempt", "status", "finish_reason", "max_tokens",
        "prompt_tokens", "completion_tokens", "reasoning_tokens", "cached_tokens", "cost_usd", "latency_ms",
        "usage_source", "streamed", "ttft_ms", "decode_tokens_per_s", "error", "error_kind", "http_status",
        "started_at", "ended_at",
    )  # fmt: skip
    return {
        **{name: call[name] for name in fields},
        "prompt": None if request is None else prompt_text(request),
        "answer": answer,
        "reasoning": reasoning,
    }


def _prediction_json(row: sqlite3.Row, reference: sqlite3.Row | None) -> dict[str, Any]:
    from rcarun.analysis.viewer.model import reason_and_evidence

    try:
        output = json.loads(row["output_json"]) if row["output_json"] else {}
    except ValueError:
        output = {}
    reason, evidence = reason_and_evidence(output) if isinstance(output, dict) else (None, None)
    ref_role = reference["ref_role"] if reference is not None else None
    ref_step = reference["ref_step"] if reference is not None else None
    return {
        "role": row["pred_role"],
        "step": row["pred_step"],
        "role_valid": bool(row["role_valid"]),
        "step_valid": bool(row["step_valid"]),
        "abstained": bool(row["abstained"]),
        "role_correct": None if ref_role is None else role_matches(row["pred_role"], ref_role),
        "step_correct": None
        if ref_step is None
        else bool(row["step_valid"]) and row["pred_step"] == ref_step,
        "reason": reason,
        "evidence": evidence,
        "fallback": row["fallback"],
        "error": row["error"],
        "output": output,
    }


def _one_call(store: Store, run: RunRow, call_id: int) -> sqlite3.Row:
    row: sqlite3.Row | None = store.connection.execute(
        "SELECT * FROM calls WHERE run_id = ? AND call_id = ?", (run.run_id, call_id)
    ).fetchone()
    if row is None:
        span = store.connection.execute(
            "SELECT min(call_id), max(call_id), count(*) FROM calls WHERE run_id = ?", (run.run_id,)
        ).fetchone()
        known = f"{span[2]:,} calls, ids {span[0]}–{span[1]}" if span[2] else "no calls"
        raise ConfigError(f"--call: run {run.name!r} has no call {call_id} ({known})")
    return row


def _check_qid(store: Store, run: RunRow, qid: str) -> None:
    qids = [
        str(row[0])
        for row in store.connection.execute(
            "SELECT qid FROM items WHERE run_id = ? UNION SELECT qid FROM predictions WHERE run_id = ? "
            "UNION SELECT qid FROM trajectories WHERE run_id = ? ORDER BY 1",
            (run.run_id,) * 3,
        )
    ]
    if qid not in qids:
        shown = ", ".join(repr(q) for q in qids[:5]) + (", …" if len(qids) > 5 else "")
        raise ConfigError(f"--qid: run {run.name!r} has no qid {qid!r} ({len(qids)} qids: {shown or 'none'})")


def _show_document(args: argparse.Namespace, store: Store, run: RunRow) -> dict[str, Any]:
    from rcarun.analysis.results import backbone_providers, run_config

    reader = _Reader(store, backbone_providers(run_config(run)))
    connection = store.connection
    if args.call is not None:
        call = _one_call(store, run, args.call)
        return {"run": run.name, "qid": call["qid"], "call": _call_json(reader, call)}
    if args.qid is None:
        raise ConfigError("show: give --qid Q (a trajectory of the run) or --call ID")
    _check_qid(store, run, args.qid)
    names = store.work_names(run.run_id)
    owner = f"run {run.name!r}"
    if args.backbone is not None:
        check_names("--backbone", "backbone", [args.backbone], names.backbones, owner)
    if args.method is not None:
        check_names("--method", "method", [args.method], names.methods, owner)
    reference = connection.execute(
        "SELECT * FROM trajectories WHERE run_id = ? AND qid = ?", (run.run_id, args.qid)
    ).fetchone()
    filters, params = ["run_id = ?", "qid = ?"], [run.run_id, args.qid]
    for column, value in (
        ("backbone", args.backbone),
        ("method", args.method),
        ("realization", args.realization),
    ):
        if value is not None:
            filters.append(f"{column} = ?")
            params.append(value)
    where = " AND ".join(filters)
    keys = connection.execute(
        f"SELECT item_id, backbone, method, realization FROM items WHERE {where} "
        f"UNION SELECT item_id, backbone, method, realization FROM predictions WHERE {where} "
        "ORDER BY backbone, method, realization",
        params * 2,
    ).fetchall()
    if not keys:
        raise ConfigError(
            f"show: run {run.name!r} has no work item of qid {args.qid!r} with "
            f"{_filters_text(args)}; drop a filter to see them all"
        )
    items = []
    for key in keys:
        match = (run.run_id, key["backbone"], key["method"], args.qid, key["realization"])
        item = connection.execute(
            "SELECT * FROM items WHERE run_id = ? AND backbone = ? AND method = ? AND qid = ? AND realization = ?",
            match,
        ).fetchone()
        prediction = connection.execute(
            "SELECT * FROM predictions WHERE run_id = ? AND backbone = ? AND method = ? AND qid = ? "
            "AND realization = ?",
            match,
        ).fetchone()
        calls = connection.execute(
            "SELECT * FROM calls WHERE run_id = ? AND item_id = ? ORDER BY call_id",
            (run.run_id, key["item_id"]),
        ).fetchall()
        items.append(
            {
                "backbone": key["backbone"],
                "method": key["method"],
                "realization": key["realization"],
                "item_id": key["item_id"],
                "status": item["status"] if item is not None else None,
                "attempts": item["attempts"] if item is not None else None,
                "item_error": item["error"] if item is not None else None,
                "prediction": None if prediction is None else _prediction_json(prediction, reference),
                "calls": [_call_json(reader, call) for call in calls],
            }
        )
    return {
        "run": run.name,
        "qid": args.qid,
        "reference": None
        if reference is None
        else {
            "source": reference["source"],
            "n_steps": reference["n_steps"],
            "role": reference["ref_role"],
            "step": reference["ref_step"],
        },
        "items": items,
    }


def _filters_text(args: argparse.Namespace) -> str:
    parts = [
        f"{flag} {value}"
        for flag, value in (
            ("--backbone", args.backbone),
            ("--method", args.method),
            ("--realization", args.realization),
        )
        if value is not None
    ]
    return " ".join(parts) or "no filter"


def _cut(text: str, full: bool) -> str:
    if full or len(text) <= _SHOWN_CHARS:
        return text
    return f"{text[:_SHOWN_CHARS]}\n… ({len(text) - _SHOWN_CHARS:,} more characters; --full shows all)"


def _indented(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines()) or "    (empty)"


def _call_lines(call: Mapping[str, Any], full: bool) -> Iterator[str]:
    latency = f"{call['latency_ms']:,.0f} ms" if call["latency_ms"] is not None else "latency –"
    tokens = f"{call['prompt_tokens']:,} + {call['completion_tokens']:,} tokens"
    named = (("reasoning_tokens", "reasoning"), ("cached_tokens", "cached"))
    extra = [f"{name} {call[key]:,}" for key, name in named if call[key]]
    yield (
        f"  call {call['call_id']} · {call['backbone']} · {call['stage']} · attempt {call['attempt']} · "
        f"{call['status']}{' (' + call['finish_reason'] + ')' if call['finish_reason'] else ''} · {tokens}"
        f"{' (' + ', '.join(extra) + ')' if extra else ''} · ${call['cost_usd']:.6f} · {latency}"
    )
    if call["error"]:
        yield f"    error: {call['error']}"
    for label in ("prompt", "reasoning", "answer"):
        text = call[label]
        if text is not None:
            yield f"   {label} ({len(text):,} characters):"
            # Escaped before the lines are split: a carriage return or a form feed is shown, not taken for a break.
            yield _indented(terminal_safe(_cut(text, full)))


def _prediction_line(prediction: Mapping[str, Any]) -> Iterator[str]:
    def verdict(valid: bool, correct: bool | None) -> str:
        if not valid:
            return "invalid"
        return "valid" if correct is None else ("valid, right" if correct else "valid, wrong")

    yield (
        f"  prediction: role {prediction['role']!r} ({verdict(prediction['role_valid'], prediction['role_correct'])}), "
        f"step {prediction['step']} ({verdict(prediction['step_valid'], prediction['step_correct'])})"
        f"{', abstained' if prediction['abstained'] else ''}"
    )
    for key in ("reason", "evidence", "fallback", "error"):
        if prediction[key]:
            yield f"  {key}: {prediction[key]}"


def _show_text(document: Mapping[str, Any], full: bool) -> str:
    lines = []
    if "call" in document:
        lines.append(f"run {document['run']!r} · qid {document['qid']!r}")
        lines += list(_call_lines(document["call"], full))
        return "\n".join(lines)
    reference = document["reference"]
    lines.append(f"run {document['run']!r} · qid {document['qid']!r}")
    if reference is None:
        lines.append("reference: no trajectory row in results.db")
    else:
        lines.append(
            f"reference: role {reference['role']!r}, step {reference['step']} · source {reference['source']} · "
            f"{reference['n_steps']} steps"
        )
    for item in document["items"]:
        lines += [
            "",
            f"── {item['backbone']} / {item['method']} / r{item['realization']} · item {item['status'] or 'no row'}"
            f"{' after ' + str(item['attempts']) + ' attempts' if item['attempts'] and item['attempts'] > 1 else ''}",
        ]
        if item["item_error"]:
            lines.append(f"  item error: {item['item_error']}")
        if item["prediction"] is None:
            lines.append("  prediction: none")
        else:
            lines += list(_prediction_line(item["prediction"]))
        lines.append(f"  calls: {len(item['calls'])}")
        for call in item["calls"]:
            lines += list(_call_lines(call, full))
    return "\n".join(lines)


@survives_closed_stdout
def _cmd_show(args: argparse.Namespace, db: Path) -> int:
    from rcarun.analysis import resolve_run

    with open_results(db) as store:
        run = resolve_run(store, args.run or os.environ.get("RCARUN_RUN") or None)
        document = _show_document(args, store, run)
    if args.json:
        print(json.dumps(document, indent=2, ensure_ascii=False))
    else:
        print(_show_text(document, args.full))
    return 0


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
    readers = {run_id: _Reader(store, backbone_providers(run_config(run))) for run_id, run in runs.items()}
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
