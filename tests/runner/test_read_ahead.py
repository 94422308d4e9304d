"""A producer reads the dataset a batch ahead (`rcarun.runner.records.read_ahead`): the same events in the
same order as one record at a time, never more than a batch (by records or by characters) loaded before its
items are queued, and a strict dataset's error only after the records met before it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers.sweeps import make_config
from rcarun.data import Record
from rcarun.errors import DataError
from rcarun.runner import SweepConfig, records

_BAD = frozenset({3, 9, 10, 22})


def _write_dataset(root: Path, count: int, *, content_chars: int = 40) -> Path:
    source = root / "synthetic"
    source.mkdir(parents=True)
    for index in range(count):
        path = source / f"{index}.json"
        if index in _BAD:
            path.write_text("{not json")
            continue
        history = [
            {"name": name, "role": "assistant", "content": f"{index}:{step} " + "x" * content_chars}
            for step, name in enumerate(("Planner", "Coder", "Verifier"))
        ]
        path.write_text(json.dumps({"question": f"task {index}", "history": history}))
    return root


def _config(dataset: Path, *, strict: bool = False) -> SweepConfig:
    config = make_config({"sim": {"base_url": "http://127.0.0.1:9"}}, dataset=dataset)
    return config.model_copy(update={"sweep": config.sweep.model_copy(update={"strict_data": strict})})


def _described(event: Record | DataError) -> str:
    return f"problem {event.record}" if isinstance(event, DataError) else event.trajectory.qid


def _one_at_a_time(config: SweepConfig, limit: int | None) -> list[str]:
    """The events as a producer met them before the read-ahead: each problem reported as the walk meets it."""
    met: list[str] = []
    walk = records.iter_records(config, None, lambda problem: met.append(_described(problem)))
    for count, record in enumerate(walk, start=1):
        met.append(_described(record))
        if count == limit:
            break
    return met


@pytest.mark.parametrize("batch", [1, 5, 7, 64])
@pytest.mark.parametrize("limit", [None, 1, 12, 26])
def test_the_events_and_their_order_are_those_of_a_walk_one_record_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: int, limit: int | None
) -> None:
    monkeypatch.setattr(records, "_READ_AHEAD_RECORDS", batch)
    config = _config(_write_dataset(tmp_path, 30))

    read_ahead = [_described(event) for event in records.read_ahead(config, None, limit)]

    assert read_ahead == _one_at_a_time(config, limit)
    assert sum(1 for event in read_ahead if not event.startswith("problem")) == (limit or 30 - len(_BAD))
    if limit is None or limit > 3:
        assert [event for event in read_ahead if event.startswith("problem")][:1] == ["problem synthetic/3"]


class _CountingWalk:
    """`iter_records`, counting the records it has loaded."""

    def __init__(self) -> None:
        self.loaded = 0
        self._iter_records = records.iter_records

    def __call__(self, *args: object) -> Iterator[Record]:
        for record in self._iter_records(*args):  # type: ignore[arg-type]
            self.loaded += 1
            yield record


def _loaded_when_taken(monkeypatch: pytest.MonkeyPatch, dataset: Path, **bounds: int) -> list[int]:
    """For each record the producer takes, how many records the walk had loaded by then (bounds: the module's
    `_READ_AHEAD_*` constants to set, by name)."""
    for name, value in bounds.items():
        monkeypatch.setattr(records, name, value)
    walk = _CountingWalk()
    monkeypatch.setattr(records, "iter_records", walk)
    events = records.read_ahead(_config(dataset), None, None)
    return [walk.loaded for event in events if not isinstance(event, DataError)]


def test_no_more_than_a_batch_of_records_is_loaded_ahead_of_the_producer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = _loaded_when_taken(monkeypatch, _write_dataset(tmp_path, 40), _READ_AHEAD_RECORDS=6)

    assert len(loaded) == 40 - len(_BAD)
    assert all(count - index <= 6 for index, count in enumerate(loaded))
    # Problems count towards a batch as records do (both are held until the producer takes them). The first batch:
    # records 0-2, the problem of 3, records 4-5; the second: 6-8, the problems of 9 and 10, 11.
    assert loaded[:10] == [5] * 5 + [9] * 4 + [15]


def test_a_batch_ends_once_its_records_hold_the_character_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each record here holds three steps of about 1,000 characters: 3,000 characters a record.
    dataset = _write_dataset(tmp_path, 12, content_chars=1_000)

    loaded = _loaded_when_taken(monkeypatch, dataset, _READ_AHEAD_CHARS=7_000)

    # Nine good records (3, 9 and 10 are bad), three to a batch: the third reaches 9,000 characters.
    assert loaded == [3, 3, 3, 6, 6, 6, 9, 9, 9]


def test_a_strict_datasets_error_comes_after_every_record_met_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(records, "_READ_AHEAD_RECORDS", 64)
    delivered: list[str] = []
    with pytest.raises(DataError, match="not valid JSON") as raised:
        for event in records.read_ahead(_config(_write_dataset(tmp_path, 30), strict=True), None, None):
            delivered.append(_described(event))

    assert delivered == ["synthetic/0", "synthetic/1", "synthetic/2"]
    assert raised.value.record == "synthetic/3"
