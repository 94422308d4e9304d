"""`rcarun data check` and `rcarun data sample-mini`: printing around `rcarun.data.check` and the Mini sampler."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from rcarun.cli.output import survives_closed_stdout
from rcarun.data import DEFAULT_MINI_SEED, DEFAULT_MINI_SIZE, CheckReport
from rcarun.errors import ConfigError, RcarunError
from rcarun.text import terminal_safe

__all__ = ["add_data_commands", "cmd_data_check", "cmd_data_sample_mini"]


@survives_closed_stdout
def cmd_data_check(args: argparse.Namespace) -> int:
    from rcarun.data import check_dataset, load_manifest

    manifest = load_manifest(args.manifest) if args.manifest else None
    report = check_dataset(args.path, manifest=manifest)
    if args.json:
        print(json.dumps(_check_report_json(report), indent=2))
        return 0 if report.ok else 1
    for problem in report.problems:
        print(problem)
    unusable = sum(1 for problem in report.errors if problem.kind == "unusable")
    print(
        f"{report.path}: {report.loaded} trajectories loaded, {unusable} unusable, "
        f"{len(report.errors)} errors, {len(report.warnings)} warnings"
    )
    header = f"{'source':<24} {'trajectories':>12} {'labelled':>8} {'steps':>8} {'history chars':>14} {'median root-to-end':>18}"
    print(header)
    print("-" * len(header))
    for summary in report.sources.values():
        median = "-" if summary.median_root_to_end is None else f"{summary.median_root_to_end:g}"
        print(
            f"{summary.source:<24} {summary.trajectories:>12} {summary.labelled:>8} {summary.steps:>8} "
            f"{summary.history_chars:>14,} {median:>18}"
        )
    if report.manifest_records is not None:
        print(
            f"manifest {args.manifest}: {report.manifest_records} listed, {report.manifest_verified} verified; "
            f"{report.manifest_unlisted} loaded trajectories are not in it"
        )
    print("OK" if report.ok else "FAILED: see the errors above")
    return 0 if report.ok else 1


def _check_report_json(report: CheckReport) -> dict[str, object]:
    return {
        "path": report.path,
        "ok": report.ok,
        "loaded": report.loaded,
        "problems": [dataclasses.asdict(problem) for problem in report.problems],
        "sources": {
            name: {
                "trajectories": summary.trajectories,
                "labelled": summary.labelled,
                "steps": summary.steps,
                "history_chars": summary.history_chars,
                "median_root_to_end": summary.median_root_to_end,
            }
            for name, summary in report.sources.items()
        },
        "manifest": None
        if report.manifest_records is None
        else {
            "listed": report.manifest_records,
            "verified": report.manifest_verified,
            "unlisted": report.manifest_unlisted,
        },
    }


@survives_closed_stdout
def cmd_data_sample_mini(args: argparse.Namespace) -> int:
    from rcarun.data import iter_dataset, sample_mini, save_manifest

    problems: list[RcarunError] = []
    triples = [
        (record.trajectory.qid, record.trajectory.source, record.trajectory.sha256)
        for record in iter_dataset(args.path, strict=False, on_problem=problems.append)
    ]
    for problem in problems:
        print(terminal_safe(f"rcarun: left out: {problem}"), file=sys.stderr)
    try:
        manifest = sample_mini(triples, size=args.size, seed=args.seed)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    quotas = ", ".join(f"{source} {count}" for source, count in sorted(manifest.quotas.items()))
    if args.out:
        save_manifest(manifest, args.out)
        print(
            f"{len(manifest.records)} trajectories (seed {args.seed}): {quotas} -> {args.out}",
            file=sys.stderr,
        )
    else:
        print(json.dumps(manifest.to_json(), indent=2))
        print(f"{len(manifest.records)} trajectories (seed {args.seed}): {quotas}", file=sys.stderr)
    return 0


def add_data_commands(commands: Any) -> None:
    """``rcarun data check`` and ``rcarun data sample-mini``."""
    data = commands.add_parser("data", help="check a dataset, draw a Mini manifest")
    data_commands = data.add_subparsers(dest="data_command", required=True)
    check = data_commands.add_parser(
        "check", help="validate a dataset; list every problem by file, record, field"
    )
    check.add_argument("path", help="dataset directory or .jsonl file")
    check.add_argument(
        "--manifest",
        help="verify the records a manifest lists, file by file (SHA-256); 'longrca-mini': the official list",
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    sample = data_commands.add_parser(
        "sample-mini", help="draw a LongRCA-Mini style manifest (App. A protocol)"
    )
    sample.add_argument("path", help="dataset directory or .jsonl file")
    sample.add_argument("--size", type=int, default=DEFAULT_MINI_SIZE, help=f"default {DEFAULT_MINI_SIZE}")
    sample.add_argument("--seed", type=int, default=DEFAULT_MINI_SEED, help=f"default {DEFAULT_MINI_SEED}")
    sample.add_argument("--out", help="write the manifest here (default: print it)")
