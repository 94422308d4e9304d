"""Count the managed replicas that outlive a SIGKILLed rcarun, and what a resume on the same ports runs on.

    PYTHONPATH=src .venv/bin/python scripts/replica_orphans.py [--json]

Each case runs `rcarun sweep` or `rcarun serve` as a child process with two replicas of the fake `vllm` command
(`python -m rcarun.mock.fake_vllm`, each with a child process of its own: 4 processes), kills rcarun with
SIGKILL and counts the replica processes still running 1 s and 5 s later, and how long the last one lived
(at most 15 s are watched). The resume cases kill a sweep on fixed ports and resume it at once: they report the
resume's exit status, how often a process of the killed session was found listening on the resumed run's ports
once it had launched its own replicas (sampled every 0.2 s), and how many of them still ran after the resume
ended (the +1 s and +5 s columns). In the second, the replicas' process-group leaders are SIGKILLed with
rcarun and the replicas ignore SIGTERM, so they outlive it as stale replicas for the resume to find.
Every process still alive at the end of a case is killed by pid. Exit status 0 when no replica outlived its
rcarun by more than 5 s and the resume ran on its own replicas, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# The kit lives with the tests, which use it too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from rcarun.serving.ports import port_holders
from serving.fake import alive, free_port_base, managed_sweep_toml, recorded_pids, start_rcarun, wait_for_pids

_WATCH_S = 15.0


@dataclass
class Outcome:
    case: str
    rcarun_status: int | None
    processes: int
    alive_1s: int
    alive_5s: int
    last_gone_s: float | None  # None: some still alive after _WATCH_S
    note: str = ""


def _watch(pids: list[int], killed_at: float) -> tuple[int, int, float | None]:
    """Processes of ``pids`` alive 1 s and 5 s after ``killed_at``, and when the last one went."""
    counts: dict[float, int] = {}
    last_gone: float | None = None
    while True:
        now = time.monotonic() - killed_at
        living = [pid for pid in pids if alive(pid)]
        if not living and last_gone is None:
            last_gone = now
        for mark in (1.0, 5.0):
            if mark not in counts and now >= mark:
                counts[mark] = len(living)
        if (last_gone is not None and len(counts) == 2) or now > _WATCH_S:
            return counts[1.0], counts[5.0], last_gone
        time.sleep(0.02)


def _kill_left(pid_dir: Path) -> None:
    """SIGKILL, by pid, every fake replica process of a case still running."""
    for pid in recorded_pids(pid_dir):
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _kill_case(case: str, work: Path, behaviour: dict[str, Any], *, serve: bool, settle_s: float) -> Outcome:
    pid_dir = work / "pids"
    pid_dir.mkdir(parents=True)
    config = managed_sweep_toml(work / "sweep.toml", grace_s=2.0)
    behaviour = {**behaviour, "pid_dir": str(pid_dir), "spawn_child": True}
    if serve:
        args = ["serve", "--config", str(config), "--log-dir", str(work / "logs")]
    else:
        args = ["sweep", "--config", str(config), "--db", str(work / "r.db"), "--no-progress"]
    process = start_rcarun(args, behaviour)
    try:
        pids = wait_for_pids(pid_dir, 4, process)
        time.sleep(settle_s)
        process.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        status = process.wait()
        alive_1s, alive_5s, gone = _watch(pids, killed_at)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        _kill_left(pid_dir)
    return Outcome(case, status, len(pids), alive_1s, alive_5s, None if gone is None else round(gone, 2))


def _resume_case(case: str, work: Path, *, guards_too: bool) -> Outcome:
    """SIGKILL a sweep on fixed ports (with ``guards_too``, the process-group leaders of its replicas as well,
    the replicas ignoring the SIGTERM their leader's death sends), then resume it at once."""
    pid_dir = work / "pids"
    pid_dir.mkdir(parents=True)
    base = free_port_base()
    config = managed_sweep_toml(work / "sweep.toml", realizations=20, grace_s=2.0, port_base=base)
    behaviour = {"pid_dir": str(pid_dir), "spawn_child": True, "mock": {"latency_s": 0.5}}
    if guards_too:
        behaviour["ignore_sigterm"] = True
    args = ["sweep", "--config", str(config), "--db", str(work / "r.db"), "--no-progress", "--limit", "2"]
    first = start_rcarun(args, behaviour)
    try:
        killed = set(wait_for_pids(pid_dir, 4, first))
        time.sleep(2.0)
        leaders = {os.getpgid(pid) for pid in killed} if guards_too else set()
        for pid in (first.pid, *leaders):
            os.kill(pid, signal.SIGKILL)
        first.wait()
        resumed = start_rcarun(args, behaviour)
        # Once the resumed run has launched its replicas: is any process of the killed session listening?
        samples = by_killed = 0
        while resumed.poll() is None:
            if len(recorded_pids(pid_dir)) > len(killed):
                for port in (base, base + 1):
                    holders = port_holders("127.0.0.1", port) or []
                    samples += 1
                    by_killed += any(holder.pid in killed for holder in holders)
            time.sleep(0.2)
        stderr = resumed.stderr.read().decode() if resumed.stderr is not None else ""
        left = [pid for pid in killed if alive(pid)]
        lines = [
            line for line in stderr.splitlines() if "stale" in line or "in use" in line or "lost" in line
        ]
        note = (
            f"a process of the killed session listened on the resume's ports in {by_killed} of {samples} samples "
            "after the resume launched its replicas; " + " / ".join(lines[:2])[:400]
        )
    finally:
        _kill_left(pid_dir)
    return Outcome(case, resumed.returncode, len(killed), len(left), len(left), None, note)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    latency = {"mock": {"latency_s": 0.5}}
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="rcarun-orphans-") as tmp:
        root = Path(tmp)
        outcomes.append(_kill_case("sweep SIGKILL mid-run", root / "a", latency, serve=False, settle_s=2.0))
        outcomes.append(
            _kill_case(
                "sweep SIGKILL, replicas ignore SIGTERM",
                root / "b",
                {**latency, "ignore_sigterm": True},
                serve=False,
                settle_s=2.0,
            )
        )
        outcomes.append(
            _kill_case(
                "sweep SIGKILL during start-up", root / "c", {"startup_s": 30}, serve=False, settle_s=0.3
            )
        )
        outcomes.append(_kill_case("serve SIGKILL", root / "d", latency, serve=True, settle_s=1.0))
        outcomes.append(_resume_case("sweep resumed on the same ports", root / "e", guards_too=False))
        outcomes.append(
            _resume_case("same, its guards killed too (SIGTERM ignored)", root / "f", guards_too=True)
        )
    if args.json:
        print(json.dumps([asdict(outcome) for outcome in outcomes], indent=2))
    else:
        print(f"{'case':46} {'exit':>5} {'procs':>5} {'+1 s':>5} {'+5 s':>5} {'last gone':>10}")
        for o in outcomes:
            gone = "-" if o.last_gone_s is None else f"{o.last_gone_s:.2f} s"
            print(
                f"{o.case:46} {o.rcarun_status!s:>5} {o.processes:>5} {o.alive_1s:>5} {o.alive_5s:>5} {gone:>10}"
            )
            if o.note:
                print(f"    {o.note}")
    good = all(o.alive_5s == 0 for o in outcomes) and all(" in 0 of " in o.note for o in outcomes if o.note)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
