"""Measure the figures behind docs/reliability.md against the fault suite's hostile server, and print them.

    .venv/bin/python scripts/fault_figures.py [--json] [--only GROUP]

Each scenario runs `rcarun sweep` as a child process against `tests/faults/hostile.py` (the fault suite's own
server, not the simulator) and reads the server's log beside results.db: server-billed spend against the
budget for prompts billed at 0.25 to 4 tokens a character or a token a UTF-8 byte of emoji and CJK text, and for
answers without usage, at concurrency 16 and 64;
answers served vs stored with 1 bad answer in 8; paid answers lost to a full disk; requests answered twice
when two sweeps start on one run; seconds until a backbone asked to wait a day is stopped; items failed and
interrupted after two Ctrl-Cs; key fragments found anywhere. Exit status 0 when every figure is within its
promise, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import resource
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# The kit lives with the tests, which import it too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from faults.conftest import (
    Child,
    backbone,
    child_environment,
    item_statuses,
    run_cli,
    sweep_args,
    write_dataset,
    write_sweep,
)
from faults.hostile import (
    HostileServer,
    Policy,
    Prices,
    Reply,
    Request,
    Usage,
    answered_twice,
    echo_secret,
    find_secret,
    honest,
    huge_usage,
    infinite_usage,
    make_secret,
    no_usage,
    ok,
    random_text,
    slow,
    status,
    unstored_answers,
)

PRICES = Prices(input_per_mtok=1000, output_per_mtok=20)
MAX_USD = 12.0
BUDGET_ITEMS = 60
# Step text of the wide budget cases: emoji (4 UTF-8 bytes each) and CJK (3 each), as agent logs hold them.
WIDE_TEXT = "🚀✅😀 日本語のログ出力 " * 40
WIDE_BUDGET_SCALE = 12.0


@dataclass
class Figure:
    fault: str
    measured: str
    promise: str
    holds: bool


@contextmanager
def _server(policy: Policy, **kwargs: Any) -> Iterator[HostileServer]:
    with HostileServer(policy, **kwargs).running_in_thread() as server:
        yield server


def _budget(
    workdir: Path,
    label: str,
    usage: Usage,
    concurrency: int,
    *,
    text: Callable[[int], str] = lambda index: "step",
    budget_scale: float = 1.0,
) -> Figure:
    """Server-billed spend over ``max_usd`` (MAX_USD × ``budget_scale``, so that about half the items fit)."""
    max_usd = MAX_USD * budget_scale
    with _server(ok(latency_s=0.2, usage=usage), prices=PRICES) as server:
        config = write_sweep(
            workdir / "sweep.toml",
            dataset=write_dataset(workdir / "data", BUDGET_ITEMS, text=text),
            backbones={
                "fx": backbone(
                    server.base_url,
                    limits={"concurrency": concurrency},
                    prices={
                        "input_per_mtok": PRICES.input_per_mtok,
                        "output_per_mtok": PRICES.output_per_mtok,
                    },
                )
            },
            budget={"max_usd": max_usd},
        )
        run_cli(sweep_args(config, workdir / "results.db", "budget"), cwd=workdir)
        ratio = server.billed_usd() / max_usd
    return Figure(
        f"budget, {label}, concurrency {concurrency}",
        f"server-billed {ratio:.3f} x max_usd",
        "<= 1.05",
        ratio <= 1.05,
    )


def _budget_scenarios() -> list[Callable[[Path], Figure]]:
    """Prompts billed at 0.25 to 4 tokens a character, or one token per UTF-8 byte of wide text, or not reported."""
    cases: list[Callable[[Path], Figure]] = []
    for concurrency in (16, 64):
        for mult in (1, 2, 4, 8, 16):
            cases.append(
                lambda workdir, m=mult, c=concurrency: _budget(
                    workdir, f"prompt billed {m / 4:g} token(s) a character", honest(m), c, budget_scale=m
                )
            )
        cases.append(
            lambda workdir, c=concurrency: _budget(
                workdir,
                "prompt billed a token a UTF-8 byte, emoji/CJK steps",
                honest(4, per_byte=True),
                c,
                text=lambda index: WIDE_TEXT,
                budget_scale=WIDE_BUDGET_SCALE,
            )
        )
        cases.append(
            lambda workdir, c=concurrency: _budget(
                workdir,
                "prompt billed a token a UTF-8 byte, every other trajectory emoji/CJK",
                honest(4, per_byte=True),
                c,
                text=lambda index: WIDE_TEXT if index % 2 else "step",
                budget_scale=(WIDE_BUDGET_SCALE + 4) / 2,
            )
        )
        cases.append(lambda workdir, c=concurrency: _budget(workdir, "no usage sent", no_usage(), c))
        for over in (1.5, 2.0):
            cases.append(
                lambda workdir, o=over, c=concurrency: _budget(
                    workdir,
                    f"completion billed {o:g} x max_tokens",
                    honest(completion_of_budget=o),
                    c,
                )
            )
    return cases


def _unstorable(workdir: Path) -> Figure:
    bad: list[Callable[[], Reply]] = [
        lambda: ok(root_step=10**25),
        lambda: ok(usage=huge_usage()),
        lambda: ok(usage=infinite_usage()),
        lambda: ok(usage=no_usage()),
        lambda: ok(reason="cut mid-emoji \ud800"),
    ]

    def policy(request: Request) -> Reply:
        return bad[request.seq // 8 % len(bad)]() if request.seq % 8 == 7 else ok()

    with _server(policy) as server:
        config = write_sweep(
            workdir / "sweep.toml",
            dataset=write_dataset(workdir / "data", 40),
            backbones={"fx": backbone(server.base_url)},
        )
        result = run_cli(sweep_args(config, workdir / "results.db", "unstorable"), cwd=workdir)
        served = server.served()
        lost = unstored_answers(served, workdir / "results.db")
    done = item_statuses(workdir / "results.db")["done"]
    return Figure(
        "unstorable values (1 answer in 8 over 40 items)",
        f"{len(served) - len(lost)} of {len(served)} answers stored, {done}/40 items done, exit {result.returncode}",
        "all stored, all done, exit 0",
        not lost and done == 40 and result.returncode == 0,
    )


def _disk_full(workdir: Path) -> Figure:
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (400_000, 400_000))

    with _server(ok(latency_s=0.1, reason=random_text(100_000))) as server:
        config = write_sweep(
            workdir / "sweep.toml",
            dataset=write_dataset(workdir / "data", 24),
            backbones={"fx": backbone(server.base_url, limits={"concurrency": 4})},
        )
        result = run_cli(sweep_args(config, workdir / "results.db", "disk"), cwd=workdir, preexec_fn=limit)
        served = server.served()
        lost = unstored_answers(served, workdir / "results.db")
    return Figure(
        "full disk (concurrency 4)",
        f"{len(lost)} of {len(served)} paid answers not stored, exit {result.returncode}",
        "<= 2 x concurrency, exit 2",
        len(lost) <= 8 and result.returncode == 2,
    )


def _two_sweeps(workdir: Path) -> Figure:
    with _server(slow(0.3)) as server:
        config = write_sweep(
            workdir / "sweep.toml",
            dataset=write_dataset(workdir / "data", 12),
            backbones={"fx": backbone(server.base_url, limits={"concurrency": 4})},
        )
        first = Child(sweep_args(config, workdir / "results.db", "twice"), cwd=workdir)
        server.wait_for(lambda log: len(log) >= 1, 30)
        second = run_cli(sweep_args(config, workdir / "results.db", "twice"), cwd=workdir)
        first.wait()
        twice = answered_twice(server.served())
    return Figure(
        "two sweeps on one run",
        f"second exit {second.returncode}; {len(twice)} requests answered twice",
        "refused (exit 2), 0 twice",
        second.returncode == 2 and not twice,
    )


def _long_pause(workdir: Path) -> Figure:
    def bad(request: Request) -> Reply:
        return ok() if request.seq < 2 else status(429, {"Retry-After": "86400"})

    with _server(ok()) as good, _server(bad) as worse:
        config = write_sweep(
            workdir / "sweep.toml",
            dataset=write_dataset(workdir / "data", 8),
            backbones={
                "good": backbone(good.base_url),
                "bad": backbone(
                    worse.base_url, retry={"max_attempts": 3, "base_s": 0.05, "cap_s": 0.5, "max_pause_s": 2}
                ),
            },
        )
        started = time.monotonic()
        result = run_cli(sweep_args(config, workdir / "results.db", "pause"), cwd=workdir)
        elapsed = time.monotonic() - started
    good_done = item_statuses(workdir / "results.db", "good")["done"]
    failed = item_statuses(workdir / "results.db", "bad")["failed"]
    return Figure(
        "Retry-After: 86400 on one of two backbones",
        f"ended in {elapsed:.1f} s, exit {result.returncode}, other backbone {good_done}/8 done, {failed} failed",
        "ends, exit 3, 8/8, 0 failed",
        result.returncode == 3 and good_done == 8 and failed == 0,
    )


def _two_ctrl_c(workdir: Path) -> Figure:
    with _server(slow(3.0)) as server:
        config = write_sweep(
            workdir / "sweep.toml",
            dataset=write_dataset(workdir / "data", 12),
            backbones={"fx": backbone(server.base_url, limits={"concurrency": 4})},
            sweep={"drain_timeout_s": 1},
        )
        child = Child(sweep_args(config, workdir / "results.db", "ctrlc"), cwd=workdir)
        server.wait_for(lambda log: len(log) >= 4, 30)
        child.send(signal.SIGINT)
        time.sleep(0.2)
        child.send(signal.SIGINT)
        result = child.wait()
    statuses = item_statuses(workdir / "results.db")
    return Figure(
        "two Ctrl-Cs with 4 calls in flight",
        f"exit {result.returncode}; {statuses['interrupted']} interrupted, {statuses['failed']} failed",
        "exit 130, 0 failed",
        result.returncode == 130 and statuses["failed"] == 0,
    )


def _secrets(workdir: Path) -> Figure:
    key = make_secret(7)
    found_total = 0
    data = write_dataset(workdir / "data", 1)
    for offset in range(0, 1000, 37):
        with _server(echo_secret(500, key, offset)) as server:
            config = write_sweep(
                workdir / f"sweep-{offset}.toml",
                dataset=data,
                backbones={"fx": backbone(server.base_url, api_key_env="FIGURES_KEY")},
            )
            db = workdir / f"results-{offset}.db"
            result = run_cli(
                sweep_args(config, db, "secret"), cwd=workdir, env=child_environment(FIGURES_KEY=key)
            )
            found_total += len(
                find_secret(key, db=db, texts={"stdout": result.stdout, "stderr": result.stderr})
            )
    return Figure(
        "key echoed by a 500 at offsets 0..999 (27 bodies)",
        f"{found_total} key fragments (8 chars) in results.db, blobs or output",
        "0",
        found_total == 0,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--only",
        choices=("budget", "unstorable", "disk-full", "two-sweeps", "long-pause", "two-ctrl-c", "secrets"),
        help="measure only this group of figures",
    )
    args = parser.parse_args()
    scenarios: list[tuple[str, Callable[[Path], Figure]]] = [
        *(("budget", scenario) for scenario in _budget_scenarios()),
        ("unstorable", _unstorable),
        ("disk-full", _disk_full),
        ("two-sweeps", _two_sweeps),
        ("long-pause", _long_pause),
        ("two-ctrl-c", _two_ctrl_c),
        ("secrets", _secrets),
    ]
    figures = []
    for group, scenario in scenarios:
        if args.only is not None and group != args.only:
            continue
        with tempfile.TemporaryDirectory(prefix="rcarun-faults-") as workdir:
            figures.append(scenario(Path(workdir)))
        print(f"{figures[-1].fault}: {figures[-1].measured}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps([asdict(figure) for figure in figures], indent=2))
    else:
        print("| fault | measured | promise | holds |")
        print("| --- | --- | --- | --- |")
        for figure in figures:
            print(
                f"| {figure.fault} | {figure.measured} | {figure.promise} | {'yes' if figure.holds else 'NO'} |"
            )
    return 0 if all(figure.holds for figure in figures) else 1


if __name__ == "__main__":
    sys.exit(main())
