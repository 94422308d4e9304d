"""results.db's schema as Markdown, generated from a freshly migrated database so the docs cannot drift.

``python -m rcarun.store.schema --markdown > docs/schema.md`` regenerates the checked-in page; a test compares
the two. Column types, constraints and indexes come from SQLite itself; only the prose (what a table or column
means, in which unit) is kept here, and a test requires prose for every table and column.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from collections.abc import Sequence
from typing import Final

from rcarun.store.migrations import MIGRATIONS, open_connection

__all__ = ["COLUMN_NOTES", "TABLE_NOTES", "main", "render_markdown"]

TABLE_NOTES: Final[dict[str, str]] = {
    "migrations": "Schema steps applied to this file, one row per migration (append-only).",
    "runs": "One row per named run; rerunning a name resumes it.",
    "calls": (
        "One row per attempt of a chat call: retries, length re-asks and call-cache hits included; on a local "
        "backbone, one row per forward pass (stage `forward`, or `forward/reference` and `forward/validation` "
        "while SOAP prepares; no completion, no USD; the arrays in `<db>.forward-cache/`)."
    ),
    "blobs": "Prompts, raw responses and answer texts, stored once by content hash, zlib-compressed.",
    "predictions": "A method's final answer per work item; a rerun replaces it (upsert), never duplicates.",
    "items": "Where each work item stands, for resume and the report; upserted.",
    "trajectories": "Reference facts of each trajectory a run used, so the file is self-contained.",
    "run_events": "Notable events (a backbone paused by a 429, a budget stop, a data problem, a resume).",
    "run_leases": "Which process sweeps a run now: one sweep per run, taken over once its heartbeat is stale.",
}

_WORK_ITEM_NOTES: Final[dict[str, str]] = {
    "run_id": "runs.run_id",
    "item_id": "the runner's id of the work item, e.g. `backbone|method|qid|r0`",
    "backbone": "configured backbone name",
    "method": "attribution method name",
    "qid": "trajectory id",
    "realization": "0-based repeat index of the same (backbone, method, qid)",
}

COLUMN_NOTES: Final[dict[str, dict[str, str]]] = {
    "migrations": {
        "version": "migration number, 1, 2, ... without gaps",
        "name": "what the migration does",
        "applied_at": "ISO-8601 UTC, milliseconds",
    },
    "runs": {
        "run_id": "assigned on creation",
        "name": "the user's name for the run (`--run`)",
        "created_at": "ISO-8601 UTC, milliseconds",
        "updated_at": "ISO-8601 UTC, milliseconds; last status change or resume",
        "config_json": "the sweep config as resolved for the latest (re)start; never contains secrets",
        "status": "running | finished | stopped | failed",
    },
    "calls": {
        "call_id": "assigned by the writer in enqueue order",
        **_WORK_ITEM_NOTES,
        "model": "model name the provider reported (or the configured one)",
        "stage": "the call's role in the method (`attribution`, `summary`, ..., `forward` for a forward pass)",
        "attempt": "1-based attempt number within one `llm.chat` call; `attempt = 1` counts calls",
        "max_tokens": "output budget of this attempt, tokens",
        "status": "ok | length | rate_limited | error | cached | cancelled",
        "finish_reason": "as reported (`stop`, `length`, ...)",
        "prompt_tokens": "tokens; includes `cached_tokens`; a forward pass: the tokens it held, template included",
        "completion_tokens": "tokens; includes `reasoning_tokens`",
        "reasoning_tokens": "tokens",
        "cached_tokens": "prompt tokens served from the provider's prompt cache",
        "cost_usd": "US dollars charged for this attempt",
        "latency_ms": "wall time of the attempt, milliseconds",
        "error": "error message (never contains secrets)",
        "error_kind": "stable error label (`rate_limited`, `server_error`, ...)",
        "http_status": "HTTP status, when there was a response",
        "cache_key": "the runner's call-cache key; `Store.lookup_call` searches it; `forward:<sha256>` names a "
        "forward pass's file in the forward cache",
        "request_sha256": "blob: canonical request JSON (a forward pass: the model and its segments)",
        "response_sha256": "blob: raw response body (a forward pass: a JSON summary, token counts and shapes)",
        "response_text_sha256": "blob: the answer's content (UTF-8), what a cache hit replays",
        "reasoning_text_sha256": "blob: the thinking text (UTF-8), when returned",
        "endpoint": "replica or base URL that served the attempt",
        "usage_source": "`reported` (the provider's counts) or `estimated` (no usage, or usage no bill can be)",
        "started_at": "ISO-8601 UTC, milliseconds",
        "ended_at": "ISO-8601 UTC, milliseconds",
    },
    "blobs": {
        "sha256": "hex SHA-256 of the uncompressed bytes",
        "zlib_data": "the bytes, zlib-compressed (level 1 since issue 17, level 6 before; any level reads the same)",
        "size": "uncompressed length, bytes",
    },
    "predictions": {
        **_WORK_ITEM_NOTES,
        "pred_role": "predicted root-cause role, when given",
        "pred_step": "predicted root-cause step index (0-based), when given",
        "role_valid": "1 if `pred_role` is a role of the trajectory",
        "step_valid": "1 if `pred_step` is a step of the trajectory",
        "abstained": "1 if the method declined to answer",
        "output_json": "the method's full output",
        "error": "why the model's answer could not be used (unreadable, not the requested JSON), when it could not",
        "created_at": "ISO-8601 UTC, milliseconds",
        "fallback": "the published rule that decided the prediction instead of the model, when one did",
    },
    "items": {
        **_WORK_ITEM_NOTES,
        "status": "done | failed | skipped_budget | interrupted",
        "error": "why the item failed, when it did",
        "attempts": "how many times the item was started",
        "updated_at": "ISO-8601 UTC, milliseconds",
    },
    "trajectories": {
        "run_id": "runs.run_id",
        "qid": "trajectory id",
        "source": "dataset or subset the trajectory comes from",
        "n_steps": "number of steps",
        "roles_json": "JSON list of each step's normalised role",
        "ref_role": "reference root-cause role",
        "ref_step": "reference root-cause step index (0-based)",
        "sha256": "hash of the source record",
    },
    "run_events": {
        "event_id": "assigned in insertion order",
        "run_id": "runs.run_id",
        "at": "ISO-8601 UTC, milliseconds",
        "kind": (
            "short stable label: `resumed`, `data_problem`, `backbone_paused`, `backbone_stopped`, `budget_stop`, "
            "`usage_estimated`, `row_repaired`, `row_rejected`, `method_prepared` (a model-reading method's "
            "preparation for one backbone and realization: `backbone`, `method`, `realization`, `items` = the ids "
            "it answers, which the report scores it on; SOAP adds `seed`, `model` and per source its `split`, "
            "chosen `config`, `selection` tables and reference size), `method_prepare_failed`"
        ),
        "detail_json": "JSON object with the particulars",
    },
    "run_leases": {
        "run_id": "runs.run_id",
        "holder": "random id of the sweep process session holding the run",
        "pid": "its process id",
        "host": "its host name",
        "pid_scope": "boot id and PID namespace: where `pid` names the same process",
        "started_at": "ISO-8601 UTC, milliseconds; when it claimed the run",
        "heartbeat_at": "ISO-8601 UTC, milliseconds; its last heartbeat",
        "heartbeat_unix": "the same heartbeat, seconds since the epoch, for staleness",
    },
}


def _tables(connection: sqlite3.Connection) -> list[str]:
    rows = connection.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
    ).fetchall()
    return [str(row[0]) for row in rows]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _column_lines(connection: sqlite3.Connection, table: str) -> list[str]:
    lines = ["| column | type | constraints | meaning |", "| --- | --- | --- | --- |"]
    notes = COLUMN_NOTES.get(table, {})
    for column in connection.execute(f"PRAGMA table_info({table})").fetchall():
        constraints = []
        if column["pk"]:
            constraints.append("PRIMARY KEY")
        if column["notnull"]:
            constraints.append("NOT NULL")
        if column["dflt_value"] is not None:
            constraints.append(f"DEFAULT {column['dflt_value']}")
        lines.append(
            f"| `{column['name']}` | {column['type']} | {_cell(' '.join(constraints))} "
            f"| {_cell(notes.get(column['name'], ''))} |"
        )
    return lines


def _index_lines(connection: sqlite3.Connection, table: str) -> list[str]:
    lines = []
    indexes = connection.execute(f"PRAGMA index_list({table})").fetchall()
    for index in sorted(indexes, key=lambda index: str(index["name"])):
        columns = [str(info["name"]) for info in connection.execute(f"PRAGMA index_info({index['name']})")]
        kind = "unique" if index["unique"] else "index"
        # Automatic indexes (from UNIQUE / PRIMARY KEY clauses) have generated names; name the kind instead.
        label = "" if index["origin"] in ("u", "pk") else f" `{index['name']}`"
        lines.append(f"- {kind}{label} on ({', '.join(columns)})")
    return lines


def render_markdown(connection: sqlite3.Connection | None = None) -> str:
    """The schema of a migrated results.db as Markdown (a blank in-memory one when no connection is given)."""
    own = connection is None
    live = open_connection(":memory:") if connection is None else connection
    try:
        lines = [
            "# results.db schema",
            "",
            "<!-- Generated by `python -m rcarun.store.schema --markdown`; do not edit by hand. -->",
            "",
            f"Schema version {MIGRATIONS[-1].version}. Timestamps are ISO-8601 UTC text with milliseconds; "
            "booleans are 0/1 integers. Foreign keys are declared for documentation but not enforced.",
            "",
        ]
        for table in _tables(live):
            lines += [f"## `{table}`", "", TABLE_NOTES.get(table, ""), "", *_column_lines(live, table), ""]
            indexes = _index_lines(live, table)
            if indexes:
                lines += ["Indexes:", "", *indexes, ""]
        return "\n".join(lines)
    finally:
        if own:
            live.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rcarun.store.schema", description=__doc__)
    parser.add_argument("--markdown", action="store_true", help="print the schema as Markdown")
    arguments = parser.parse_args(argv)
    if not arguments.markdown:
        parser.print_help()
        return 2
    sys.stdout.write(render_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
