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
from dataclasses import dataclass
from typing import Final

from rcarun.store.connect import open_connection
from rcarun.store.migrations import MIGRATIONS

__all__ = [
    "COLUMN_NOTES",
    "RECIPES",
    "TABLE_NOTES",
    "VIEW_COLUMN_NOTES",
    "VIEW_NOTES",
    "Recipe",
    "main",
    "render_markdown",
    "view_column_note",
]

TABLE_NOTES: Final[dict[str, str]] = {
    "migrations": "Schema steps applied to this file, one row per migration (append-only).",
    "runs": "One row per named run; rerunning a name resumes it.",
    "calls": (
        "One row per attempt of a chat call: retries, length re-asks and call-cache hits included; on a local "
        "backbone, one row per forward pass (stage `forward`, or `forward/reference` and `forward/validation` "
        "while SOAP prepares; no completion, no USD; the arrays in `<db>.forward-cache/`)."
    ),
    "blobs": (
        "Prompts, raw responses and answer texts, stored once by content hash: UTF-8 text up to 64 KiB as "
        "`text` that SQLite (datasette, sqlite-utils) reads as is, anything larger or binary zlib-compressed "
        "(every blob before migration 4); sizes below, at *Blob storage*."
    ),
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
        "cost_usd": "US dollars charged for this attempt; a cut generation (silence timeout, disconnect, size "
        "cap, call deadline: status `error`, `cancelled` on Ctrl-C): charged an estimate of what it generated",
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
        "usage_source": "`reported` (the provider's counts) or `estimated` (no usage, or usage no bill can be; "
        "a cut generation: charged an estimate, its partial answer's body in `response_sha256`)",
        "streamed": "1: the answer came as a server-sent-event stream, 0: as one body; NULL when no answer came "
        "over HTTP (a cache hit, a forward pass, a refusal before any answer)",
        "ttft_ms": "time to first token: milliseconds from sending the request to the first chunk carrying "
        "answer, thinking or tool-call text; NULL when unknown (unstreamed, or nothing arrived)",
        "decode_tokens_per_s": "decode rate: completion tokens after the first over the seconds from the first "
        "token to the last; NULL when unknown (fewer than 2 tokens, unstreamed)",
        "started_at": "ISO-8601 UTC, milliseconds",
        "ended_at": "ISO-8601 UTC, milliseconds",
    },
    "blobs": {
        "sha256": "hex SHA-256 of the bytes",
        "zlib_data": "the bytes, zlib-compressed, when `text` is NULL (level 1 since issue 17, level 6 before; "
        "any level reads the same); empty when `text` holds them",
        "size": "length of the bytes (uncompressed), bytes",
        "text": "the bytes as text, when they are UTF-8 without NUL and at most 64 KiB (rows since migration 4); "
        "NULL otherwise",
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
        "task_sha256": "hex SHA-256 of the task instruction the methods see (`Trajectory.task`, whitespace runs as "
        "one space): trajectories sharing it are repeated attempts at one task, kept together by the report's "
        "task-cluster bootstrap; NULL without a task or before schema 6",
    },
    "run_events": {
        "event_id": "assigned in insertion order",
        "run_id": "runs.run_id",
        "at": "ISO-8601 UTC, milliseconds",
        "kind": (
            "short stable label: `resumed`, `data_problem`, `backbone_paused`, `backbone_stopped`, `budget_stop`, "
            "`rate_learned` / `rate_raised` / `rate_released` (the request rate learned from bare refusals: `rpm` "
            "held, None once released; `accepted` and `refused` in the last window), "
            "`usage_estimated`, `row_repaired`, `row_rejected`, `method_prepared` (a model-reading method's "
            "preparation for one backbone and realization: `backbone`, `method`, `realization`, `items` = the ids "
            "it answers, which the report scores it on; SOAP adds `seed`, `model` and per source its `split`, "
            "chosen `config`, `selection` tables and reference size), `method_prepare_failed`, "
            "`spill_taken_up` (rows a full disk had left in a spill file, stored: `spill_id`, `file`, `rows`, "
            "`answered`), `writes_paused` (admission paused while results.db refused writes: `seconds`), "
            "`items_left` (an item left for a resume by a refused key, quota or model before the "
            "backbone stopped), `generation_cut`, `stream_refused`, `interrupted`, and the managed replicas' "
            "`replicas_started`, `replica_died`, `replica_restarted`, `replica_restart_failed`, `replica_lost`, "
            "`replicas_stopped`, "
            "`stale_replica_ended`"
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


_CALLS = "`calls`, the same column"

VIEW_NOTES: Final[dict[str, str]] = {
    "calls_text": (
        "Every call with its prompt, answer and thinking text as plain text, for datasette, sqlite-utils or the "
        "`sqlite3` shell. Text stored compressed (a blob over 64 KiB, or any blob written before migration 4) "
        "reads as NULL here, and `text_compressed` says so: `rcarun show --call ID` reads it."
    ),
    "predictions_scored": (
        "Every prediction beside its trajectory's reference, with correctness as SQL can judge it: exact step "
        "and ±5 steps on valid steps, and the role matched after trimming, dropping one trailing `(-> X)` / "
        "`(→ X)` handoff suffix and lower-casing ASCII letters. Not applied here (`rcarun report` applies "
        "them): NFKC and Unicode case folding of roles, collapsing inner whitespace, the ablation protocol's "
        "kept handoff suffixes and abstentions-as-errors rule, and the missing predictions, which the report "
        "scores as errors."
    ),
    "run_summary": "One row per run: trajectories, items by status, predictions, calls, tokens and USD.",
}

VIEW_COLUMN_NOTES: Final[dict[str, dict[str, str]]] = {
    "calls_text": {
        "run": "`runs.name`",
        "prompt": "the request's messages as `role: content`, blank-line separated (a forward pass: its "
        "segments; a request that is not JSON: as stored)",
        "answer": "the answer text: its own blob, else `choices[0].message.content` of the raw body",
        "reasoning": "the thinking text: its own blob, else `reasoning_content` or `reasoning` of the raw body",
        "request_json": "the canonical request JSON as stored",
        "response_body": "the raw response body as received",
        "text_compressed": "1 when a blob of this call is stored compressed, so a text column above is NULL",
    },
    "predictions_scored": {
        "run": "`runs.name`",
        "source": "`trajectories.source`",
        "n_steps": "`trajectories.n_steps`",
        "ref_role": "`trajectories.ref_role` (NULL: unlabelled, or the trajectory row is missing)",
        "ref_step": "`trajectories.ref_step`",
        "reason": "the reason the method's output states (`reason`, `rationale`, `explanation` or `reasoning`, "
        "at its top level, in `answer` or in `diagnostics`), as the trajectory viewer shows it",
        "role_correct": "1 / 0; NULL without a reference role",
        "step_exact": "1 when the step is valid and equals the reference step; NULL without one",
        "step_pm5": "1 when the step is valid and within 5 of the reference step; NULL without one",
        "joint_exact": "role and exact step both right; NULL without a reference",
    },
    "run_summary": {
        "run": "`runs.name`",
        "trajectories": "trajectory rows of the run",
        "backbones": "distinct backbones of its items",
        "methods": "distinct methods (labels) of its items",
        "items": "item rows",
        "items_done": "items with status `done`",
        "items_failed": "items with status `failed`",
        "items_skipped_budget": "items with status `skipped_budget`",
        "items_interrupted": "items with status `interrupted`",
        "predictions": "prediction rows",
        "role_correct": "predictions with the role right (`predictions_scored`)",
        "step_exact": "predictions with the exact step (`predictions_scored`)",
        "calls": "logical calls (`attempt = 1`)",
        "attempts": "call rows",
        "cached_calls": "rows served by the call cache",
        "errors": "rows with status `error`",
        "rate_limited": "rows with status `rate_limited`",
        "prompt_tokens": "tokens sent to a provider (cache hits not counted)",
        "completion_tokens": "tokens received from a provider (cache hits not counted)",
        "cost_usd": "US dollars charged (cache hits not counted)",
        "first_call_at": "the first call's `started_at`",
        "last_call_at": "the last call's `ended_at`",
    },
}


@dataclass(frozen=True, slots=True)
class Recipe:
    """A query worth copying into datasette's SQL box or `sqlite3`; `:name` marks a parameter."""

    title: str
    sql: str


RECIPES: Final[tuple[Recipe, ...]] = (
    Recipe(
        "Paired cross-backbone comparison: on the trajectories both backbones answered, how often each was "
        "right where the other was not (joint exact; the discordant pairs are McNemar's)",
        """SELECT a.method,
       count(*) AS pairs,
       sum(a.joint_exact AND b.joint_exact) AS both_right,
       sum(a.joint_exact AND NOT b.joint_exact) AS only_a,
       sum(NOT a.joint_exact AND b.joint_exact) AS only_b,
       sum(NOT a.joint_exact AND NOT b.joint_exact) AS both_wrong
FROM predictions_scored AS a
JOIN predictions_scored AS b USING (run_id, method, qid, realization)
WHERE a.run = :run AND a.backbone = :a AND b.backbone = :b AND a.realization = 0
GROUP BY a.method
ORDER BY a.method""",
    ),
    Recipe(
        "Cost per stage: calls, tokens and USD of each backbone, method and stage (cache hits cost nothing)",
        """SELECT backbone, method, stage,
       sum(attempt = 1) AS calls,
       count(*) AS attempts,
       sum(CASE WHEN status = 'cached' THEN 0 ELSE prompt_tokens END) AS prompt_tokens,
       sum(CASE WHEN status = 'cached' THEN 0 ELSE completion_tokens END) AS completion_tokens,
       round(sum(CASE WHEN status = 'cached' THEN 0 ELSE cost_usd END), 4) AS usd
FROM calls
WHERE run_id = (SELECT run_id FROM runs WHERE name = :run)
GROUP BY backbone, method, stage
ORDER BY usd DESC""",
    ),
    Recipe(
        "All calls of one item, in order, with the start of each prompt and the answer (calls a method made on "
        "another backbone, as the judge panel's, keep the item's id)",
        """SELECT call_id, backbone, stage, attempt, status, prompt_tokens, completion_tokens, cost_usd, latency_ms,
       substr(prompt, 1, 300) AS prompt_start, answer
FROM calls_text
WHERE run = :run AND item_id = (
    SELECT item_id FROM items JOIN runs USING (run_id)
    WHERE name = :run AND backbone = :backbone AND method = :method AND qid = :qid AND realization = 0
)
ORDER BY call_id""",
    ),
    Recipe(
        "Accuracy of each backbone and method over the predictions made (the report's denominators also count "
        "the trajectories without a prediction)",
        """SELECT backbone, method, count(*) AS predictions,
       round(avg(role_correct), 3) AS agent_acc,
       round(avg(step_exact), 3) AS step_acc,
       round(avg(joint_exact), 3) AS joint_acc
FROM predictions_scored
WHERE run = :run AND realization = 0
GROUP BY backbone, method
ORDER BY backbone, method""",
    ),
)

_READING = """\
## Reading results.db

Open the file with `datasette results.db` or `sqlite-utils`: the views above show prompts and answers as text.
`rcarun db fts [--db F]` builds a full-text index over every answer, thinking text and prediction reason, in
the table `search_texts` (`kind` is `answer`, `reasoning` or `reason`; `run`, `backbone`, `method`, `qid`,
`realization`, `call_id` say whose; `text`), with sqlite-utils' `enable_fts` (FTS5, porter stemming): datasette
shows a search box on it, and `sqlite-utils search results.db search_texts "timeout"` or
`db["search_texts"].search("timeout")` query it. The index is a snapshot: run the command again after a sweep
adds rows. `rcarun show --run R --qid Q` prints one item, or one call, with its texts whatever their storage.
"""

_STORAGE = """\
## Blob storage

How a blob is kept was chosen by measured size (`benchmarks/blob_storage.py`, which stores one sweep's blobs
in each form, VACUUMs and weighs the file). Demo: `rcarun sweep` (10 trajectories, 15 methods, 5 backbones, 2
realizations; 6,175 calls, 6,761 blobs, 44.5 MB of blob bytes, prompts 13 KB on average). Mini-sized: 200
trajectories with the official LongRCA-Mini list's sources, ids and byte sizes (median 159 KB; step texts from
the bundled Who&When files), all-at-once on one simulated backbone with a 131,072-token window (200 calls,
400 blobs, 42.2 MB of blob bytes, prompts 210 KB on average).

| storage of blobs | demo file, MB | demo blobs readable | Mini-sized file, MB | Mini-sized blobs readable |
| --- | ---: | ---: | ---: | ---: |
| all zlib (before migration 4) | 23.7 | 0 % | 12.5 | 0 % |
| text up to 4 KiB, zlib above | 28.7 | 47 % | 12.5 | 50 % |
| text up to 16 KiB, zlib above | 46.2 | 90 % | 12.6 | 50 % |
| **text up to 64 KiB, zlib above (chosen)** | **57.3** | **100 %** | **13.5** | **60 %** |
| text up to 256 KiB, zlib above | 58.0 | 100 % | 25.5 | 86 % |
| text up to 4 KiB beside zlib of every blob | 31.3 | 47 % | 12.6 | 50 % |
| text up to 64 KiB beside zlib of every blob | 70.4 | 100 % | 14.0 | 60 % |
| all text | 58.0 | 100 % | 42.8 | 100 % |

A compressed copy beside the text only adds bytes (text is never smaller compressed *and* readable), so a blob
is kept one way. Up to 64 KiB every answer and all but the longest trajectory's prompts of the demo read in SQL
(27 of 6,979 blobs, prompts of 66–73 KB, stay compressed: "100 %" above is rounded), and a long-trajectory
run pays 8 %: its answers and raw responses are small, and its prompts above 64 KiB stay compressed (`rcarun
show` reads them). Measured on real sweeps written by each writer (the file after a checkpoint): the demo 23.9 MB
before, 59.9 MB after (6,952 of 6,979 blobs as text); the Mini-sized run 12.5 MB before, 13.5 MB after (238 of
400 blobs as text: every answer and the prompts up to 64 KiB).

The writer's CPU per call falls with it, since text is not compressed: `benchmarks/per_call_parts.py` times one
blob turned into its row at 8.2 → 1.1 us for a bench request body, 160 → 32 us for a bundled Who&When file
(22 KB) and 467 → 443 us for a 100-KB prompt (still compressed); the writer thread's CPU over 3,000 calls with
demo-shaped blobs (a 17-KB request and a 2-KB raw response each) fell from 205 to 105–108 us a call.
"""


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


def _views(connection: sqlite3.Connection) -> list[str]:
    """The views in the order `VIEW_NOTES` names them (a view a migration recreated moves to the end of
    ``sqlite_master``), any other after them in creation order."""
    rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'view' ORDER BY rowid").fetchall()
    order = list(VIEW_NOTES)
    names = [str(row[0]) for row in rows]
    return sorted(names, key=lambda name: order.index(name) if name in order else len(order))


def view_column_note(view: str, column: str) -> str:
    """What a view's column means: its own note, else the `calls`, `predictions` or `runs` column it passes on."""
    note = VIEW_COLUMN_NOTES.get(view, {}).get(column)
    if note:
        return note
    source = {"calls_text": "calls", "predictions_scored": "predictions", "run_summary": "runs"}.get(view, "")
    return f"`{source}.{column}`" if column in COLUMN_NOTES.get(source, {}) else ""


def _view_column_lines(connection: sqlite3.Connection, view: str) -> list[str]:
    lines = ["| column | meaning |", "| --- | --- |"]
    for column in connection.execute(f"PRAGMA table_info({view})").fetchall():
        lines.append(f"| `{column['name']}` | {_cell(view_column_note(view, str(column['name'])))} |")
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
        lines += ["# Views", ""]
        for view in _views(live):
            lines += [f"## `{view}`", "", VIEW_NOTES.get(view, ""), "", *_view_column_lines(live, view), ""]
        lines += [_READING, _STORAGE, "## SQL recipes", ""]
        for recipe in RECIPES:
            lines += [f"{recipe.title}:", "", "```sql", recipe.sql + ";", "```", ""]
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
