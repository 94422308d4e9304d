"""The `rcarun` command: argument parsing, signal handling and printing; the work happens in the packages below.

Settings follow one precedence, implemented once in `_setting`: flag > environment variable > config file >
default. `rcarun sweep`'s exit statuses (`cli.summary`, the README's "When things go wrong") are listed in its
``--help``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rcarun.cli.analysis import add_analysis_commands, cmd_cost, cmd_export, cmd_score
from rcarun.cli.data import add_data_commands, cmd_data_check, cmd_data_sample_mini
from rcarun.cli.db import DB_COMMANDS, add_db_commands, run_db_command
from rcarun.cli.discovery import add_methods_command, cmd_methods
from rcarun.cli.estimate import add_estimate_command, cmd_estimate
from rcarun.cli.output import silence_closed_output, survives_closed_stdout
from rcarun.cli.report import add_report_command, cmd_report
from rcarun.cli.serve import add_serve_command, cmd_serve
from rcarun.cli.summary import exit_status, print_accuracy, print_summary
from rcarun.cli.terminal import SafeStdout
from rcarun.cli.tuning import tuned_interpreter
from rcarun.errors import ConfigError, RcarunError, StoreError
from rcarun.runner import (
    StopController,
    SweepConfig,
    SweepOutcome,
    load_sweep_config,
    narrow_sweep,
    run_sweep,
)
from rcarun.store import RunBusy
from rcarun.text import terminal_safe

__all__ = ["main"]

_T = TypeVar("_T")
_DEFAULT_DB = "results.db"
_DESCRIPTION = (
    "Find where and who broke a failed multi-agent run: root-cause attribution methods over failed agent "
    "trajectories, across many LLM backbones at once, every call and prediction kept in one SQLite file."
)


def _setting(flag: str | None, env: str, default: str) -> str:
    """flag > environment > default (the config file's value, when there is one, is the default here)."""
    if flag is not None:
        return flag
    return os.environ.get(env) or default


# After a cancel, how long the process may take to wind down before it exits regardless.
_CANCEL_GRACE_S = 10.0


def _install_stop_handlers(
    stop: StopController,
    main_task: asyncio.Task[object],
    drain_s: float,
    cancel_grace_s: float = _CANCEL_GRACE_S,
) -> None:
    """Ctrl-C (or SIGTERM), counted together: the first stops admission and lets the calls in flight finish,
    for up to ``drain_s``; the second (or the drain deadline) cancels what is left; the next exits at once.

    A cancelled sweep that has not ended ``cancel_grace_s`` later exits too, from a watchdog thread that needs
    no event loop: the process always ends. Exiting at once is safe for results.db (every committed batch is
    kept, WAL rolls back a half-written one); the exit hooks let the run's lease go first.
    """
    loop = asyncio.get_running_loop()
    presses = 0
    watchdog: threading.Timer | None = None

    def exit_now(why: str) -> None:
        stop.run_exit_hooks()
        _tell(
            f"\nrcarun: {why}; exiting now. results.db keeps every committed row; rerun the same command to resume."
        )
        os._exit(130)

    def cancel_now() -> None:
        nonlocal watchdog, presses
        presses = max(presses, 2)  # after a cancel, from a press or the drain deadline, the next signal exits
        main_task.cancel()
        if watchdog is None:
            watchdog = threading.Timer(
                cancel_grace_s,
                exit_now,
                args=(f"the sweep did not end within {cancel_grace_s:g} s of cancelling",),
            )
            watchdog.daemon = True
            watchdog.start()

    def on_signal() -> None:
        # Act first, then say so: with stderr a closed pipe (`| tee` after Ctrl-C) the saying may fail.
        nonlocal presses
        presses += 1
        if presses == 1:
            stop.stop_admission("interrupted by signal")
            loop.call_later(drain_s, cancel_now)
            _tell(
                f"\nrcarun: stopping admission; draining in-flight calls (up to {drain_s:.0f} s). "
                "Press Ctrl-C again to cancel now."
            )
        elif presses == 2:
            cancel_now()
            _tell("\nrcarun: cancelling the calls in flight. Press Ctrl-C again to exit at once.")
        else:
            exit_now("interrupted a third time")

    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, on_signal)


def _tell(text: str) -> None:
    """One message on stderr that never raises: a closed pipe must not abort what a signal handler is doing."""
    with contextlib.suppress(OSError, ValueError):
        print(terminal_safe(text), file=sys.stderr, flush=True)


async def _run_with_signals(
    config: SweepConfig, db: Path, run: str, args: argparse.Namespace
) -> SweepOutcome:
    stop = StopController()
    task = asyncio.current_task()
    assert task is not None
    _install_stop_handlers(stop, task, config.sweep.drain_timeout_s)
    config = narrow_sweep(config, backbones=args.backbone or (), methods=args.method or ())
    try:
        return await run_sweep(
            config,
            db_path=db,
            run_name=run,
            stop=stop,
            show_progress=not args.no_progress,
            retry_failed=args.retry_failed,
            limit=args.limit,
            accept_config_change=args.accept_config_change,
        )
    finally:
        _hand_late_signals_to_exit(asyncio.get_running_loop())


async def _demo(db: Path, run: str, args: argparse.Namespace) -> SweepOutcome:
    from rcarun.demo import demo_sweep_config, simulated_backbones

    async with simulated_backbones() as backbones:
        return await _run_with_signals(demo_sweep_config(backbones), db, run, args)


def _resume_command(args: argparse.Namespace, db: Path, run: str) -> str:
    """The same sweep command (its slice included), to resume the run, quoted for a POSIX shell."""
    parts = ["rcarun", "sweep"]
    if args.config is not None:
        parts += ["--config", str(args.config)]
    parts += ["--db", str(db), "--run", run]
    for name in args.backbone or ():
        parts += ["--backbone", name]
    for name in args.method or ():
        parts += ["--method", name]
    if args.limit is not None:
        parts += ["--limit", str(args.limit)]
    return shlex.join(parts)


def _run_sweep_loop(sweep: Coroutine[Any, Any, _T], args: argparse.Namespace) -> _T:
    """Run the sweep on a new asyncio loop, in a tuned interpreter when ``--tune-interpreter`` asks for it."""
    with tuned_interpreter() if args.tune_interpreter else contextlib.nullcontext():
        return asyncio.run(sweep)


def _cmd_sweep(args: argparse.Namespace) -> int:
    db = Path(_setting(args.db, "RCARUN_DB", _DEFAULT_DB))
    if args.config is None:
        run = _setting(args.run, "RCARUN_RUN", "demo")
        try:
            outcome = _run_sweep_loop(_demo(db, run, args), args)
        except RunBusy:
            raise
        except StoreError as exc:
            raise StoreError(f"{exc}; once fixed, resume with: {_resume_command(args, db, run)}") from None

        def show() -> None:
            print_summary(db, outcome, simulated=True, resume=_resume_command(args, db, run))
            print_accuracy(db, outcome)

        _tell_outcome(show)
    else:
        config = load_sweep_config(Path(args.config))
        run = _setting(args.run, "RCARUN_RUN", Path(args.config).stem)
        try:
            outcome = _run_sweep_loop(_run_with_signals(config, db, run, args), args)
        except ConfigError as exc:  # found by the runner (dataset path, key variable): name the file too
            raise ConfigError(f"{args.config}: {exc}") from None
        except RunBusy:
            raise
        except StoreError as exc:  # the disk filled up, or the file stopped taking writes, mid-run
            raise StoreError(f"{exc}; once fixed, resume with: {_resume_command(args, db, run)}") from None
        simulated = config.sweep.simulated or all(
            b.provider == "simulated" for b in config.backbones.values()
        )
        _tell_outcome(
            lambda: print_summary(db, outcome, simulated=simulated, resume=_resume_command(args, db, run))
        )
    return exit_status(db, outcome)


def _hand_late_signals_to_exit(loop: asyncio.AbstractEventLoop) -> None:
    """Once the sweep has ended, a Ctrl-C (or SIGTERM) exits with 130, as a third press does.

    The loop's own handlers go now, while it still runs: closing it would put Python's SIGINT handler back (and
    SIG_DFL for SIGTERM), and a press landing while the process winds down (the loop's teardown, the closing
    summary, the interpreter's exit) would raise KeyboardInterrupt outside any handler that turns it into the
    documented status, or kill the process by the signal. The run has ended and released its lease by then.
    """
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(signum)
            signal.signal(signum, _exit_interrupted)


def _exit_interrupted(signum: int, frame: object) -> None:
    # SystemExit rather than os._exit: where this lands inside a caller's own handling (the tests run sweeps in
    # their process), it unwinds like any exit instead of killing the process.
    _tell("\nrcarun: interrupted after the sweep ended; results.db keeps every row.")
    raise SystemExit(130)


def _tell_outcome(show: Callable[[], object]) -> None:
    """Print the closing summary; a reader that went away (`| head`, a `tee` killed by Ctrl-C) does not change
    what the sweep's exit status says happened."""
    try:
        show()
        sys.stdout.flush()
    except BrokenPipeError:
        silence_closed_output()


def _add_sweep_command(commands: Any) -> None:
    sweep = commands.add_parser(
        "sweep",
        help="run a sweep (no --config: the embedded simulated demo)",
        description="Run (or resume) a sweep: every method x backbone x trajectory x realization of the config, "
        "into results.db. Exit 0: every item has a prediction; 3: stopped early, resumable; 4: items failed "
        "(--retry-failed); 5: no answer of some backbone could be read; 130: cancelled; 2: config, data or results.db unusable.",
    )
    sweep.add_argument("--config", help="sweep TOML file")
    sweep.add_argument("--db", help=f"results database (env RCARUN_DB, default {_DEFAULT_DB})")
    sweep.add_argument("--run", help="run name; rerunning the same name resumes it (env RCARUN_RUN)")
    sweep.add_argument("--no-progress", action="store_true", help="no progress bars")
    sweep.add_argument(
        "--retry-failed", action="store_true", help="on resume, run items that failed for good again"
    )
    sweep.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="only the first N usable trajectories of the dataset (a smoke run; a later full run resumes it)",
    )
    sweep.add_argument(
        "--backbone",
        action="append",
        metavar="NAME",
        help="run only this backbone of the config (repeatable)",
    )
    sweep.add_argument(
        "--method", action="append", metavar="NAME", help="run only this method label or name (repeatable)"
    )
    sweep.add_argument(
        "--accept-config-change",
        action="store_true",
        help="resume even though settings that decide answers (model, endpoint, request and method options, "
        "stage budgets, data) changed since the run started",
    )
    sweep.add_argument(
        "--tune-interpreter",
        action="store_true",
        help="while the sweep runs, hand the GIL over every 0.5 ms and make the garbage collector's passes rare "
        "(5%% less CPU a call on the bench's latency-bound scenario; docs/performance.md)",
    )


def _cmd_mock_server(args: argparse.Namespace, rest: Sequence[str]) -> int:
    from rcarun.mock.cli import main as mock_main

    return mock_main(list(rest))


def _cmd_bench(args: argparse.Namespace) -> int:
    # The benchmarks are a distribution of their own (benchmarks/), found by name where they are installed.
    import importlib

    try:
        bench = importlib.import_module("rcarun_bench")
    except ModuleNotFoundError as exc:
        if exc.name != "rcarun_bench":
            raise
        print(
            "rcarun bench: the benchmarks are not installed (pip install -e ./benchmarks from a checkout)",
            file=sys.stderr,
        )
        return 2
    status: int = bench.main(args)
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rcarun", description=_DESCRIPTION)
    parser.add_argument("-V", "--version", action="version", version=f"rcarun {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    _add_sweep_command(commands)
    commands.add_parser("mock-server", help="run the OpenAI-compatible simulator on loopback", add_help=False)

    add_data_commands(commands)
    add_analysis_commands(commands, _DEFAULT_DB)
    add_report_command(commands, _DEFAULT_DB)
    add_estimate_command(commands)
    add_methods_command(commands)
    add_db_commands(commands, _DEFAULT_DB)
    add_serve_command(commands)

    bench = commands.add_parser(
        "bench", help="performance benchmarks against the simulator and a strict sliding-window server"
    )
    bench.add_argument("suite", choices=["throughput"])
    bench.add_argument("--json", action="store_true", help="print the results as JSON")
    bench.add_argument("--quick", action="store_true", help="smaller workloads (for smoke tests)")
    bench.add_argument("--markdown", action="store_true", help="print the results as one Markdown table")
    bench.add_argument(
        "--scenario",
        action="append",
        metavar="NAME",
        help="run only this scenario (repeatable; 'window': every window-server scenario; default: every "
        "simulator scenario)",
    )
    bench.add_argument(
        "--client",
        action="append",
        metavar="NAME",
        help="run only this client (repeatable; default: rcarun and its peers)",
    )
    bench.add_argument(
        "--repeats",
        type=int,
        default=1,
        metavar="N",
        help="run every client N times per scenario in rotating order and report its median run (default 1)",
    )
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("rcarun")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


@survives_closed_stdout
def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["mock-server"]:
        return _cmd_mock_server(argparse.Namespace(), argv[1:])
    args = build_parser().parse_args(argv)
    stdout = sys.stdout
    sys.stdout = SafeStdout(stdout)
    try:
        return _run_command(args)
    finally:
        sys.stdout = stdout


def _run_command(args: argparse.Namespace) -> int:
    try:
        if args.command == "sweep":
            return _cmd_sweep(args)
        if args.command == "bench":
            return _cmd_bench(args)
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "methods":
            return cmd_methods(args)
        if args.command in DB_COMMANDS:
            return run_db_command(args, _DEFAULT_DB)
        if args.command == "estimate":
            return cmd_estimate(args)
        if args.command == "score":
            return cmd_score(args)
        if args.command in ("export", "cost", "report"):
            db = Path(_setting(args.db, "RCARUN_DB", _DEFAULT_DB))
            if not db.is_file():
                raise StoreError(f"{db}: no such results database (run a sweep first, or pass --db)")
            run = args.run or os.environ.get("RCARUN_RUN") or None
            command = {"export": cmd_export, "cost": cmd_cost, "report": cmd_report}[args.command]
            return command(args, db, run)
        if args.command == "data":
            return cmd_data_check(args) if args.data_command == "check" else cmd_data_sample_mini(args)
    except RcarunError as exc:
        print(terminal_safe(f"rcarun: {exc}"), file=sys.stderr)
        return 2
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("rcarun: cancelled; results.db is consistent and the run can be resumed", file=sys.stderr)
        return 130
    return 2


def entry() -> int:
    """The ``rcarun`` program: `main`, then the process exits deaf to Ctrl-C.

    Once `main` has returned its status, Python's own shutdown puts SIGINT and SIGTERM back to their default
    action, and a press landing there (a user's third Ctrl-C a moment late) would kill the process by the signal
    instead of letting it exit with the status `main` chose. Ignored signals stay ignored through shutdown.
    """
    status = main()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signum, signal.SIG_IGN)
    return status


if __name__ == "__main__":
    raise SystemExit(entry())
