"""The chaos sweep: a real sweep against faulty simulators, SIGKILLed and resumed, then reconciled call by call.

Shared by ``tests/chaos/test_chaos_sweep.py`` and ``scripts/chaos_sweep.py``. One seed drives everything that is
drawn: the simulators' fault draws, the kill moments and the sweep itself (the sweep's answers come from the
simulators). The sweep runs as ``python -m rcarun.cli sweep`` in a child process, exactly as a user runs it;
the simulators run in processes of their own that outlive every kill, so their request logs
(``GET /mock/log``) are the ground truth of what was served.

Besides the plain faults (500, 503, 429, hangs, resets, malformed bodies, answers cut short), the simulators
serve the hostile answers the outside fault campaign (shared/reviews/chaos-2026-12.md) found rcarun could not
survive: a step of 10**26, a lone UTF-16 surrogate, nonsense usage (missing, 10**20, Infinity, negative), and
a 429 whose Retry-After asks for a day, a date in 2099 or infinity. A backbone told to wait longer than its
``max_pause_s`` stops for the session, so the sweep exits 3 ("stopped"); the harness then resumes it, as a user
would (a bounded number of times, counted in the report), until a run exits 0. Every child runs under a
wall-clock limit: one that hangs is SIGKILLed and reported, never waited for.

Reconciliation joins the two records of every attempt:
- an answer the server sent (ok / length, and the hostile huge_step / surrogate / bad_usage answers) carries a
  completion id, which rcarun keeps in the raw response body it stores: joined one to one;
- a fault has no id (a reset sends nothing at all): joined by the request's digest (messages + max_tokens,
  `rcarun.mock.request_digest`, which the stored request blob also yields) and the kind of failure, as
  multisets.
A served attempt without a row is a loss; it is explained only if it was answered in the instant before a kill
(the writer's uncommitted batch) or was in flight across the kill (arrived before, answered after), and the
in-flight ones never exceed the backbone's concurrency. A row without a served attempt is always a failure.
Two checks ride along: no ``calls`` row holds a token count outside [0, 2**53] (whatever usage said), and every
stored bad-usage answer says ``usage_source = 'estimated'``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rcarun.data import bundled_sample_path
from rcarun.mock import MockConfig, MockProcess, RequestLogEntry, request_digest

__all__ = [
    "BackboneReconciliation",
    "ChaosBackbone",
    "ChaosReport",
    "chaos_backbones",
    "render_table",
    "run_chaos_sweep",
]

METHODS = ("all-at-once", "binary-search", "rcta")
REALIZATIONS = 2
RUN_NAME = "chaos"
# Trajectories of the bundled sample used (the shorter ones keep the sweep well under a minute on 2 shared cores).
TRAJECTORIES = (
    "algorithm_generated/1.json",
    "algorithm_generated/12.json",
    "algorithm_generated/2.json",
    "algorithm_generated/5.json",
    "algorithm_generated/36.json",
    "hand_crafted/6.json",
)
# An answer served this long before a kill may still sit in the writer's uncommitted batch (it commits every
# 50 ms; the rest is headroom for a commit on a busy shared disk).
UNCOMMITTED_WINDOW_S = 1.0
# The server stamps arrival when its handler starts, a little after the client sent the bytes: a request sent
# in the instant before a kill can carry an arrival stamp just after it. No new child sends within a second.
ARRIVAL_SLACK_S = 0.1
HANG_S = 0.3
LATENCY_S = 0.05
LOG_SIZE = 200_000

_FAULT_RATE = 0.03  # each of six kinds, plus answers cut short: about 20% of requests meet a fault
# The campaign's kinds, rarer: a sweep of some 300 requests per backbone meets each answer kind a few times in
# all and a long pause once or twice.
_HOSTILE_RATE = 0.01
_LONG_PAUSE_RATE = 0.003
# Longest pause the client accepts before it stops the backbone for the session (the long pauses ask for more).
MAX_PAUSE_S = 2
# Resumes after a run that exited 3 (stopped), beyond the kills and the final resume, before giving up.
MAX_EXTRA_RESUMES = 6
# The largest integer a double holds exactly: no token count may come near it.
_TOKEN_CEILING = 2**53
_EXIT_STOPPED = 3
# A run that went to the end: 0, or 4 when items failed for good (their failures are stored, and reconciled).
_FINISHED = (0, 4)
# The least a final run is given, however little of the sweep's time is left (a resume that has nothing left to
# do still starts Python and opens results.db).
_MIN_FINAL_WAIT_S = 30.0


@dataclass(frozen=True, slots=True)
class ChaosBackbone:
    """One simulated backbone: its server's behaviour and the client's settings for it."""

    name: str
    server: MockConfig
    client: Mapping[str, Any]

    @property
    def concurrency(self) -> int:
        return int(self.client["limits"]["concurrency"])


def chaos_backbones(seed: int) -> tuple[ChaosBackbone, ...]:
    """Three backbones with different provider styles, each injecting every fault kind the simulator has."""
    faults: dict[str, Any] = {
        "error_500_rate": _FAULT_RATE,
        "error_503_rate": _FAULT_RATE,
        "timeout_rate": _FAULT_RATE,
        "reset_rate": _FAULT_RATE,
        "malformed_rate": _FAULT_RATE,
        "rate_limit_rate": _FAULT_RATE,
        "length_rate": _FAULT_RATE,
        "huge_step_rate": _HOSTILE_RATE,
        "surrogate_rate": _HOSTILE_RATE,
        "bad_usage_rate": _HOSTILE_RATE,
        "long_pause_rate": _LONG_PAUSE_RATE,
        # Streams cut halfway (a stall until hang_s, then a reset; a dropped connection): stored, and charged.
        "stream_stall_rate": _HOSTILE_RATE,
        "stream_drop_rate": _HOSTILE_RATE,
        # The second campaign's: a gateway's bare 429 now and then must not throttle the run for good, and
        # answers quoting terminal control sequences must reach no terminal raw (`rcarun show` is run on them).
        "bare_rate_limit_rate": _FAULT_RATE,
        "control_rate": _HOSTILE_RATE,
        "rate_limit_retry_after_s": 0.1,
        "hang_s": HANG_S,
        "request_log_size": LOG_SIZE,
        "latency_s": LATENCY_S,
    }
    retry = {"max_attempts": 4, "base_s": 0.02, "cap_s": 0.2, "max_pause_s": MAX_PAUSE_S}
    return (
        ChaosBackbone(
            "chaos-gpt",
            MockConfig(model="chaos-gpt", headers="openai", seed=seed * 10 + 1, **faults),
            {"provider": "simulated", "limits": {"concurrency": 4}, "retry": retry},
        ),
        ChaosBackbone(
            "chaos-deepseek",
            MockConfig(
                model="chaos-deepseek",
                headers="none",
                usage_style="deepseek",
                max_concurrency=3,
                over_concurrency="queue",
                keepalive_s=0.05,
                reasoning_tokens=30,
                seed=seed * 10 + 2,
                **faults,
            ),
            {"provider": "deepseek", "limits": {"concurrency": 3}, "retry": retry},
        ),
        ChaosBackbone(
            "chaos-kimi",
            MockConfig(model="chaos-kimi", headers="moonshot", seed=seed * 10 + 3, **faults),
            {"provider": "kimi", "limits": {"concurrency": 4}, "retry": retry},
        ),
    )


# ------------------------------------------------------------------------------------------------- the report


@dataclass(slots=True)
class BackboneReconciliation:
    """One backbone's two records of the sweep, side by side."""

    backbone: str
    concurrency: int
    served: int = 0  # chat requests in the simulator's log
    served_by_outcome: dict[str, int] = field(default_factory=dict)
    recorded: dict[str, int] = field(default_factory=dict)  # calls rows by status (cached included)
    matched: int = 0  # served attempts found in calls
    lost_uncommitted: int = 0  # answered before a kill, row not yet committed
    lost_in_flight: int = 0  # still in flight at a kill
    max_in_flight_lost_at_one_kill: int = 0
    oldest_uncommitted_loss_s: float = 0.0  # how long before its kill the oldest uncommitted loss was served
    lost_unexplained: int = 0  # served, not recorded, and not near any kill: a failure
    unexplained: list[str] = field(default_factory=list)  # each one's outcome and times relative to the kills
    recorded_not_served: int = 0  # a row the server never served: a failure
    resent_after_stored: int = 0  # a request sent again after its answer was stored: a failure
    resent_after_lost: int = 0  # sent again because the kill lost its answer: expected
    paid_twice: int = 0  # cache keys with more than one ok/length row: a failure
    items_expected: int = 0
    items_done: int = 0
    items_failed: int = 0
    failure_reasons: dict[str, int] = field(default_factory=dict)
    items_missing: int = 0
    items_duplicated: int = 0  # more than one prediction, or a prediction and a failure
    hostile_stored: dict[str, int] = field(default_factory=dict)  # huge_step / ... answers found in calls
    bad_usage_not_estimated: int = 0  # stored bad-usage answers whose usage_source is not 'estimated'
    cuts_stored: int = 0  # streams the server cut halfway, found in calls by their partial answer's id
    cut_not_charged: int = 0  # of those, rows not charged an estimate

    @property
    def lost(self) -> int:
        return self.lost_uncommitted + self.lost_in_flight + self.lost_unexplained

    def problems(self) -> list[str]:
        found = []
        for name in (
            "lost_unexplained",
            "recorded_not_served",
            "resent_after_stored",
            "paid_twice",
            "items_missing",
            "items_duplicated",
            "bad_usage_not_estimated",
            "cut_not_charged",
        ):
            if getattr(self, name):
                found.append(f"{self.backbone}: {name} = {getattr(self, name)}")
        found += [f"{self.backbone}: unexplained loss {detail}" for detail in self.unexplained]
        if self.max_in_flight_lost_at_one_kill > self.concurrency:
            found.append(
                f"{self.backbone}: {self.max_in_flight_lost_at_one_kill} calls in flight lost at one kill, "
                f"more than the concurrency {self.concurrency}"
            )
        if self.served != self.matched + self.lost:
            found.append(
                f"{self.backbone}: served {self.served} != matched {self.matched} + lost {self.lost}"
            )
        return found


@dataclass(slots=True)
class ChaosReport:
    seed: int
    kills_requested: int
    kills: list[float] = field(default_factory=list)  # seconds into the sweep of each SIGKILL
    # Every child in order: "killed" (a planned SIGKILL), its exit code, or "hung" (past its wall-clock limit).
    runs: list[str] = field(default_factory=list)
    extra_resumes: int = 0  # runs started again because the one before exited 3 (stopped)
    final_exit_code: int | None = None  # None: the last run hung and was killed
    # Runs that crashed or hung, each with the last words of its stderr.
    child_failures: list[str] = field(default_factory=list)
    integrity: str = ""
    log_dropped: int = 0
    elapsed_s: float = 0.0
    calls_tokens_out_of_range: int = 0  # calls rows with a token count outside [0, 2**53]
    usage_source_column: bool = False  # calls.usage_source exists (needed to tell estimated usage)
    # Control characters (ESC, C1, a lone CR, backspace) `rcarun show --full` wrote, per trajectory: 0 each.
    terminal_controls: dict[str, int] = field(default_factory=dict)
    backbones: list[BackboneReconciliation] = field(default_factory=list)

    def problems(self) -> list[str]:
        found = [problem for backbone in self.backbones for problem in backbone.problems()]
        found += self.child_failures
        if len(self.kills) != self.kills_requested:
            found.append(f"{len(self.kills)} kills landed mid-sweep, {self.kills_requested} were asked for")
        if self.final_exit_code not in _FINISHED:
            found.append(
                f"the final resume exited with {self.final_exit_code}"
                + (f" after {self.extra_resumes} extra resumes" if self.extra_resumes else "")
            )
        found += [
            f"rcarun show --qid {qid} --full wrote {count} terminal control characters"
            for qid, count in self.terminal_controls.items()
            if count
        ]
        if self.calls_tokens_out_of_range:
            found.append(f"{self.calls_tokens_out_of_range} calls rows hold a token count outside [0, 2**53]")
        if self.backbones and not self.usage_source_column:
            found.append("calls has no usage_source column: estimated usage cannot be told from billed")
        if self.integrity != "ok":
            found.append(f"PRAGMA integrity_check: {self.integrity}")
        if self.log_dropped:
            found.append(
                f"the simulators' logs dropped {self.log_dropped} entries; reconciliation is partial"
            )
        return found

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        for backbone, row in zip(self.backbones, values["backbones"], strict=True):
            row["lost"] = backbone.lost
        values["problems"] = self.problems()
        return values


# --------------------------------------------------------------------------------------------------- the run


def _write_config(workdir: Path, backbones: Iterable[ChaosBackbone], urls: Mapping[str, str]) -> Path:
    dataset = workdir / "dataset"
    for relative in TRAJECTORIES:
        target = dataset / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((bundled_sample_path() / relative).read_bytes())
    lines = [
        "[sweep]",
        f"dataset = {json.dumps(str(dataset))}",
        f"realizations = {REALIZATIONS}",
        "drain_timeout_s = 2",
        "",
        # Small first budgets so that answers also stop on length by themselves, not only by the fault.
        "[stages.attribution]",
        "max_tokens = 120",
        "length_retries = 2",
        "",
    ]
    for method in METHODS:
        lines += ["[[methods]]", f"name = {json.dumps(method)}", ""]
    for backbone in backbones:
        client = backbone.client
        lines += [
            f"[backbones.{backbone.name}]",
            f"provider = {json.dumps(client['provider'])}",
            f"model = {json.dumps(backbone.server.model)}",
            f"base_url = {json.dumps(urls[backbone.name])}",
            "timeout_s = 5",
            f"[backbones.{backbone.name}.limits]",
            *(f"{key} = {json.dumps(value)}" for key, value in client["limits"].items()),
            f"[backbones.{backbone.name}.retry]",
            *(f"{key} = {json.dumps(value)}" for key, value in client["retry"].items()),
            "",
        ]
    path = workdir / "chaos.toml"
    path.write_text("\n".join(lines))
    return path


def _served_total(servers: Mapping[str, MockProcess]) -> int:
    return sum(server.stats().requests_total for server in servers.values())


def run_chaos_sweep(
    workdir: Path,
    seed: int,
    kills: int = 5,
    *,
    timeout_s: float = 300.0,
    max_extra_resumes: int = MAX_EXTRA_RESUMES,
) -> ChaosReport:
    """Run the sweep, SIGKILL it ``kills`` times at seeded random moments, resume to the end, reconcile.

    A run that exits 3 (a backbone stopped by a long pause) is resumed, at most ``max_extra_resumes`` times in
    all. ``timeout_s`` bounds the whole sweep: a child still running when it is spent is SIGKILLed (SIGINT and
    SIGTERM may not stop a hung one) and reported as hung.
    """
    rng = random.Random(f"chaos:{seed}")
    backbones = chaos_backbones(seed)
    report = ChaosReport(seed=seed, kills_requested=kills)
    db = workdir / "results.db"
    servers: dict[str, MockProcess] = {}
    kill_times: list[float] = []
    started = time.time()
    try:
        for backbone in backbones:
            servers[backbone.name] = MockProcess(backbone.server)
            servers[backbone.name].start()
        config = _write_config(workdir, backbones, {name: s.base_url for name, s in servers.items()})
        command = [sys.executable, "-m", "rcarun.cli", "sweep", "--config", str(config), "--db", str(db)]
        command += ["--run", RUN_NAME, "--no-progress"]
        deadline = time.monotonic() + timeout_s
        _kill_phase(report, command, servers, kills, kill_times, rng, deadline, max_extra_resumes)
        _final_phase(report, command, deadline, max_extra_resumes)
        logs = {name: server.request_log() for name, server in servers.items()}
    finally:
        for server in servers.values():
            server.stop()
    # Kept beside results.db so that a failed reconciliation can be examined afterwards.
    (workdir / "server_logs.json").write_text(json.dumps({"kills": kill_times, "logs": logs}))
    report.elapsed_s = round(time.time() - started, 1)
    report.kills = [round(at - started, 2) for at in kill_times]
    report.log_dropped = sum(int(log["dropped"]) for log in logs.values())
    if not db.exists():
        report.integrity = "no results.db was written"
        return report
    with sqlite3.connect(db) as connection:
        report.integrity = "; ".join(row[0] for row in connection.execute("PRAGMA integrity_check"))
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not {"calls", "items", "predictions", "trajectories", "blobs"} <= tables:
            report.integrity += "; results.db lacks rcarun's tables"
            return report
        columns = _columns(connection, "calls")
        report.usage_source_column = "usage_source" in columns
        report.calls_tokens_out_of_range = _tokens_out_of_range(connection, columns)
        qids = _qids(connection)
        for backbone in backbones:
            entries = [RequestLogEntry.from_dict(entry) for entry in logs[backbone.name]["entries"]]
            report.backbones.append(_reconcile(connection, backbone, entries, kill_times, qids))
    report.terminal_controls = {qid: _terminal_controls(db, qid) for qid in qids}
    return report


# What a terminal obeys rather than shows: C0 controls but newline and tab, DEL and C1.
_TERMINAL_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _terminal_controls(db: Path, qid: str) -> int:
    """Control characters in what `rcarun show --full` prints for one trajectory (its prompts quote the steps,
    its answers what the models sent: the "control" answers among them)."""
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "rcarun.cli",
            "show",
            "--db",
            str(db),
            "--run",
            RUN_NAME,
            "--qid",
            qid,
            "--full",
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )
    text = (shown.stdout + shown.stderr).decode(errors="replace")
    return len(_TERMINAL_CONTROL.findall(text.replace("\r\n", "\n")))


def _kill_phase(
    report: ChaosReport,
    command: list[str],
    servers: Mapping[str, MockProcess],
    kills: int,
    kill_times: list[float],
    rng: random.Random,
    deadline: float,
    max_extra_resumes: int,
) -> None:
    """Start the sweep and SIGKILL it mid-flight, ``kills`` times; a run that stops by itself is resumed."""
    while len(kill_times) < kills and time.monotonic() < deadline:
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        killed = False
        try:
            before = _served_total(servers)
            # Kill mid-sweep: once the child is sending, after a random share of a second or so.
            while _served_total(servers) == before and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(rng.uniform(0.05, 0.7))
            if child.poll() is None:
                kill_times.append(time.time())
                os.kill(child.pid, signal.SIGKILL)
                killed = True
        finally:
            if child.poll() is None and not killed:
                child.kill()  # an error in the harness itself: never leave a sweep running behind
            _, stderr = child.communicate()
        if killed:
            report.runs.append("killed")
            continue
        report.runs.append(str(child.returncode))
        if child.returncode == _EXIT_STOPPED and report.extra_resumes < max_extra_resumes:
            report.extra_resumes += 1  # a backbone stopped before the kill landed: resume, kill that one
            continue
        if child.returncode not in _FINISHED:
            report.child_failures.append(
                f"run {len(report.runs)} exited {child.returncode} before kill {len(kill_times) + 1}: "
                + _tail(stderr)
            )
        return


def _final_phase(
    report: ChaosReport,
    command: list[str],
    deadline: float,
    max_extra_resumes: int,
    min_wait_s: float = _MIN_FINAL_WAIT_S,
) -> None:
    """Resume to the end: again after each exit 3 (a backbone stopped), up to ``max_extra_resumes`` in all.

    Each run may take what is left until ``deadline``, never less than ``min_wait_s``; past that it is hung.
    """
    while True:
        limit_s = max(min_wait_s, deadline - time.monotonic())
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            _, stderr = child.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            child.kill()  # SIGKILL: a hung sweep may ignore SIGINT and SIGTERM
            _, stderr = child.communicate()
            report.runs.append("hung")
            report.final_exit_code = None
            report.child_failures.append(
                f"run {len(report.runs)} hung: SIGKILLed after {limit_s:.3g} s; {_tail(stderr)}"
            )
            return
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate()
        report.runs.append(str(child.returncode))
        report.final_exit_code = child.returncode
        if child.returncode == _EXIT_STOPPED and report.extra_resumes < max_extra_resumes:
            report.extra_resumes += 1
            continue
        if child.returncode not in (*_FINISHED, _EXIT_STOPPED):
            sys.stderr.write(stderr.decode(errors="replace")[-4000:])
            report.child_failures.append(f"run {len(report.runs)} exited {child.returncode}: {_tail(stderr)}")
        return


def _tail(stderr: bytes | None, chars: int = 300) -> str:
    """The end of a child's stderr on one line, for the report."""
    text = " | ".join(
        line.strip() for line in (stderr or b"").decode(errors="replace").splitlines() if line.strip()
    )
    return text[-chars:] if text else "(nothing on stderr)"


def _columns(connection: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in connection.execute(f"PRAGMA table_info({table})")}


def _tokens_out_of_range(connection: sqlite3.Connection, columns: Iterable[str]) -> int:
    """Calls rows with any ``*_tokens`` count below 0 or above 2**53 (a float or text counts as out too)."""
    names = sorted(name for name in columns if name.endswith("_tokens"))
    if not names:
        return 0
    test = " OR ".join(
        f"({name} IS NOT NULL AND (typeof({name}) != 'integer' OR {name} < 0 OR {name} > {_TOKEN_CEILING}))"
        for name in names
    )
    return int(connection.execute(f"SELECT COUNT(*) FROM calls WHERE {test}").fetchone()[0])


def _qids(connection: sqlite3.Connection) -> list[str]:
    return [row[0] for row in connection.execute("SELECT DISTINCT qid FROM trajectories ORDER BY qid")]


# --------------------------------------------------------------------------------------------- reconciliation


# Served as 200 completions with an id, like ok answers: rcarun must store them as answers.
HOSTILE_ANSWERS = ("huge_step", "surrogate", "bad_usage", "control")
STREAM_CUTS = ("stream_stall", "stream_drop")


def _server_class(outcome: str) -> str:
    if outcome in ("ok", "length") or outcome in HOSTILE_ANSWERS:
        return "answer"
    if outcome in ("rate_limit", "bare_rate_limit", "long_pause") or outcome.startswith("rejected_"):
        return "429"
    if outcome in ("error_500", "error_503", "malformed"):
        return outcome
    if outcome in ("timeout", "reset", "client_left", "cancelled", *STREAM_CUTS):
        return "no_answer"
    return "other"


def _row_class(status: str, http_status: int | None) -> str:
    if status in ("ok", "length"):
        return "answer"
    if http_status in (500, 503):  # by status, not by row status: Moonshot's 503 means "rate limited"
        return f"error_{http_status}"
    # By status too: the 429 that stops a backbone (a pause past max_pause_s) may be kept under another status.
    if status == "rate_limited" or http_status == 429:
        return "429"
    if http_status is None:
        return "no_answer"
    if http_status == 200:
        return "malformed"
    return "other"


def _blob(connection: sqlite3.Connection, sha256: str | None) -> bytes | None:
    if sha256 is None:
        return None
    row = connection.execute("SELECT zlib_data, text FROM blobs WHERE sha256 = ?", (sha256,)).fetchone()
    if row is None:
        return None
    # Since migration 4 a blob under 64 KiB is kept as text, a larger one compressed.
    return str(row[1]).encode() if row[1] is not None else zlib.decompress(row[0])


@dataclass(frozen=True, slots=True)
class _Row:
    call_id: int
    cache_key: str
    status: str
    kind: str
    digest: str | None
    completion_id: str | None
    usage_source: str | None = None  # None also when results.db has no such column


def _rows(connection: sqlite3.Connection, backbone: str) -> list[_Row]:
    digests: dict[str, str | None] = {}
    rows = []
    usage_source = "usage_source" if "usage_source" in _columns(connection, "calls") else "NULL"
    query = (
        "SELECT call_id, cache_key, status, http_status, request_sha256, response_sha256, "
        f"{usage_source} FROM calls WHERE backbone = ? ORDER BY call_id"
    )
    for call_id, cache_key, status, http_status, request_sha, response_sha, source in connection.execute(
        query, (backbone,)
    ):
        if request_sha not in digests:
            request = _blob(connection, request_sha)
            digest = None
            if request is not None:
                payload = json.loads(request)
                digest = request_digest(payload["messages"], payload["max_tokens"])
            digests[request_sha] = digest
        completion_id = None
        if status in ("ok", "length"):
            body = _blob(connection, response_sha)
            completion_id = json.loads(body.strip()).get("id") if body else None
        elif response_sha is not None and http_status is None:
            # A generation cut short keeps what arrived, its id included.
            with contextlib.suppress(ValueError, AttributeError):
                completion_id = json.loads(_blob(connection, response_sha) or b"").get("id")
        rows.append(
            _Row(
                call_id,
                cache_key,
                status,
                _row_class(status, http_status),
                digests[request_sha],
                completion_id,
                source,
            )
        )
    return rows


def _reconcile(
    connection: sqlite3.Connection,
    backbone: ChaosBackbone,
    entries: list[RequestLogEntry],
    kill_times: list[float],
    qids: list[str],
) -> BackboneReconciliation:
    result = BackboneReconciliation(backbone.name, backbone.concurrency)
    result.served = len(entries)
    result.served_by_outcome = dict(Counter(entry.outcome for entry in entries))
    rows = _rows(connection, backbone.name)
    has_source = "usage_source" in _columns(connection, "calls")  # its absence is the report's problem
    result.recorded = dict(Counter(row.status for row in rows))
    attempts = [row for row in rows if row.status != "cached"]

    # Answers: one to one by completion id.
    answered = {row.completion_id: row for row in attempts if row.kind == "answer"}
    lost: list[RequestLogEntry] = []
    stored_at: dict[str, float] = {}  # cache key -> when the server sent the answer that was stored
    matched_ids: set[str] = set()
    unmatched_faults: Counter[tuple[str | None, str]] = Counter()
    fault_entries: dict[tuple[str | None, str], list[RequestLogEntry]] = defaultdict(list)
    for entry in entries:
        kind = _server_class(entry.outcome)
        if kind == "answer":
            row = answered.get(entry.completion_id)
            if row is None:
                lost.append(entry)
            else:
                matched_ids.add(str(entry.completion_id))
                result.matched += 1
                stored_at.setdefault(row.cache_key, entry.at)
                if entry.outcome in HOSTILE_ANSWERS:
                    result.hostile_stored[entry.outcome] = result.hostile_stored.get(entry.outcome, 0) + 1
                    if entry.outcome == "bad_usage" and has_source and row.usage_source != "estimated":
                        result.bad_usage_not_estimated += 1
        else:
            unmatched_faults[(entry.request_digest, kind)] += 1
            fault_entries[(entry.request_digest, kind)].append(entry)
    result.recorded_not_served += sum(
        1 for row in attempts if row.kind == "answer" and row.completion_id not in matched_ids
    )
    # A stream the server cut halfway was generated (and billed) in part: its row must be charged.
    cut_rows = {row.completion_id: row for row in attempts if row.kind != "answer" and row.completion_id}
    for entry in entries:
        row = cut_rows.get(entry.completion_id) if entry.outcome in STREAM_CUTS else None
        if row is not None:
            result.cuts_stored += 1
            if has_source and row.usage_source != "estimated":
                result.cut_not_charged += 1

    # Faults: multisets of (request digest, kind); a cancelled row (graceful stop) may match any kind.
    wildcard = 0
    for row in attempts:
        if row.kind == "answer":
            continue
        if row.status == "cancelled":
            wildcard += 1
            continue
        key = (row.digest, row.kind)
        if unmatched_faults[key] > 0:
            unmatched_faults[key] -= 1
            result.matched += 1
        else:
            result.recorded_not_served += 1
    for key, count in unmatched_faults.items():
        # Same request, same failure: the entries are interchangeable, so the unrecorded ones are taken among
        # those a kill explains first (an attempt in flight at a kill, then re-sent and recorded, looks alike).
        candidates = sorted(
            fault_entries[key], key=lambda entry: (not _near_kill(entry, kill_times), entry.at)
        )
        lost += candidates[:count]
    absorbed = min(wildcard, len(lost))
    result.matched += absorbed
    result.recorded_not_served += wildcard - absorbed
    lost = sorted(lost, key=lambda entry: entry.at)[absorbed:]

    _classify_losses(result, lost, kill_times)
    _count_resends(result, rows, entries, stored_at, lost)
    _check_items(connection, result, qids)
    return result


def _near_kill(entry: RequestLogEntry, kill_times: list[float]) -> bool:
    return any(
        entry.arrived_at - ARRIVAL_SLACK_S <= killed < entry.at
        or killed - UNCOMMITTED_WINDOW_S <= entry.at <= killed
        for killed in kill_times
    )


def _classify_losses(
    result: BackboneReconciliation, lost: list[RequestLogEntry], kill_times: list[float]
) -> None:
    """A loss is explained by a kill it straddled (in flight) or closely followed (uncommitted), nothing else."""
    in_flight_per_kill: Counter[int] = Counter()
    for entry in lost:
        straddled = [
            k
            for k, killed in enumerate(kill_times)
            if entry.arrived_at - ARRIVAL_SLACK_S <= killed < entry.at
        ]
        followed = [killed for killed in kill_times if killed - UNCOMMITTED_WINDOW_S <= entry.at <= killed]
        if straddled:
            result.lost_in_flight += 1
            in_flight_per_kill[straddled[0]] += 1
        elif followed:
            result.lost_uncommitted += 1
            result.oldest_uncommitted_loss_s = max(
                result.oldest_uncommitted_loss_s, round(followed[0] - entry.at, 3)
            )
        else:
            result.lost_unexplained += 1
            nearest = min(kill_times, key=lambda killed: abs(killed - entry.at), default=entry.at)
            result.unexplained.append(
                f"#{entry.seq} {entry.outcome}: arrived {entry.arrived_at - nearest:+.3f} s, answered "
                f"{entry.at - nearest:+.3f} s from the nearest kill"
            )
    result.max_in_flight_lost_at_one_kill = max(in_flight_per_kill.values(), default=0)


def _count_resends(
    result: BackboneReconciliation,
    rows: list[_Row],
    entries: list[RequestLogEntry],
    stored_at: Mapping[str, float],
    lost: list[RequestLogEntry],
) -> None:
    """Re-sends of stored answers, seen from both sides.

    In results.db: a cache key with two paid (ok / length) rows. At the server: a request arriving when every
    cache key that ever asked it (realizations send identical requests) already had its answer stored.
    Also counts, for information, lost attempts whose request was sent again later (the expected re-ask).
    """
    paid = Counter(row.cache_key for row in rows if row.status in ("ok", "length"))
    result.paid_twice = sum(count - 1 for count in paid.values() if count > 1)
    askers: dict[str | None, set[str]] = defaultdict(set)
    for row in rows:
        askers[row.digest].add(row.cache_key)
    for entry in entries:
        keys = askers.get(entry.request_digest, set())
        if keys and all(key in stored_at and stored_at[key] < entry.at for key in keys):
            result.resent_after_stored += 1
    last_sent: dict[str | None, float] = {}
    for entry in entries:
        last_sent[entry.request_digest] = max(entry.at, last_sent.get(entry.request_digest, entry.at))
    result.resent_after_lost = sum(1 for entry in lost if last_sent[entry.request_digest] > entry.at)


def _check_items(connection: sqlite3.Connection, result: BackboneReconciliation, qids: list[str]) -> None:
    predictions = Counter(
        (method, qid, realization)
        for method, qid, realization in connection.execute(
            "SELECT method, qid, realization FROM predictions WHERE backbone = ?", (result.backbone,)
        )
    )
    items = {
        (method, qid, realization): (status, error)
        for method, qid, realization, status, error in connection.execute(
            "SELECT method, qid, realization, status, error FROM items WHERE backbone = ?", (result.backbone,)
        )
    }
    reasons: Counter[str] = Counter()
    for method in METHODS:
        for qid in qids:
            for realization in range(REALIZATIONS):
                key = (method, qid, realization)
                result.items_expected += 1
                status, error = items.get(key, (None, None))
                if predictions[key] > 1 or (predictions[key] == 1 and status == "failed"):
                    result.items_duplicated += 1
                elif predictions[key] == 1 and status == "done":
                    result.items_done += 1
                elif predictions[key] == 0 and status == "failed" and error:
                    result.items_failed += 1
                    reasons[str(error).split(":")[0][:60]] += 1
                else:
                    result.items_missing += 1
    result.failure_reasons = dict(reasons)


# ------------------------------------------------------------------------------------------------ the table


_STATUSES = ("ok", "length", "error", "rate_limited", "cancelled", "cached")


def render_table(report: ChaosReport) -> str:
    """The reconciliation table, one row per backbone, and the verdict."""
    header = (
        f"{'backbone':<15} {'served':>6} {'matched':>7} "
        + " ".join(f"{status[:7]:>7}" for status in _STATUSES)
        + f" {'lost@kill':>9} {'(in-flight/conc)':>16} {'unexpl':>6} {'rec!srv':>7} {'resent':>6}"
        + f" {'re-ask':>6} {'done':>5} {'failed':>6} {'missing':>7}"
    )
    lines = [
        f"chaos sweep seed {report.seed}: {len(report.kills)} SIGKILLs"
        + (f" at {', '.join(f'{at:.1f}s' for at in report.kills)}" if report.kills else "")
        + f"; {report.elapsed_s:.0f} s in all; "
        f"final resume exit {'hung' if report.runs[-1:] == ['hung'] else report.final_exit_code}; "
        f"integrity_check {report.integrity}",
        header,
        "-" * len(header),
    ]
    for b in report.backbones:
        lines.append(
            f"{b.backbone:<15} {b.served:>6} {b.matched:>7} "
            + " ".join(f"{b.recorded.get(status, 0):>7}" for status in _STATUSES)
            + f" {b.lost_uncommitted + b.lost_in_flight:>9}"
            + f" {f'{b.lost_in_flight} (max {b.max_in_flight_lost_at_one_kill}/{b.concurrency})':>16}"
            + f" {b.lost_unexplained:>6} {b.recorded_not_served:>7} {b.resent_after_stored:>6}"
            + f" {b.resent_after_lost:>6} {b.items_done:>5} {b.items_failed:>6} {b.items_missing:>7}"
        )
    reasons: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    hostile: Counter[str] = Counter()
    for b in report.backbones:
        reasons.update(b.failure_reasons)
        outcomes.update(b.served_by_outcome)
        hostile.update(b.hostile_stored)
    lines.append("served by outcome: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    lines.append("runs: " + " → ".join(report.runs) + f"; extra resumes after exit 3: {report.extra_resumes}")
    if report.backbones:
        not_estimated = sum(b.bad_usage_not_estimated for b in report.backbones)
        estimated = (
            f"{hostile['bad_usage'] - not_estimated} of {hostile['bad_usage']} bad-usage rows 'estimated'"
            if report.usage_source_column
            else "no calls.usage_source column"
        )
        lines.append(
            "hostile answers stored: "
            + ", ".join(f"{kind} {hostile[kind]}" for kind in HOSTILE_ANSWERS)
            + f"; {estimated}; token counts outside [0, 2**53]: {report.calls_tokens_out_of_range}"
        )
    if reasons:
        lines.append("failed items by reason: " + "; ".join(f"{k} ×{v}" for k, v in reasons.most_common()))
    problems = report.problems()
    lines.append("verdict: " + ("OK" if not problems else "FAILED: " + "; ".join(problems)))
    return "\n".join(lines)
