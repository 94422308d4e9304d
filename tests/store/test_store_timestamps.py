"""Every timestamp in results.db is `utc_timestamp`'s text: what ``datetime.isoformat(timespec="milliseconds")``
writes for UTC with a ``Z``, the moment it was taken (readers parse and compare these across versions)."""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime

import pytest

from rcarun.store import rows
from rcarun.store.rows import utc_timestamp


def _standard() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_a_stamp_is_the_standard_librarys_text_for_the_moment_it_was_taken() -> None:
    for _ in range(20_000):
        before, stamp, after = _standard(), utc_timestamp(), _standard()
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp)
        assert before <= stamp <= after


@pytest.mark.parametrize(
    "epoch_ns", [0, 86_399_999_999_999, 1_764_633_600_999_000_000, 253_402_300_799_001_000_000]
)
def test_the_second_and_the_milliseconds_are_cut_as_isoformat_cuts_them(
    monkeypatch: pytest.MonkeyPatch, epoch_ns: int
) -> None:
    monkeypatch.setattr(rows.time, "time_ns", lambda: epoch_ns)
    moment = datetime.fromtimestamp(epoch_ns // 1_000_000_000, UTC).replace(
        microsecond=epoch_ns % 1_000_000_000 // 1_000
    )
    assert utc_timestamp() == moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_threads_stamping_across_second_boundaries_get_their_own_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each thread's clock is its own: a stamp must carry the second its own clock read, whatever others cached.
    clocks = threading.local()
    monkeypatch.setattr(rows.time, "time_ns", lambda: clocks.now)
    wrong: list[tuple[int, str]] = []

    def stamp_seconds(offset: int) -> None:
        for second in range(offset, offset + 3_000, 2):
            clocks.now = second * 1_000_000_000 + 5_000_000
            text = utc_timestamp()
            expected = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.005Z")
            if text != expected:
                wrong.append((second, text))

    threads = [
        threading.Thread(target=stamp_seconds, args=(offset,)) for offset in (1_700_000_000, 1_700_000_001)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
