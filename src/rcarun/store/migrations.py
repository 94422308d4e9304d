"""results.db's schema as an append-only list of numbered migrations.

A results.db outlives the code that wrote it, so the schema only grows by appending a migration here; an applied
migration is never edited. `apply_migrations` runs what is missing and records each step in ``migrations``.
Opening the file is `rcarun.store.connect`.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Final

from rcarun.errors import StoreError
from rcarun.store.rows import utc_timestamp

__all__ = ["MIGRATIONS", "Migration", "applied_version", "apply_migrations"]


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema step: its number (1, 2, ... with no gaps), a short name and the statements it runs."""

    version: int
    name: str
    statements: tuple[str, ...]


_CALL_STATUS_CHECK = "status IN ('ok', 'length', 'rate_limited', 'error', 'cached', 'cancelled')"
_ITEM_STATUS_CHECK = "status IN ('done', 'failed', 'skipped_budget', 'interrupted')"
_RUN_STATUS_CHECK = "status IN ('running', 'finished', 'stopped', 'failed')"


# -- migration 4: readable text and the views over it ---------------------------------------------------------
# Built once from these constants; like any applied migration, never edited (a later change is a new migration).

_WS = "char(32, 9, 10, 13)"  # what Python's str.strip() removes in practice: space, tab, newline, return


def _normal_role(column: str) -> str:
    """SQL for the scorer's role normal form as far as SQLite can go: trimmed, one trailing ``(-> X)`` or
    ``(→ X)`` handoff suffix dropped, ASCII letters lower-cased (no NFKC, no Unicode casefold, inner
    whitespace not collapsed)."""
    trimmed = f"trim({column}, {_WS})"
    branches = " ".join(
        f"WHEN {trimmed} LIKE '%)' AND instr({trimmed}, '({arrow}') > 0 "
        f"THEN trim(substr({trimmed}, 1, instr({trimmed}, '({arrow}') - 1), {_WS})"
        for arrow in ("->", "→")
    )
    return f"lower(CASE {branches} ELSE {trimmed} END)"


def _stated_reason(column: str) -> str:
    """SQL for the reason a prediction's output states, where `rcarun.analysis.viewer` looks for it: the first
    non-blank string under ``reason``, ``rationale``, ``explanation`` or ``reasoning``, at the top level, then in
    ``answer``, then in ``diagnostics``."""
    paths = [
        f"$.{place}{key}"
        for place in ("", "answer.", "diagnostics.")
        for key in ("reason", "rationale", "explanation", "reasoning")
    ]
    picks = ", ".join(
        f"CASE WHEN json_type({column}, '{path}') = 'text' THEN nullif(trim(json_extract({column}, '{path}'), "
        f"{_WS}), '') END"
        for path in paths
    )
    return f"CASE WHEN json_valid({column}) THEN coalesce({picks}) END"


def _json_text(body: str, *paths: str) -> str:
    picks = [f"json_extract({body}, '{path}')" for path in paths]
    found = picks[0] if len(picks) == 1 else f"coalesce({', '.join(picks)})"
    return f"CASE WHEN json_valid({body}) THEN {found} END"


_CALLS_TEXT_VIEW = f"""
CREATE VIEW calls_text AS
SELECT c.call_id, r.name AS run, c.run_id, c.item_id, c.backbone, c.model, c.method, c.qid, c.realization,
       c.stage, c.attempt, c.status, c.finish_reason, c.prompt_tokens, c.completion_tokens, c.reasoning_tokens,
       c.cached_tokens, c.cost_usd, c.latency_ms, c.error, c.error_kind, c.http_status, c.started_at, c.ended_at,
       CASE WHEN json_valid(rq.text) THEN coalesce(
           (SELECT group_concat(coalesce(json_extract(m.value, '$.role'), '?') || ': '
                                || coalesce(json_extract(m.value, '$.content'), ''), char(10) || char(10))
            FROM json_each(rq.text, '$.messages') AS m),
           (SELECT group_concat(s.value, char(10) || char(10)) FROM json_each(rq.text, '$.segments') AS s)
       ) ELSE rq.text END AS prompt,
       coalesce(answer.text, {_json_text("rs.text", "$.choices[0].message.content")}) AS answer,
       coalesce(
           thinking.text,
           {_json_text("rs.text", "$.choices[0].message.reasoning_content", "$.choices[0].message.reasoning")}
       ) AS reasoning,
       rq.text AS request_json,
       rs.text AS response_body,
       (c.request_sha256 IS NOT NULL AND rq.text IS NULL)
           OR (c.response_sha256 IS NOT NULL AND rs.text IS NULL)
           OR (c.response_text_sha256 IS NOT NULL AND answer.text IS NULL)
           OR (c.reasoning_text_sha256 IS NOT NULL AND thinking.text IS NULL) AS text_compressed
FROM calls AS c
LEFT JOIN runs AS r ON r.run_id = c.run_id
LEFT JOIN blobs AS rq ON rq.sha256 = c.request_sha256
LEFT JOIN blobs AS rs ON rs.sha256 = c.response_sha256
LEFT JOIN blobs AS answer ON answer.sha256 = c.response_text_sha256
LEFT JOIN blobs AS thinking ON thinking.sha256 = c.reasoning_text_sha256
"""

_PREDICTIONS_SCORED_VIEW = f"""
CREATE VIEW predictions_scored AS
SELECT run_id, run, item_id, backbone, method, qid, realization, source, n_steps, pred_role, pred_step,
       ref_role, ref_step, role_valid, step_valid, abstained, fallback, error, reason,
       CASE WHEN ref_role IS NULL THEN NULL
            ELSE coalesce(pred_normal <> '' AND pred_normal = ref_normal, 0) END AS role_correct,
       CASE WHEN ref_step IS NULL THEN NULL
            ELSE coalesce(step_valid = 1 AND pred_step = ref_step, 0) END AS step_exact,
       CASE WHEN ref_step IS NULL THEN NULL
            ELSE coalesce(step_valid = 1 AND abs(pred_step - ref_step) <= 5, 0) END AS step_pm5,
       CASE WHEN ref_role IS NULL OR ref_step IS NULL THEN NULL
            ELSE coalesce(pred_normal <> '' AND pred_normal = ref_normal AND step_valid = 1
                          AND pred_step = ref_step, 0) END AS joint_exact,
       output_json
FROM (
    SELECT p.run_id, r.name AS run, p.item_id, p.backbone, p.method, p.qid, p.realization, t.source, t.n_steps,
           p.pred_role, p.pred_step, t.ref_role, t.ref_step, p.role_valid, p.step_valid, p.abstained, p.fallback,
           p.error, {_stated_reason("p.output_json")} AS reason,
           {_normal_role("p.pred_role")} AS pred_normal, {_normal_role("t.ref_role")} AS ref_normal,
           p.output_json
    FROM predictions AS p
    LEFT JOIN runs AS r ON r.run_id = p.run_id
    LEFT JOIN trajectories AS t ON t.run_id = p.run_id AND t.qid = p.qid
)
"""

_RUN_SUMMARY_VIEW = """
CREATE VIEW run_summary AS
SELECT r.run_id, r.name AS run, r.status, r.created_at, r.updated_at,
       coalesce(t.trajectories, 0) AS trajectories,
       coalesce(i.backbones, 0) AS backbones, coalesce(i.methods, 0) AS methods,
       coalesce(i.items, 0) AS items, coalesce(i.done, 0) AS items_done, coalesce(i.failed, 0) AS items_failed,
       coalesce(i.skipped_budget, 0) AS items_skipped_budget, coalesce(i.interrupted, 0) AS items_interrupted,
       coalesce(p.predictions, 0) AS predictions, coalesce(p.role_correct, 0) AS role_correct,
       coalesce(p.step_exact, 0) AS step_exact,
       coalesce(c.calls, 0) AS calls, coalesce(c.attempts, 0) AS attempts, coalesce(c.cached, 0) AS cached_calls,
       coalesce(c.errors, 0) AS errors, coalesce(c.rate_limited, 0) AS rate_limited,
       coalesce(c.prompt_tokens, 0) AS prompt_tokens, coalesce(c.completion_tokens, 0) AS completion_tokens,
       coalesce(c.cost_usd, 0) AS cost_usd, c.first_call_at, c.last_call_at
FROM runs AS r
LEFT JOIN (SELECT run_id, count(*) AS trajectories FROM trajectories GROUP BY run_id) AS t
    ON t.run_id = r.run_id
LEFT JOIN (
    SELECT run_id, count(DISTINCT backbone) AS backbones, count(DISTINCT method) AS methods, count(*) AS items,
           sum(status = 'done') AS done, sum(status = 'failed') AS failed,
           sum(status = 'skipped_budget') AS skipped_budget, sum(status = 'interrupted') AS interrupted
    FROM items GROUP BY run_id
) AS i ON i.run_id = r.run_id
LEFT JOIN (
    SELECT run_id, count(*) AS predictions, sum(role_correct) AS role_correct, sum(step_exact) AS step_exact
    FROM predictions_scored GROUP BY run_id
) AS p ON p.run_id = r.run_id
LEFT JOIN (
    SELECT run_id, sum(attempt = 1) AS calls, count(*) AS attempts, sum(status = 'cached') AS cached,
           sum(status = 'error') AS errors, sum(status = 'rate_limited') AS rate_limited,
           sum(CASE WHEN status = 'cached' THEN 0 ELSE prompt_tokens END) AS prompt_tokens,
           sum(CASE WHEN status = 'cached' THEN 0 ELSE completion_tokens END) AS completion_tokens,
           sum(CASE WHEN status = 'cached' THEN 0 ELSE cost_usd END) AS cost_usd,
           min(started_at) AS first_call_at, max(coalesce(ended_at, started_at)) AS last_call_at
    FROM calls GROUP BY run_id
) AS c ON c.run_id = r.run_id
"""

# -- migration 5: how each answer came over HTTP, and calls_text with it --------------------------------------
# The view of migration 4 with the three columns beside latency_ms; migration 5 drops that view and creates this.

_CALLS_TEXT_TIMING = "c.latency_ms, c.streamed, c.ttft_ms, c.decode_tokens_per_s,"
_CALLS_TEXT_VIEW_5 = _CALLS_TEXT_VIEW.replace("c.latency_ms,", _CALLS_TEXT_TIMING, 1)

MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(
        version=1,
        name="initial schema",
        statements=(
            f"""
            CREATE TABLE runs (
                run_id INTEGER PRIMARY KEY,
                name TEXT NOT NULL UNIQUE,
                created_at TEXT NOT NULL,
                updated_at TEXT NOT NULL,
                config_json TEXT NOT NULL DEFAULT '{{}}',
                status TEXT NOT NULL DEFAULT 'running' CHECK ({_RUN_STATUS_CHECK})
            )
            """,
            f"""
            CREATE TABLE calls (
                call_id INTEGER PRIMARY KEY,
                run_id INTEGER NOT NULL REFERENCES runs (run_id),
                item_id TEXT NOT NULL,
                backbone TEXT NOT NULL,
                model TEXT NOT NULL,
                method TEXT NOT NULL,
                qid TEXT NOT NULL,
                realization INTEGER NOT NULL CHECK (realization >= 0),
                stage TEXT NOT NULL,
                attempt INTEGER NOT NULL CHECK (attempt >= 1),
                max_tokens INTEGER,
                status TEXT NOT NULL CHECK ({_CALL_STATUS_CHECK}),
                finish_reason TEXT,
                prompt_tokens INTEGER NOT NULL DEFAULT 0,
                completion_tokens INTEGER NOT NULL DEFAULT 0,
                reasoning_tokens INTEGER NOT NULL DEFAULT 0,
                cached_tokens INTEGER NOT NULL DEFAULT 0,
                cost_usd REAL NOT NULL DEFAULT 0,
                latency_ms REAL,
                error TEXT,
                error_kind TEXT,
                http_status INTEGER,
                cache_key TEXT,
                request_sha256 TEXT,
                response_sha256 TEXT,
                response_text_sha256 TEXT,
                reasoning_text_sha256 TEXT,
                endpoint TEXT,
                started_at TEXT NOT NULL,
                ended_at TEXT
            )
            """,
            "CREATE INDEX calls_cache_key ON calls (cache_key)",
            "CREATE INDEX calls_run_backbone ON calls (run_id, backbone)",
            "CREATE INDEX calls_run_item ON calls (run_id, item_id)",
            """
            CREATE TABLE blobs (
                sha256 TEXT PRIMARY KEY,
                zlib_data BLOB NOT NULL,
                size INTEGER NOT NULL
            )
            """,
            """
            CREATE TABLE predictions (
                run_id INTEGER NOT NULL REFERENCES runs (run_id),
                item_id TEXT NOT NULL,
                backbone TEXT NOT NULL,
                method TEXT NOT NULL,
                qid TEXT NOT NULL,
                realization INTEGER NOT NULL,
                pred_role TEXT,
                pred_step INTEGER,
                role_valid INTEGER NOT NULL CHECK (role_valid IN (0, 1)),
                step_valid INTEGER NOT NULL CHECK (step_valid IN (0, 1)),
                abstained INTEGER NOT NULL CHECK (abstained IN (0, 1)),
                output_json TEXT,
                error TEXT,
                created_at TEXT NOT NULL,
                UNIQUE (run_id, backbone, method, qid, realization)
            )
            """,
            f"""
            CREATE TABLE items (
                run_id INTEGER NOT NULL REFERENCES runs (run_id),
                item_id TEXT NOT NULL,
                backbone TEXT NOT NULL,
                method TEXT NOT NULL,
                qid TEXT NOT NULL,
                realization INTEGER NOT NULL,
                status TEXT NOT NULL CHECK ({_ITEM_STATUS_CHECK}),
                error TEXT,
                attempts INTEGER NOT NULL DEFAULT 0,
                updated_at TEXT NOT NULL,
                UNIQUE (run_id, backbone, method, qid, realization)
            )
            """,
            """
            CREATE TABLE trajectories (
                run_id INTEGER NOT NULL REFERENCES runs (run_id),
                qid TEXT NOT NULL,
                source TEXT NOT NULL,
                n_steps INTEGER NOT NULL,
                roles_json TEXT NOT NULL,
                ref_role TEXT,
                ref_step INTEGER,
                sha256 TEXT NOT NULL,
                UNIQUE (run_id, qid)
            )
            """,
            """
            CREATE TABLE run_events (
                event_id INTEGER PRIMARY KEY,
                run_id INTEGER NOT NULL REFERENCES runs (run_id),
                at TEXT NOT NULL,
                kind TEXT NOT NULL,
                detail_json TEXT NOT NULL DEFAULT '{}'
            )
            """,
            "CREATE INDEX run_events_run ON run_events (run_id, at)",
        ),
    ),
    Migration(
        version=2,
        name="run leases and the source of each call's usage",
        statements=(
            """
            CREATE TABLE run_leases (
                run_id INTEGER PRIMARY KEY REFERENCES runs (run_id),
                holder TEXT NOT NULL,
                pid INTEGER NOT NULL,
                host TEXT NOT NULL,
                pid_scope TEXT NOT NULL,
                started_at TEXT NOT NULL,
                heartbeat_at TEXT NOT NULL,
                heartbeat_unix REAL NOT NULL
            )
            """,
            "ALTER TABLE calls ADD COLUMN usage_source TEXT NOT NULL DEFAULT 'reported' "
            "CHECK (usage_source IN ('reported', 'estimated'))",
        ),
    ),
    Migration(
        version=3,
        name="which published fallback, if any, decided a prediction",
        statements=("ALTER TABLE predictions ADD COLUMN fallback TEXT",),
    ),
    Migration(
        version=4,
        name="blob text SQLite can read; views calls_text, predictions_scored, run_summary",
        statements=(
            # Rows written before stay compressed and valid: `stored_bytes` reads both forms.
            "ALTER TABLE blobs ADD COLUMN text TEXT",
            _CALLS_TEXT_VIEW,
            _PREDICTIONS_SCORED_VIEW,
            _RUN_SUMMARY_VIEW,
        ),
    ),
    Migration(
        version=5,
        name="how each answer came: streamed or one body, time to first token, decode rate; in calls_text too",
        statements=(
            "ALTER TABLE calls ADD COLUMN streamed INTEGER CHECK (streamed IN (0, 1))",
            "ALTER TABLE calls ADD COLUMN ttft_ms REAL",
            "ALTER TABLE calls ADD COLUMN decode_tokens_per_s REAL",
            "DROP VIEW calls_text",
            _CALLS_TEXT_VIEW_5,
        ),
    ),
    Migration(
        version=6,
        name="the task each trajectory attempts, as a hash: repeated attempts at one task share it",
        statements=("ALTER TABLE trajectories ADD COLUMN task_sha256 TEXT",),
    ),
)

_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS migrations (
    version INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    applied_at TEXT NOT NULL
)
"""


def applied_version(connection: sqlite3.Connection) -> int:
    """The highest migration recorded in the file's ``migrations`` table (0 for none)."""
    (version,) = connection.execute("SELECT coalesce(max(version), 0) FROM migrations").fetchone()
    return int(version)


def apply_migrations(connection: sqlite3.Connection) -> int:
    """Bring the schema up to date and return its version; each step re-checks the version inside its own
    ``BEGIN IMMEDIATE``, so two processes apply it once. `StoreError` (rolled back) when it cannot."""
    latest = MIGRATIONS[-1].version
    connection.execute(_MIGRATIONS_TABLE)
    current = applied_version(connection)
    if current > latest:
        raise StoreError(
            f"results.db is at schema version {current}, newer than this rcarun knows ({latest}); "
            "upgrade rcarun"
        )
    for migration in MIGRATIONS[current:]:
        connection.execute("BEGIN IMMEDIATE")
        try:
            if applied_version(connection) >= migration.version:
                connection.execute("ROLLBACK")
                continue
            for statement in migration.statements:
                connection.execute(statement)
            connection.execute(
                "INSERT INTO migrations (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.name, utc_timestamp()),
            )
            connection.execute("COMMIT")
        except sqlite3.Error as error:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            raise StoreError(f"migration {migration.version} ({migration.name}) failed: {error}") from error
    return latest
