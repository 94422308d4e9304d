"""`rcarun report`: its flags, the `ReportOptions` they ask for, and the command.

The report itself is built by `rcarun.analysis.build_report`; this module reads flags, checks the names they give
against the run (an unknown one is an error naming the known ones, exit 2) and prints text, HTML or one JSON
document.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rcarun.cli.analysis import check_names, db_and_run, open_results
from rcarun.cli.output import survives_closed_stdout
from rcarun.errors import ConfigError
from rcarun.store import RunRow, Store
from rcarun.text import terminal_safe

if TYPE_CHECKING:
    from rcarun.analysis import ReportOptions

__all__ = ["add_report_command", "check_report_names", "cmd_report", "report_options"]


def add_report_command(commands: Any, default_db: str) -> None:
    """Register ``rcarun report`` on the top-level subparsers."""
    _add_studies(_add_report(commands, default_db))


def _add_report(commands: Any, default_db: str) -> argparse.ArgumentParser:
    """`rcarun report` and its protocol flags; `_add_studies` adds those of the optional studies."""
    report: argparse.ArgumentParser = commands.add_parser(
        "report", help="accuracy, paired comparisons, repeatability and cost of a run"
    )
    db_and_run(report, default_db)
    report.add_argument("--json", action="store_true", help="print the report as JSON")
    report.add_argument(
        "--html",
        help="also write HTML: FILE.html, one self-contained page with tables and plots; a DIR (ends with /, is "
        "a directory, or has no .html suffix), that page as DIR/index.html plus the trajectory viewer (the "
        "viewer needs a directory)",
    )
    report.add_argument(
        "--reference", help="method the others are compared with (default: rcta, else the first)"
    )
    report.add_argument(
        "--protocol",
        choices=["auto", "main", "ablation"],
        default="auto",
        help="the paper's main-comparison rules (Sec. 5.1, App. B) or its component-ablation rules (App. H, L.1); "
        "auto: ablation when the run holds only full RCTA and rcta/no-a* conditions (default: auto)",
    )
    report.add_argument(
        "--aggregate",
        choices=["auto", "macro", "pooled"],
        default="auto",
        help="headline aggregate; auto: pooled on a run of natural source proportions (Full), macro on a "
        "manifest or equal-quota sample (Mini) and under the ablation protocol",
    )
    report.add_argument(
        "--resamples",
        type=int,
        help="paired bootstrap resamples (default: 20,000 main, App. B; 10,000 ablation, App. H)",
    )
    report.add_argument("--seed", type=int, default=20260820, help="bootstrap seed (20260820)")
    report.add_argument(
        "--holm-family",
        choices=["paper", "metric", "all"],
        help="paper (default): the protocol's family (App. B: RCTA vs the paper's baselines, per metric; "
        "App. H: the four component tests); metric: each metric's comparisons; all: everything",
    )
    report.add_argument(
        "--holm-backbones",
        help="comma-separated backbones of App. B's Holm family (default: the run's API backbones, self-hosted "
        "vllm/local ones left out as the paper's family left out Qwen3.5-35B-A3B)",
    )
    report.add_argument(
        "--compare-backbones",
        help="comma-separated backbones: each is compared with the first, per method "
        "(default: all backbones when the run has a single method)",
    )
    report.add_argument(
        "--populations",
        help="post-stratify to source sizes: 'longrca' (Full: 128/42/685/108/177) or source=N,source=N",
    )
    report.add_argument(
        "--keep-handoff",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep (-> X) handoff suffixes in role matching (default: kept under the ablation protocol only)",
    )
    report.add_argument(
        "--abstentions",
        choices=["fields", "error"],
        help="score an abstaining output on its fields (main protocol) or as an error (ablation protocol)",
    )
    return report


def _add_studies(report: argparse.ArgumentParser) -> None:
    """`rcarun report`'s flags of App. A's calibration and App. K.1's label sensitivity."""
    report.add_argument(
        "--calibrate-against",
        metavar="FULL_RUN",
        help="App. A: set this (Mini) run's scores beside those of a Full run, per method, metric and source",
    )
    report.add_argument(
        "--calibrate-db", help="the database of --calibrate-against (default: this run's database)"
    )
    report.add_argument(
        "--calibration-sizes",
        help="App. A's sample-size calibration over this (Full) run: 'paper' (75..600) or N,N,...",
    )
    report.add_argument(
        "--calibration-seed", type=int, default=20260820, help="its master seed (20260820, App. A)"
    )
    report.add_argument(
        "--annotations",
        metavar="FILE",
        help="App. K.1: observed human root steps (.csv/.jsonl with question_ID, step; one row per annotation) "
        "for the label-sensitivity analysis",
    )
    report.add_argument("--annotation-seed", type=int, default=20260918, help="its seed (20260918, App. K.1)")
    report.add_argument(
        "--draws",
        type=int,
        default=10_000,
        help="draws of the sample-size calibration and of the label sensitivity (10,000, App. A and K.1)",
    )


def _populations(text: str | None) -> dict[str, int] | None:
    from rcarun.analysis import LONGRCA_FULL_POPULATIONS

    if not text:
        return None
    if text.strip().lower() == "longrca":
        return dict(LONGRCA_FULL_POPULATIONS)
    populations = {}
    for part in text.split(","):
        source, _, count = part.partition("=")
        if not source.strip() or not count.strip().isdigit():
            raise ConfigError(f"--populations: expected source=N pairs or 'longrca', got {part!r}")
        populations[source.strip()] = int(count)
    return populations


def _names(flag: str, text: str | None, *, at_least: int = 1) -> tuple[str, ...]:
    names = tuple(b.strip() for b in (text or "").split(",") if b.strip())
    if text is not None and len(names) < at_least:
        if at_least > 1:
            raise ConfigError(
                f"{flag} needs two or more backbones (each is compared with the first), got {text!r}"
            )
        raise ConfigError(f"{flag} needs at least one name, got {text!r}")
    twice = sorted({b for b in names if names.count(b) > 1})
    if twice:
        raise ConfigError(f"{flag} names {', '.join(repr(b) for b in twice)} more than once")
    return names


def _compare_backbones(text: str | None) -> tuple[str, ...]:
    return _names("--compare-backbones", text, at_least=2)


def _sizes(text: str | None) -> tuple[int, ...]:
    from rcarun.analysis import CALIBRATION_SIZES

    if not text:
        return ()
    if text.strip().lower() == "paper":
        return CALIBRATION_SIZES
    sizes = []
    for part in text.split(","):
        if not part.strip().isdigit() or int(part) < 1:
            raise ConfigError(f"--calibration-sizes: expected 'paper' or positive integers, got {part!r}")
        sizes.append(int(part))
    return tuple(dict.fromkeys(sizes))


def report_options(args: argparse.Namespace) -> ReportOptions:
    """The `ReportOptions` the flags of `rcarun report` ask for (names are checked against a run by
    `check_report_names`).

    Raises:
        ConfigError: a count below 1, a malformed list, or an annotations file that cannot be read.
    """
    from rcarun.analysis import ReportOptions, load_annotations

    if args.resamples is not None and args.resamples < 1:
        raise ConfigError(f"--resamples must be >= 1, got {args.resamples}")
    if args.draws < 1:
        raise ConfigError(f"--draws must be >= 1, got {args.draws}")
    if args.calibrate_db is not None and args.calibrate_against is None:
        raise ConfigError(
            "--calibrate-db names where --calibrate-against's run is; give --calibrate-against too"
        )
    return ReportOptions(
        reference_method=args.reference,
        protocol=args.protocol,
        aggregate=None if args.aggregate == "auto" else args.aggregate,
        resamples=args.resamples,
        seed=args.seed,
        holm_family=args.holm_family,
        holm_backbones=_names("--holm-backbones", args.holm_backbones),
        compare_backbones=_compare_backbones(args.compare_backbones),
        populations=_populations(args.populations),
        keep_handoff=args.keep_handoff,
        abstentions=args.abstentions,
        calibrate_against=args.calibrate_against,
        calibration_sizes=_sizes(args.calibration_sizes),
        calibration_seed=args.calibration_seed,
        annotations=load_annotations(args.annotations) if args.annotations else None,
        annotation_seed=args.annotation_seed,
        draws=args.draws,
    )


def check_report_names(store: Store, run: RunRow, options: ReportOptions) -> None:
    """Every backbone, method and source the report's flags name must be the run's.

    Raises:
        ConfigError: naming the flag, the unknown names and the known ones.
    """
    names = store.work_names(run.run_id)
    check_names(
        "--compare-backbones", "backbone", options.compare_backbones, names.backbones, f"run {run.name!r}"
    )
    check_names("--holm-backbones", "backbone", options.holm_backbones, names.backbones, f"run {run.name!r}")
    if options.reference_method is not None:
        check_names("--reference", "method", [options.reference_method], names.methods, f"run {run.name!r}")
    if options.populations is not None:
        # Post-stratification weighs every scored source: the sizes must cover exactly the labelled ones.
        sources = sorted(
            {
                t.source
                for t in store.trajectories(run.run_id)
                if t.ref_role is not None and t.ref_step is not None
            }
        )
        check_names("--populations", "source", options.populations, sources, f"run {run.name!r}")
        missing = [source for source in sources if source not in options.populations]
        if missing:
            raise ConfigError(
                f"--populations: no size for {', '.join(repr(s) for s in missing)} of run {run.name!r} "
                f"(its sources: {', '.join(repr(s) for s in sources)})"
            )


@survives_closed_stdout
def cmd_report(args: argparse.Namespace, db: Path, run_name: str | None) -> int:
    from rcarun.analysis import build_report, resolve_run
    from rcarun.analysis.render import render_html, render_text
    from rcarun.analysis.viewer import is_site_target, write_site

    site = None

    options = report_options(args)
    with open_results(db) as store:
        run = resolve_run(store, run_name)
        check_report_names(store, run, options)
        if args.calibrate_db is not None:
            full_db = Path(args.calibrate_db)
            if not full_db.is_file():
                raise ConfigError(f"--calibrate-db: {full_db}: no such results database")
            with open_results(full_db) as full_store:
                report = build_report(store, run.run_id, options, full_store=full_store)
        else:
            report = build_report(store, run.run_id, options)
        if args.html and is_site_target(args.html):
            site = write_site(store, run, Path(args.html), report)
    if site is not None:
        print(
            f"rcarun: wrote {site.index} and the trajectory viewer ({site.trajectories}, {site.pages} trajectory "
            f"pages; {site.contents_note})",
            file=sys.stderr,
        )
    elif args.html:
        Path(args.html).write_text(render_html(report), encoding="utf-8")
        print(terminal_safe(f"rcarun: wrote {args.html}"), file=sys.stderr)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(render_text(report))
    return 0
