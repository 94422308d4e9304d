"""Fixtures of the fault tests: hostile servers, small datasets, sweep configs, and sweeps run under a safety net.

A sweep runs either as ``python -m rcarun.cli sweep`` in a child process (exit codes, signals, resource limits;
killed and reported as hung when it outlives its wall-clock bound) or in-process through `rcarun.runner.run_sweep`
in a thread with its own loop (faster; a hung sweep is left behind in its daemon thread and the test fails). The
bounds are generous safety nets that catch hangs; the tests assert counts, never speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from faults.hostile import HostileServer, Policy, db_rows
from helpers.badinput import good_trajectory

SAFETY_S = 60.0
"""Wall-clock bound of one sweep: far above what any of these sweeps needs, so only a hang reaches it."""

MODEL = "hostile-model"
RETRY = {"max_attempts": 3, "base_s": 0.05, "cap_s": 0.5}


# ------------------------------------------------------------------------------------------------ servers


@pytest.fixture
def serve() -> Iterator[Callable[..., HostileServer]]:
    """Start hostile servers in background threads (``serve(policy, prices=..., lifetime_s=...)``), stopped after
    the test."""
    with contextlib.ExitStack() as stack:

        def start(policy: Policy | None = None, **kwargs: Any) -> HostileServer:
            return stack.enter_context(HostileServer(policy, **kwargs).running_in_thread())

        yield start


# ------------------------------------------------------------------------------------------------ data


def write_dataset(
    root: Path, n: int, *, steps: int = 4, text: Callable[[int], str] = lambda index: "step"
) -> Path:
    """``n`` small Who&When-shaped trajectories (agents A0 and A1), each with its own task and step texts, so that
    no two send the same prompt; ``text(index)`` is what every step of trajectory ``index`` says."""
    (root / "src").mkdir(parents=True)
    for index in range(n):
        record = good_trajectory(
            steps, content=f"trajectory {index} {text(index)}", question=f"task number {index}"
        )
        (root / "src" / f"{index}.json").write_text(json.dumps(record))
    return root


@pytest.fixture
def dataset(tmp_path: Path) -> Callable[..., Path]:
    """``dataset(n)``: a directory of ``n`` small trajectories under ``tmp_path`` (`write_dataset`)."""
    made = 0

    def make(n: int, *, steps: int = 4, text: Callable[[int], str] = lambda index: "step") -> Path:
        nonlocal made
        made += 1
        return write_dataset(tmp_path / f"data{made}", n, steps=steps, text=text)

    return make


# ------------------------------------------------------------------------------------------------ configs


def backbone(url: str, **settings: Any) -> dict[str, Any]:
    """An ``openai-compatible`` backbone on a hostile server: short timeout and retries, 4 calls in flight."""
    table: dict[str, Any] = {
        "provider": "openai-compatible",
        "model": MODEL,
        "base_url": url,
        "timeout_s": 5,
        "limits": {"concurrency": 4},
        "retry": dict(RETRY),
    }
    for name, value in settings.items():
        if isinstance(value, Mapping) and isinstance(table.get(name), dict):
            table[name] = {**table[name], **value}
        else:
            table[name] = value
    return table


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON's escapes are TOML basic-string escapes
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def write_sweep(
    path: Path,
    *,
    dataset: Path,
    backbones: Mapping[str, Mapping[str, Any]],
    methods: Sequence[str | Mapping[str, Any]] = ("all-at-once",),
    sweep: Mapping[str, Any] | None = None,
    budget: Mapping[str, Any] | None = None,
) -> Path:
    """A sweep TOML: ``[sweep]`` (dataset, 1 realization, ``drain_timeout_s = 2`` unless given), methods, backbones."""
    lines = ["[sweep]", f"dataset = {_toml(str(dataset))}"]
    for key, value in {"realizations": 1, "drain_timeout_s": 2, **(sweep or {})}.items():
        lines.append(f"{key} = {_toml(value)}")
    if budget:
        lines += ["", "[budget]", *(f"{key} = {_toml(value)}" for key, value in budget.items())]
    for method in methods:
        fields: Mapping[str, Any] = {"name": method} if isinstance(method, str) else method
        lines += ["", "[[methods]]", *(f"{key} = {_toml(value)}" for key, value in fields.items())]
    for name, table in backbones.items():
        lines += ["", f"[backbones.{name}]", *(f"{key} = {_toml(value)}" for key, value in table.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


# ------------------------------------------------------------------------------------------------ running


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float

    def stderr_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]

    def describe(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}"


def sweep_args(config: Path, db: Path, run: str, *extra: str) -> list[str]:
    return ["sweep", "--config", str(config), "--db", str(db), "--run", run, "--no-progress", *extra]


def child_environment(**variables: str) -> dict[str, str]:
    env = {**os.environ, **variables}
    env.pop("RCARUN_DB", None)
    env.pop("RCARUN_RUN", None)
    return env


class Child:
    """``python -m rcarun.cli ARGS`` as a child process, its output in files (no pipe can fill and block it)."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str] | None = None,
        preexec_fn: Callable[[], None] | None = None,
        name: str = "child",
    ) -> None:
        self.args = list(args)
        self._out = cwd / f"{name}-{os.getpid()}-{id(self)}.out"
        self._err = cwd / f"{name}-{os.getpid()}-{id(self)}.err"
        with self._out.open("wb") as out, self._err.open("wb") as err:
            self.started = time.monotonic()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rcarun.cli", *self.args],
                cwd=cwd,
                env=dict(env) if env is not None else child_environment(),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                preexec_fn=preexec_fn,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, signum: int) -> None:
        self.process.send_signal(signum)

    def running(self) -> bool:
        return self.process.poll() is None

    def wait(self, timeout_s: float = SAFETY_S, *, what: str = "rcarun") -> CliResult:
        """The exit code and output; a child still running after ``timeout_s`` is killed and the test fails."""
        try:
            returncode = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(
                f"{what} hung: still running {timeout_s:.0f} s later (killed)\n{self._result(-9).describe()}"
            )
        return self._result(returncode)

    def _result(self, returncode: int) -> CliResult:
        return CliResult(
            returncode=returncode,
            stdout=self._out.read_text(errors="replace"),
            stderr=self._err.read_text(errors="replace"),
            elapsed_s=time.monotonic() - self.started,
        )

    def kill(self) -> None:
        if self.running():
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def children() -> Iterator[list[Child]]:
    """Children started by a test are killed when it ends, whatever happened."""
    started: list[Child] = []
    yield started
    for child in started:
        child.kill()


def run_cli(
    args: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    timeout_s: float = SAFETY_S,
    preexec_fn: Callable[[], None] | None = None,
) -> CliResult:
    """Run ``rcarun ARGS`` to the end (the test fails, naming a hang, if it outlives ``timeout_s``)."""
    child = Child(args, cwd=cwd, env=env, preexec_fn=preexec_fn)
    try:
        return child.wait(timeout_s, what=f"rcarun {' '.join(args[:1])}")
    finally:
        child.kill()


def run_in_process(config: Path, db: Path, run: str, *, timeout_s: float = SAFETY_S) -> Any:
    """`run_sweep` on the config file in a thread with its own loop; the `SweepOutcome`, or the test fails when
    the sweep raised or outlived ``timeout_s`` (a hung sweep stays behind in its daemon thread)."""
    from rcarun.runner import load_sweep_config, run_sweep

    result: list[Any] = []
    failure: list[BaseException] = []

    def main() -> None:
        try:
            sweep = load_sweep_config(config)
            result.append(asyncio.run(run_sweep(sweep, db_path=db, run_name=run, show_progress=False)))
        except BaseException as exc:  # handed to the test thread
            failure.append(exc)

    thread = threading.Thread(target=main, name="sweep", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        pytest.fail(f"run_sweep hung: still running {timeout_s:.0f} s later")
    if failure:
        raise failure[0]
    return result[0]


# ------------------------------------------------------------------------------------------------ results.db


def item_statuses(db: Path, backbone: str | None = None) -> Counter[str]:
    sql = (
        "SELECT status, COUNT(*) FROM items"
        + (" WHERE backbone = ?" if backbone else "")
        + " GROUP BY status"
    )
    return Counter({row[0]: row[1] for row in db_rows(db, sql, (backbone,) if backbone else ())})


def run_status(db: Path, run: str) -> str:
    rows = db_rows(db, "SELECT status FROM runs WHERE name = ?", (run,))
    return str(rows[0][0]) if rows else "(no run row)"


def column_names(db: Path, table: str) -> set[str]:
    return {str(row[1]) for row in db_rows(db, f"PRAGMA table_info({table})")}
