"""A full disk ends the sweep with one closing line and a consistent results.db, and loses no answered call.

The answers the full results.db refuses are kept in memory and retried while admission is stopped, then written
to a spill file on another disk, which the resume stores before it sends anything. The first test fills a real
file system: a 2 MB tmpfs mounted in a user and mount namespace of the sweep's own (``unshare``), enlarged between
the sweep and its resume; the spill directory is outside it. Every answer the server served is then stored exactly
once and none is sent twice.

The second runs with ``RLIMIT_FSIZE`` far below what it writes (each answer carries ~100 KB of incompressible text,
kept in the stored raw body) and SIGXFSZ ignored, so every write past the limit fails as on a full disk, and with
a spill directory that cannot be made: where the spill fails too, missing from results.db may be only the answers
of the batch that met the full disk (at most one wave of ``concurrency`` calls) and the calls in flight when it
failed (at most ``concurrency``): no call may be sent once the store is known to fail. A resume without the limit
finishes every item and stores no served answer twice.
"""

from __future__ import annotations

import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from faults.conftest import (
    SAFETY_S,
    backbone,
    child_environment,
    item_statuses,
    run_cli,
    sweep_args,
    write_sweep,
)
from faults.hostile import (
    HostileServer,
    Reply,
    Request,
    answer_row_counts,
    answered_twice,
    integrity_check,
    ok,
    random_text,
    unstored_answers,
)

# The disk stays full: the sweep waits this long for space before it stops (sweep.write_wait_s, 120 s by default).
WRITE_WAIT_S = 1
ITEMS = 24
CONCURRENCY = 4
ALLOWED_LOST = 2 * CONCURRENCY  # the batch that failed (one wave of answers) and the calls in flight
FILE_LIMIT = 400_000  # bytes per file: room for the schema and two or three answers, not for twelve
RUN = "diskfull"


def _disk_fills_at(limit: int) -> Callable[[], None]:
    def limit_file_size() -> None:  # runs in the child between fork and exec
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return limit_file_size


def _huge_answer(request: Request) -> Reply:
    return ok(latency_s=0.1, reason=random_text(100_000))


@pytest.mark.slow  # the writer retries a full disk for its 10 s before giving up
def test_a_full_disk_stops_the_sweep_with_one_line_and_loses_only_calls_in_flight(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    server = serve(_huge_answer)
    config = write_sweep(
        tmp_path / "sweep.toml",
        dataset=dataset(ITEMS),
        backbones={"fx": backbone(server.base_url, limits={"concurrency": CONCURRENCY})},
        sweep={"write_wait_s": WRITE_WAIT_S},
    )
    db = tmp_path / "results.db"
    (tmp_path / "not-a-directory").write_text("")
    no_spill = child_environment(RCARUN_SPILL_DIR=str(tmp_path / "not-a-directory" / "spill"))
    result = run_cli(
        sweep_args(config, db, RUN), cwd=tmp_path, env=no_spill, preexec_fn=_disk_fills_at(FILE_LIMIT)
    )

    assert result.returncode == 2, result.describe()
    assert integrity_check(db) == "ok"
    served = server.served()
    lost = unstored_answers(served, db)
    assert len(served) < ITEMS, "the disk never filled: raise the answers' size or lower FILE_LIMIT"
    assert len(lost) <= ALLOWED_LOST, (
        f"{len(lost)} of {len(served)} paid answers not stored (allowed: {ALLOWED_LOST}, twice the concurrency)"
    )

    resumed = run_cli(sweep_args(config, db, RUN), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.describe()
    assert item_statuses(db) == {"done": ITEMS}, f"after resume: {dict(item_statuses(db))}"
    counts = answer_row_counts(server.served(), db)
    assert set(counts) <= {0, 1}, f"served answers by number of rows storing them: {dict(counts)}"

    # One line when it happens (why nothing more is sent), one at the end (what was lost, how to resume).
    lines = result.stderr_lines()
    assert len(lines) == 2, f"expected a warning and a closing line on stderr, got:\n{result.stderr}"
    assert "no new calls are sent" in lines[0], result.stderr
    assert "could not be stored" in lines[1] and "resume with: rcarun sweep" in lines[1], result.stderr
    assert "keeping them in a spill file failed too" in lines[1], result.stderr


TMPFS_ITEMS = 40

# Run in a user and mount namespace of its own: mount a 2 MB tmpfs over the results.db directory, sweep until it
# fills, keep a copy of what results.db then holds, enlarge the tmpfs and resume.
_FULL_THEN_RESUMED = """
set -u
mount -t tmpfs -o size=2m tmpfs "$DB_DIR" || exit 90
"$PYTHON" -m rcarun.cli "$@" >"$OUT/first.out" 2>"$OUT/first.err"; echo $? >"$OUT/first.rc"
mkdir "$OUT/after-first" && cp "$DB_DIR"/results.db* "$OUT/after-first/"
ls "$RCARUN_SPILL_DIR" >"$OUT/spilled" 2>/dev/null
date +%s.%N >"$OUT/resumed-at"
mount -o remount,size=256m "$DB_DIR" || exit 91
"$PYTHON" -m rcarun.cli "$@" >"$OUT/second.out" 2>"$OUT/second.err"; echo $? >"$OUT/second.rc"
mkdir "$OUT/after-second" && cp "$DB_DIR"/results.db* "$OUT/after-second/"
"""


def _namespaces_allowed() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    return probe.returncode == 0


def _instant_huge_answer(request: Request) -> Reply:
    return ok(reason=random_text(100_000))


@pytest.mark.slow  # the writer retries the full disk for its 10 s before it spills
@pytest.mark.skipif(not _namespaces_allowed(), reason="needs unshare and unprivileged user namespaces")
def test_answers_a_full_disk_refused_are_spilled_and_stored_by_the_resume_without_resending(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    server = serve(_instant_huge_answer)
    config = write_sweep(
        tmp_path / "sweep.toml",
        dataset=dataset(TMPFS_ITEMS),
        backbones={"fx": backbone(server.base_url, limits={"concurrency": CONCURRENCY})},
        sweep={"write_wait_s": WRITE_WAIT_S},
    )
    db_dir, out, spill = tmp_path / "db", tmp_path / "out", tmp_path / "spill"
    db_dir.mkdir()
    out.mkdir()
    env = child_environment(
        DB_DIR=str(db_dir), OUT=str(out), PYTHON=sys.executable, RCARUN_SPILL_DIR=str(spill)
    )
    script = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", _FULL_THEN_RESUMED, "sh"]
    finished = subprocess.run(
        [*script, *sweep_args(config, db_dir / "results.db", RUN)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=3 * SAFETY_S,
    )
    assert finished.returncode == 0, f"exit {finished.returncode}: {finished.stderr}"
    first_err = (out / "first.err").read_text()
    assert (out / "first.rc").read_text().strip() == "2", first_err

    resumed_at = float((out / "resumed-at").read_text())
    log = server.served()
    first_log = [entry for entry in log if entry.arrived_at < resumed_at]
    after_first = out / "after-first" / "results.db"
    assert integrity_check(after_first) == "ok"
    refused = unstored_answers(first_log, after_first)
    assert refused, "the disk never refused an answer: raise the answers' size or the items"
    spilled = (out / "spilled").read_text().split()
    assert len(spilled) == 1 and str(spill / spilled[0]) in first_err, first_err
    assert "resume with: rcarun sweep" in first_err, first_err

    second_err = (out / "second.err").read_text()
    assert (out / "second.rc").read_text().strip() == "0", second_err
    assert str(spill / spilled[0]) in second_err, f"the resume did not say it took up the spill: {second_err}"
    final = out / "after-second" / "results.db"
    assert integrity_check(final) == "ok"
    assert item_statuses(final) == {"done": TMPFS_ITEMS}, f"after resume: {dict(item_statuses(final))}"
    counts = answer_row_counts(log, final)
    assert counts == {1: len(log)}, (
        f"served answers by number of rows storing them: {dict(counts)} ({len(refused)} were refused by the "
        "full disk before the resume)"
    )
    assert answered_twice(log) == {}, "a request answered before the disk filled was sent again"
    assert list(spill.iterdir()) == [], f"spill files left behind: {list(spill.iterdir())}"
