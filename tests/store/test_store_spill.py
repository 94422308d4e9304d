"""Rows a failing results.db refuses to the end go to a spill file, which the run's next start stores once."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rcarun.errors import StoreError
from rcarun.store import SPILL_DIR_VARIABLE, EventRow, StoreWriter, take_up_spill

RowMaker = Callable[..., Any]
GUARD_S = 20.0  # a broken close fails the test instead of hanging it; never a timing claim


def _count(db_path: Path, sql: str) -> int:
    with sqlite3.connect(db_path) as connection:
        return int(connection.execute(sql).fetchone()[0])


async def _spill_four_answers(db_path: Path, run_id: int, make_call: RowMaker) -> tuple[StoreWriter, str]:
    """Commit one call, break the file under the writer, queue an event and four answered calls, close.

    Returns the writer and the SQL that makes the broken table again.
    """
    with sqlite3.connect(db_path) as connection:
        create_events = connection.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'run_events'"
        ).fetchone()[0]
    writer = StoreWriter(db_path, run_id, flush_interval_s=0.0, give_up_after_s=0.3, spill_run_id=run_id)
    async with writer:
        writer.add_call(make_call(run_id))
        await writer.flush()
        saboteur = sqlite3.connect(db_path)
        saboteur.execute("DROP TABLE run_events")
        saboteur.close()
        writer.add_event(EventRow(run_id, "budget_stop"))
        answer = writer.put_blob(b"the answer " * 100)
        for attempt in range(2, 6):
            writer.add_call(make_call(run_id, attempt=attempt, response_sha256=answer))
        with pytest.raises(StoreError, match="its 4 answered calls") as final:
            await asyncio.wait_for(writer.__aexit__(None, None, None), GUARD_S)
    assert writer.spilled_to is not None and str(writer.spilled_to) in str(final.value)
    assert writer.unstored_answers == 0
    return writer, create_events


async def test_rows_refused_to_the_end_are_spilled_and_stored_once_by_the_next_start(
    db_path: Path, run_id: int, make_call: RowMaker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SPILL_DIR_VARIABLE, str(tmp_path / "spill"))
    writer, create_events = await _spill_four_answers(db_path, run_id, make_call)
    spill = writer.spilled_to
    assert spill is not None and spill.parent == tmp_path / "spill"
    assert spill.stat().st_mode & 0o777 == 0o600, "a spill holds prompts and answers: its owner's alone"
    assert _count(db_path, "SELECT count(*) FROM calls") == 1

    with sqlite3.connect(db_path) as connection:  # the disk is fixed
        connection.execute(create_events)
    kept = spill.read_bytes()
    told = take_up_spill(db_path, run_id)
    assert len(told) == 1 and str(spill) in told[0] and "4 answered calls" in told[0], told
    assert not spill.exists()
    assert _count(db_path, "SELECT count(*) FROM calls") == 5
    assert _count(db_path, "SELECT count(*) FROM blobs") == 1
    assert _count(db_path, "SELECT count(*) FROM run_events WHERE kind = 'budget_stop'") == 1

    # Found again (a kill between the commit and the removal): removed, not stored a second time.
    spill.write_bytes(kept)
    assert take_up_spill(db_path, run_id) == []
    assert not spill.exists()
    assert _count(db_path, "SELECT count(*) FROM calls") == 5


async def test_a_spill_the_run_has_gone_on_without_is_left_as_is(
    db_path: Path, run_id: int, make_call: RowMaker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SPILL_DIR_VARIABLE, str(tmp_path / "spill"))
    writer, create_events = await _spill_four_answers(db_path, run_id, make_call)
    spill = writer.spilled_to
    assert spill is not None
    with sqlite3.connect(db_path) as connection:
        connection.execute(create_events)
    # A session that did not read the spill stored calls of the run since.
    async with StoreWriter(db_path, run_id) as later:
        later.add_call(make_call(run_id, qid="q2"))

    told = take_up_spill(db_path, run_id)
    assert len(told) == 1 and "left as is" in told[0], told
    assert spill.exists()
    assert _count(db_path, "SELECT count(*) FROM calls") == 2

    # The run fills the disk again: the new spill does not replace the one left, and is the one stored.
    again, _ = await _spill_four_answers(db_path, run_id, make_call)
    with sqlite3.connect(db_path) as connection:
        connection.execute(create_events)
    assert again.spilled_to is not None and again.spilled_to != spill
    told = take_up_spill(db_path, run_id)
    assert len(told) == 2 and "left as is" in told[0] and "4 answered calls" in told[1], told
    assert spill.exists() and not again.spilled_to.exists()
    assert _count(db_path, "SELECT count(*) FROM calls") == 7
