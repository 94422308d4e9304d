"""`rcarun show`: one item (or one call) of a run in the terminal or as JSON.

It reads through the store (`Store.read_blob`), so a prompt kept compressed reads like any other; answers are
read from the raw body with the backbone's preset, as the trajectory viewer reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from rcarun.backends import get_preset, replay_completion
from rcarun.cli.analysis import check_names, open_results
from rcarun.cli.output import survives_closed_stdout
from rcarun.data.roles import role_matches
from rcarun.errors import ConfigError, RcarunError
from rcarun.store import RunRow, Store
from rcarun.text import terminal_safe

__all__ = ["AnswerReader", "cmd_show"]

# Characters of each text `show` prints without --full.
_SHOWN_CHARS: Final = 1_500


@dataclass(frozen=True, slots=True)
class AnswerReader:
    """Reads a run's blobs and answers as `show` and the search index show them."""

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
            result = replay_completion(body, preset, str(call["backbone"]))
        except (RcarunError, KeyError, ValueError):
            return body.decode("utf-8", "replace"), None
        answer = result.text
        for tool_call in result.tool_calls:
            answer += f"\n→ tool call {tool_call.name}({tool_call.arguments})"
        return answer, result.reasoning_text or None


def _call_json(reader: AnswerReader, call: sqlite3.Row) -> dict[str, Any]:
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

    reader = AnswerReader(store, backbone_providers(run_config(run)))
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
    reference = store.connection.execute(
        "SELECT * FROM trajectories WHERE run_id = ? AND qid = ?", (run.run_id, args.qid)
    ).fetchone()
    items = [_item_json(reader, run, args.qid, key, reference) for key in _item_keys(store, run, args)]
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


def _item_keys(store: Store, run: RunRow, args: argparse.Namespace) -> list[sqlite3.Row]:
    """The work items of ``--qid`` that the filters keep (with a row in items or predictions), in key order."""
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
    keys = store.connection.execute(
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
    return keys


def _item_json(
    reader: AnswerReader, run: RunRow, qid: str, key: sqlite3.Row, reference: sqlite3.Row | None
) -> dict[str, Any]:
    connection = reader.store.connection
    match = (run.run_id, key["backbone"], key["method"], qid, key["realization"])
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
    return {
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
def cmd_show(args: argparse.Namespace, db: Path) -> int:
    from rcarun.analysis import resolve_run

    with open_results(db) as store:
        run = resolve_run(store, args.run or os.environ.get("RCARUN_RUN") or None)
        document = _show_document(args, store, run)
    if args.json:
        print(json.dumps(document, indent=2, ensure_ascii=False))
    else:
        print(_show_text(document, args.full))
    return 0
