"""One sweep per run: a lease row in results.db that a live process renews and a dead one lets go stale.

Two sweeps of one run would pay for everything twice; a lock file would outlive a SIGKILL, a renewed lease does
not. Rules: docs/reliability.md ("Run leases").
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rcarun.errors import StoreError
from rcarun.store.connect import DEFAULT_BUSY_TIMEOUT_S, open_connection
from rcarun.store.rows import utc_timestamp

__all__ = [
    "DEFAULT_LEASE_STALE_S",
    "LeaseHolder",
    "LeaseKeeper",
    "RunBusy",
    "claim_lease",
    "live_holder",
    "this_process",
]

DEFAULT_LEASE_STALE_S = 30.0
# Heartbeats per stale period: a live holder renews several times before anyone may call it stale.
_BEATS_PER_STALE_PERIOD = 6


class RunBusy(StoreError):
    """Another live process holds the run's lease."""


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """Who sweeps a run: a unique id per process session, its pid, host name and PID scope, since when."""

    holder: str
    pid: int
    host: str
    pid_scope: str
    started_at: str


def _pid_scope() -> str:
    parts = []
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    with contextlib.suppress(OSError):
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    return "/".join(parts) or socket.gethostname()


def this_process() -> LeaseHolder:
    """A fresh holder identity for the current process."""
    return LeaseHolder(
        holder=uuid.uuid4().hex,
        pid=os.getpid(),
        host=socket.gethostname(),
        pid_scope=_pid_scope(),
        started_at=utc_timestamp(),
    )


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # it exists, under another user
    return False


def live_holder(
    connection: sqlite3.Connection,
    *,
    run_id: int,
    stale_after_s: float,
    me: LeaseHolder | None = None,
    now_unix: float | None = None,
) -> str | None:
    """Who holds the run's lease while alive (``pid P on host H (since ..., last heartbeat N s ago)``), or None
    when nobody does, the holder is ``me``, its heartbeat is ``stale_after_s`` old or its process is gone."""
    now = time.time() if now_unix is None else now_unix
    row = connection.execute(
        "SELECT holder, pid, host, pid_scope, started_at, heartbeat_unix FROM run_leases WHERE run_id = ?",
        (run_id,),
    ).fetchone()
    if row is None or (me is not None and row[0] == me.holder):
        return None
    _, pid, host, scope, started_at, heartbeat = row
    age = max(0.0, now - float(heartbeat))
    dead = scope == (me.pid_scope if me is not None else _pid_scope()) and _process_gone(int(pid))
    if age >= stale_after_s or dead:
        return None
    return f"pid {pid} on host {host} (since {started_at}, last heartbeat {age:.0f} s ago)"


def claim_lease(
    connection: sqlite3.Connection,
    *,
    run_id: int,
    run_name: str,
    me: LeaseHolder,
    stale_after_s: float,
    now_unix: float | None = None,
) -> None:
    """Take the run's lease inside the caller's open write transaction, or raise `RunBusy` naming the holder."""
    now = time.time() if now_unix is None else now_unix
    holder = live_holder(connection, run_id=run_id, stale_after_s=stale_after_s, me=me, now_unix=now)
    if holder is not None:
        raise RunBusy(
            f"run {run_name!r} is already being swept by {holder}; wait for it to end or stop it. A sweep "
            f"that was killed is taken over once its heartbeat is {stale_after_s:g} s old"
        )
    stamp = utc_timestamp()
    connection.execute(
        "INSERT INTO run_leases (run_id, holder, pid, host, pid_scope, started_at, heartbeat_at, heartbeat_unix) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO UPDATE SET holder = excluded.holder, "
        "pid = excluded.pid, host = excluded.host, pid_scope = excluded.pid_scope, "
        "started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at, "
        "heartbeat_unix = excluded.heartbeat_unix",
        (run_id, me.holder, me.pid, me.host, me.pid_scope, me.started_at, stamp, now),
    )


class LeaseKeeper:
    """Renews a claimed lease from a thread of its own (a heartbeat must not wait behind a busy loop), and lets
    it go at the end; ``on_lost`` is called once, from that thread, if another process took the lease."""

    def __init__(
        self,
        path: str | Path,
        *,
        run_id: int,
        me: LeaseHolder,
        stale_after_s: float = DEFAULT_LEASE_STALE_S,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self._path = Path(path)
        self._run_id = run_id
        self._me = me
        self._interval_s = stale_after_s / _BEATS_PER_STALE_PERIOD
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="rcarun-lease", daemon=True)
        self._released = False
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def _beat(self) -> None:
        try:
            connection = open_connection(self._path, busy_timeout_s=self._interval_s, check_same_thread=False)
        except StoreError:
            return
        try:
            while not self._stop.wait(self._interval_s):
                try:
                    cursor = connection.execute(
                        "UPDATE run_leases SET heartbeat_at = ?, heartbeat_unix = ? "
                        "WHERE run_id = ? AND holder = ?",
                        (utc_timestamp(), time.time(), self._run_id, self._me.holder),
                    )
                except sqlite3.Error:
                    continue  # a busy or full file: try again next beat
                if cursor.rowcount == 0:
                    found = connection.execute(
                        "SELECT pid, host FROM run_leases WHERE run_id = ?", (self._run_id,)
                    ).fetchone()
                    who = f"pid {found[0]} on host {found[1]}" if found is not None else "nobody"
                    if self._on_lost is not None:
                        self._on_lost(
                            f"the run's lease is now held by {who}; this sweep stops admitting calls"
                        )
                    return
        finally:
            connection.close()

    def release(self, timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> None:
        """Stop the heartbeat and delete the lease (best effort: a lease that cannot be deleted goes stale)."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=timeout_s)
        try:
            connection = sqlite3.connect(self._path, timeout=timeout_s, isolation_level=None)
        except sqlite3.Error:
            return
        try:
            connection.execute(
                "DELETE FROM run_leases WHERE run_id = ? AND holder = ?", (self._run_id, self._me.holder)
            )
        except sqlite3.Error:
            pass
        finally:
            connection.close()
