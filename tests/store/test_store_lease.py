"""The run lease: one live sweep per run, refused with the holder named, taken over once stale or dead."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rcarun.store import LeaseKeeper, RunBusy, Store, this_process


def _lease(store: Store, run_id: int) -> tuple[str, int, float] | None:
    row = store.connection.execute(
        "SELECT holder, pid, heartbeat_unix FROM run_leases WHERE run_id = ?", (run_id,)
    ).fetchone()
    return None if row is None else (str(row[0]), int(row[1]), float(row[2]))


def test_a_second_process_is_refused_while_the_holder_lives_and_changes_nothing(store: Store) -> None:
    first = this_process()
    run_id = store.get_or_create_run("r", '{"a": 1}', lease=first)
    other = dataclasses.replace(this_process(), pid=os.getpid())  # alive, same machine, another session
    with pytest.raises(RunBusy, match=rf"pid {os.getpid()} on host {first.host}") as refused:
        store.get_or_create_run("r", '{"b": 2}', lease=other)
    assert "already being swept" in str(refused.value)
    # Refused inside the same transaction: the run's config, status and events are as the holder left them.
    run = store.run_by_name("r")
    assert run is not None and run.config_json == '{"a": 1}'
    assert [event.kind for event in store.events(run_id)] == []
    assert _lease(store, run_id) is not None and _lease(store, run_id)[0] == first.holder  # type: ignore[index]


def test_a_lease_of_a_dead_process_on_this_machine_is_taken_over_at_once(store: Store) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a pid that existed and is gone
    dead = dataclasses.replace(this_process(), pid=child.pid)
    run_id = store.get_or_create_run("r", "{}", lease=dead)
    me = this_process()
    assert store.get_or_create_run("r", "{}", lease=me) == run_id
    assert _lease(store, run_id)[0] == me.holder  # type: ignore[index]


def test_a_lease_from_elsewhere_is_taken_over_only_once_its_heartbeat_is_stale(store: Store) -> None:
    far = dataclasses.replace(this_process(), pid=1, host="elsewhere", pid_scope="another machine")
    run_id = store.get_or_create_run("r", "{}", lease=far)
    with pytest.raises(RunBusy, match="pid 1 on host elsewhere"):
        store.get_or_create_run("r", "{}", lease=this_process(), lease_stale_s=30.0)
    store.connection.execute(
        "UPDATE run_leases SET heartbeat_unix = heartbeat_unix - 31 WHERE run_id = ?", (run_id,)
    )
    me = this_process()
    store.get_or_create_run("r", "{}", lease=me, lease_stale_s=30.0)
    assert _lease(store, run_id)[0] == me.holder  # type: ignore[index]


def test_the_keeper_renews_the_heartbeat_says_when_the_lease_is_lost_and_releases_it(
    db_path: Path, store: Store
) -> None:
    me = this_process()
    run_id = store.get_or_create_run("r", "{}", lease=me)
    lost: list[str] = []
    heard = threading.Event()
    keeper = LeaseKeeper(
        db_path, run_id=run_id, me=me, stale_after_s=0.6, on_lost=lambda why: (lost.append(why), heard.set())
    )
    keeper.start()
    try:
        first_beat = _lease(store, run_id)[2]  # type: ignore[index]
        deadline = time.monotonic() + 20
        while _lease(store, run_id)[2] == first_beat and time.monotonic() < deadline:  # type: ignore[index]
            time.sleep(0.02)
        assert _lease(store, run_id)[2] > first_beat  # type: ignore[index]
        # Someone else takes the run over (say this process was suspended past the stale time).
        store.connection.execute(
            "UPDATE run_leases SET holder = 'usurper', pid = 4242 WHERE run_id = ?", (run_id,)
        )
        assert heard.wait(20)
        assert "pid 4242" in lost[0]
    finally:
        keeper.release()
    # The lease it lost is not its to delete.
    assert _lease(store, run_id)[0] == "usurper"  # type: ignore[index]
    mine = this_process()
    store.connection.execute("DELETE FROM run_leases")
    store.get_or_create_run("r", "{}", lease=mine)
    keeper = LeaseKeeper(db_path, run_id=run_id, me=mine)
    keeper.start()
    keeper.release()
    assert _lease(store, run_id) is None
