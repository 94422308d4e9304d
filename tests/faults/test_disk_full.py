"""A full disk ends the sweep with one closing line and a consistent results.db, losing only the calls around the moment.

The sweep runs with ``RLIMIT_FSIZE`` far below what it writes (each answer carries ~100 KB of incompressible text,
kept in the stored raw body) and SIGXFSZ ignored, so every write past the limit fails as on a full disk. The
server's log says how many answers were paid for. Missing from results.db may be only the answers of the batch
that met the full disk (at most one wave of ``concurrency`` calls) and the calls in flight when it failed (at most
``concurrency``): no call may be sent once the store is known to fail. A resume without the limit finishes every
item and stores no served answer twice.
"""

from __future__ import annotations

import resource
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from faults.conftest import backbone, item_statuses, run_cli, sweep_args, write_sweep
from faults.hostile import (
    HostileServer,
    Reply,
    Request,
    answer_row_counts,
    integrity_check,
    ok,
    random_text,
    unstored_answers,
)

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
    )
    db = tmp_path / "results.db"
    result = run_cli(sweep_args(config, db, RUN), cwd=tmp_path, preexec_fn=_disk_fills_at(FILE_LIMIT))

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
