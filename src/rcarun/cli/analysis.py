"""`rcarun score`, `rcarun export` and `rcarun cost` (and the helpers `rcarun report` shares, in `cli.report`):
printing around `rcarun.analysis`.

Every number printed here comes from `rcarun.analysis`; this module only chooses the run, reads flags and
formats. Text goes to stdout, problems to stderr, and ``--json`` prints exactly one JSON document.

results.db is opened read-only (`open_results`): an archived, shared or read-only file works, and nothing here
ever writes it. A flag that names a backbone, method or source the run does not have is an error naming the
ones it has (exit 2), never silently ignored. A reader that closes the pipe early ends a command quietly
(`rcarun.cli.output`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rcarun.cli.output import survives_closed_stdout
from rcarun.errors import ConfigError, DataError
from rcarun.store import Store, open_store
from rcarun.text import terminal_safe

# `rcarun.analysis` (numpy with it) is imported by the commands that use it, not when the `rcarun` command starts:
# `rcarun sweep`, `rcarun --help` and the other commands then start in 0.36 s of CPU instead of 0.55 (12 MB less).
if TYPE_CHECKING:
    from rcarun.analysis import CallTiming, Expected, Metrics

__all__ = [
    "add_analysis_commands",
    "check_names",
    "cmd_cost",
    "cmd_export",
    "cmd_score",
    "db_and_run",
    "open_results",
]


def add_analysis_commands(commands: Any, default_db: str) -> None:
    """Register score, export and cost on the top-level subparsers (`cli.report` adds report after them)."""
    _add_score(commands)
    _add_export(commands, default_db)
    _add_cost(commands, default_db)


def _add_score(commands: Any) -> None:
    score = commands.add_parser("score", help="score a predictions.jsonl submission against references")
    score.add_argument(
        "predictions", help="predictions.jsonl: {question_ID, predicted_role, predicted_step} per line"
    )
    score.add_argument(
        "--references",
        required=True,
        help="a dataset (directory or .jsonl of records) or a labels file (.csv / .jsonl with question_ID, "
        "source, n_steps, reference_role, reference_step)",
    )
    score.add_argument(
        "--json", action="store_true", help="print the leaderboard fields and the accuracy table"
    )
    score.add_argument("--keep-handoff", action="store_true", help="ablation role rule: keep (-> X) suffixes")


def _add_export(commands: Any, default_db: str) -> None:
    export = commands.add_parser("export", help="write one backbone x method as a leaderboard submission")
    db_and_run(export, default_db)
    export.add_argument("--backbone", required=True)
    export.add_argument("--method", required=True)
    export.add_argument("--realization", type=int, default=0, help="0-based (default 0)")
    export.add_argument("--out", required=True, help="directory for predictions.jsonl and leaderboard.json")


def _add_cost(commands: Any, default_db: str) -> None:
    cost = commands.add_parser(
        "cost",
        help="tokens, USD and latency per backbone x method x stage; per backbone, streamed answers, time to "
        "first token, decode rate and cut generations",
    )
    db_and_run(cost, default_db)
    cost.add_argument("--json", action="store_true", help="print the rows as JSON")


def db_and_run(parser: argparse.ArgumentParser, default_db: str) -> None:
    parser.add_argument(
        "--db", help=f"results database, opened read-only (env RCARUN_DB, default {default_db})"
    )
    parser.add_argument("--run", help="run name (env RCARUN_RUN; default: the most recently updated run)")


def open_results(db: Path) -> Store:
    """results.db opened read-only, with anything a reader should know about the read said on stderr.

    Raises:
        StoreError: as `rcarun.store.open_read_only` (missing, not a results database, newer schema).
    """
    store = open_store(db, read_only=True)
    if store.notice:
        print(terminal_safe(f"rcarun: {store.notice}"), file=sys.stderr)
    return store


def check_names(flag: str, kind: str, wanted: Iterable[str], known: Sequence[str], owner: str) -> None:
    """Refuse, naming the known ones, every name in ``wanted`` that ``owner`` (``run 'demo'``) does not have.

    Raises:
        ConfigError: e.g. ``--compare-backbones: run 'demo' has no backbone 'gpt5' (backbones: 'a', 'b')``.
    """
    unknown = [name for name in dict.fromkeys(wanted) if name not in known]
    if unknown:
        shown = ", ".join(repr(name) for name in known) or "none"
        names = ", ".join(repr(name) for name in unknown)
        raise ConfigError(f"{flag}: {owner} has no {kind} {names} ({kind}s: {shown})")


# -- score ----------------------------------------------------------------------------------------------------


def _references(path: Path) -> tuple[list[Expected], list[DataError]]:
    """A labels file (.csv, or .jsonl whose first record has ``reference_role``) or a dataset."""
    from rcarun.analysis import load_labels, references_from_dataset

    if path.suffix == ".csv":
        return load_labels(path), []
    if path.suffix == ".jsonl" and path.is_file() and _looks_like_labels(path):
        return load_labels(path), []
    references = references_from_dataset(path)
    return references.expected, references.problems


def _looks_like_labels(path: Path) -> bool:
    with path.open("rb") as handle:
        for line in handle:
            if line.strip():
                try:
                    first = json.loads(line)
                except ValueError:
                    return False
                return isinstance(first, dict) and "reference_role" in first
    return False


@survives_closed_stdout
def cmd_score(args: argparse.Namespace) -> int:
    from rcarun.analysis import load_predictions_jsonl, metrics_json, score_submission, summarize

    expected, reference_problems = _references(Path(args.references))
    if not expected:
        raise DataError("no labelled trajectories found", path=args.references)
    for problem in reference_problems:
        print(terminal_safe(f"rcarun: references: left out: {problem}"), file=sys.stderr)
    submission = score_submission(
        load_predictions_jsonl(args.predictions), expected, keep_handoff=args.keep_handoff
    )
    summary = summarize(list(submission.items))
    if args.json:
        document = {
            **submission.entry,
            "accuracy": {
                "pooled": metrics_json(summary.pooled),
                "macro": metrics_json(summary.macro),
                "per_source": {source: metrics_json(m) for source, m in summary.per_source.items()},
            },
            "missing": list(submission.missing),
            "duplicates": [
                {"qid": d.qid, "line": d.line, "first_line": d.first_line} for d in submission.duplicates
            ],
            "unknown": list(submission.unknown),
            "problems": [str(problem) for problem in submission.problems],
            "notes": [str(note) for note in submission.notes],
        }
        print(json.dumps(document, indent=2))
        return 0
    for problem in submission.problems:
        print(f"dropped: {problem}")
    for duplicate in submission.duplicates:
        print(f"duplicate: {duplicate.qid} on line {duplicate.line} (line {duplicate.first_line} was scored)")
    for note in submission.notes:
        print(f"invalid field: {note}")
    if submission.unknown:
        print(f"unknown qids (ignored): {len(submission.unknown)}: {_some(submission.unknown)}")
    if submission.missing:
        print(
            f"missing predictions (scored as errors): {len(submission.missing)}: {_some(submission.missing)}"
        )
    entry = submission.entry
    print(
        f"n {entry['n']}: role {entry['role_correct']}, root exact {entry['root_exact_correct']}, "
        f"root ±5 {entry['root_within_5_correct']}, valid steps {entry['valid_step_n']}, failed {entry['failed_n']}, "
        f"MAE {_number(entry['root_mae'], 2)}"
    )
    print(_metrics_table({"pooled": summary.pooled, "macro": summary.macro, **summary.per_source}))
    return 0


def _some(qids: tuple[str, ...], limit: int = 5) -> str:
    return ", ".join(qids[:limit]) + (", ..." if len(qids) > limit else "")


def _number(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _metrics_table(rows: Mapping[str, Metrics]) -> str:
    from rcarun.analysis import METRICS

    widths = [max(7, len(m.column) + 1) for m in METRICS]
    header = f"{'':<24} {'n':>6} " + " ".join(
        f"{m.column:>{w}}" for m, w in zip(METRICS, widths, strict=True)
    )
    lines = [header, "-" * len(header)]
    for name, row in rows.items():
        cells = []
        for metric, width in zip(METRICS, widths, strict=True):
            value = getattr(row, metric.name)
            cells.append(f"{value:>{width}.1%}" if metric.fraction else f"{_number(value, 1):>{width}}")
        lines.append(f"{name:<24} {row.n:>6} " + " ".join(cells))
    return "\n".join(lines)


# -- export ---------------------------------------------------------------------------------------------------


@survives_closed_stdout
def cmd_export(args: argparse.Namespace, db: Path, run_name: str | None) -> int:
    from rcarun.analysis import (
        Cell,
        Prediction,
        leaderboard_entry,
        load_run_scores,
        resolve_run,
        write_predictions_jsonl,
    )

    with open_results(db) as store:
        run = resolve_run(store, run_name)
        names = store.work_names(run.run_id)
        check_names("--backbone", "backbone", [args.backbone], names.backbones, f"run {run.name!r}")
        check_names("--method", "method", [args.method], names.methods, f"run {run.name!r}")
        scores = load_run_scores(store, run)
        cell = Cell(args.backbone, args.method, args.realization)
        if cell not in scores.scores:
            known = (
                ", ".join(f"{c.backbone}/{c.method}/r{c.realization}" for c in sorted(scores.scores))
                or "none"
            )
            raise ConfigError(
                f"run {run.name!r} has no {cell.backbone}/{cell.method}/r{cell.realization} (has: {known})"
            )
        predictions = {
            p.qid: Prediction(role=p.pred_role, step=p.pred_step, abstained=bool(p.abstained))
            for p in store.predictions(run.run_id)
            if Cell(p.backbone, p.method, p.realization) == cell
        }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = write_predictions_jsonl(out / "predictions.jsonl", predictions)
    entry = {
        **leaderboard_entry(scores.scores[cell]),
        "run": run.name,
        "backbone": cell.backbone,
        "method": cell.method,
        "realization": cell.realization,
        "simulated": scores.simulated,
    }
    (out / "leaderboard.json").write_text(json.dumps(entry, indent=2) + "\n", encoding="utf-8")
    missing = len(scores.expected) - len(predictions)
    print(
        f"{written} predictions -> {out / 'predictions.jsonl'}; leaderboard entry -> {out / 'leaderboard.json'}"
        + (f"; {missing} expected trajectories have no prediction (scored as errors)" if missing > 0 else "")
    )
    return 0


# -- cost -----------------------------------------------------------------------------------------------------


@survives_closed_stdout
def cmd_cost(args: argparse.Namespace, db: Path, run_name: str | None) -> int:
    from rcarun.analysis import call_timing, cost_rows, resolve_run
    from rcarun.analysis.cost import served_by

    with open_results(db) as store:
        run = resolve_run(store, run_name)
        rows = cost_rows(store, run.run_id)
        served = served_by(store, run.run_id)
        timing = call_timing(store, run.run_id)
    if args.json:
        print(
            json.dumps(
                {
                    "run": run.name,
                    "run_id": run.run_id,
                    "rows": [row.to_json() for row in rows],
                    "served_by": [entry.to_json() for entry in served],
                    "call_timing": [entry.to_json() for entry in timing],
                },
                indent=2,
            )
        )
        return 0
    header = (
        f"{'backbone':<16} {'method':<16} {'stage':<12} {'items':>6} {'calls':>6} {'attempts':>8} {'len':>4} "
        f"{'429':>4} {'prompt':>11} {'cached':>10} {'completion':>11} {'reasoning':>10} {'USD':>10} "
        f"{'GPU USD':>10} {'USD/traj':>9} {'p50 ms':>8} {'p95 ms':>8} {'budget':>7}"
    )
    print(f"run {run.name!r} (id {run.run_id})")
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row.backbone:<16} {row.method:<16} {row.stage:<12} {row.items:>6} {row.calls:>6} {row.attempts:>8} "
            f"{row.length_retries:>4} {row.rate_limited:>4} {row.prompt_tokens:>11,} {row.cached_tokens:>10,} "
            f"{row.completion_tokens:>11,} {row.reasoning_tokens:>10,} {row.cost_usd:>10.4f} "
            f"{row.gpu_usd:>10.4f} {_number(row.usd_per_trajectory, 5):>9} {_number(row.latency_p50_ms, 0):>8} "
            f"{_number(row.latency_p95_ms, 0):>8} {'–' if row.budget_use is None else f'{row.budget_use:.1%}':>7}"
        )
    total = sum(row.cost_usd for row in rows)
    gpu_total = sum(entry.gpu_usd for entry in served)
    print(
        f"total USD {total:.4f} over {sum(row.attempts for row in rows)} attempts"
        + (f"; GPU USD {gpu_total:.4f}, together {total + gpu_total:.4f}" if served else "")
    )
    for entry in served:
        rates = ", ".join(
            f"{replica.index}: {_number(replica.tokens_per_s, 0)}" for replica in entry.per_replica
        )
        unclosed = (
            f"; {entry.unclosed_sessions} session(s) never recorded their stop, charged to their last call"
            if entry.unclosed_sessions
            else ""
        )
        print(
            f"GPU time of {entry.backbone} (vLLM {entry.vllm_version}, {entry.replicas} replicas on {entry.gpus} "
            f"GPUs, {entry.sessions} session(s)): {entry.gpu_hours:.4f} GPU-hours × "
            f"${entry.gpu_hour_usd:g}/GPU-hour = ${entry.gpu_usd:.4f}, split over its calls by tokens processed; "
            f"tokens/s per replica {_number(entry.tokens_per_s_per_replica, 0)} ({rates}){unclosed}"
        )
    estimated = [row for row in rows if row.estimated_calls]
    if estimated:
        where = ", ".join(
            f"{row.backbone}/{row.method}/{row.stage} {row.estimated_calls}" for row in estimated
        )
        print(
            f"estimated usage: {sum(row.estimated_calls for row in estimated)} attempts had no usable usage from "
            f"the provider and are charged rcarun's conservative estimate ({where})"
        )
    if timing:
        print()
        print("\n".join(_timing_table(timing)))
    return 0


def _timing_table(timing: Sequence[CallTiming]) -> list[str]:
    """Per backbone, over attempts sent: streamed answers, TTFT and decode rate percentiles, cut generations."""
    header = (
        f"{'backbone':<16} {'attempts':>8} {'streamed':>8} {'TTFT p50 s':>10} {'TTFT p95 s':>10} "
        f"{'tok/s p50':>9} {'tok/s p95':>9} {'cut':>5} {'cut USD':>10}"
    )
    lines = [
        "call timing (attempts sent): streamed answers, time to first token, decode rate; cut generations "
        "(charged an estimate)",
        header,
        "-" * len(header),
    ]
    for entry in timing:
        streamed = "–" if entry.streamed_calls is None else f"{entry.streamed_calls:,}"
        lines.append(
            f"{entry.backbone:<16} {entry.attempts:>8,} {streamed:>8} {_number(entry.ttft_p50_s, 2):>10} "
            f"{_number(entry.ttft_p95_s, 2):>10} {_number(entry.decode_p50_tokens_per_s, 1):>9} "
            f"{_number(entry.decode_p95_tokens_per_s, 1):>9} {entry.cut_calls:>5,} {entry.cut_usd:>10.4f}"
        )
    return lines


# -- report ---------------------------------------------------------------------------------------------------
