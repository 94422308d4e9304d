"""The dataset as a sweep reads it: the records (or only those a manifest lists), read a batch ahead."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

from rcarun.data import Manifest, Record, iter_dataset, load_manifest
from rcarun.errors import DataError
from rcarun.runner.config import SweepConfig

__all__ = ["iter_records", "load_sweep_manifest", "read_ahead"]

# A producer loads this many records (or this many characters of steps, whichever comes first) before it queues
# their items: with the loader's code and data warm, a call of the bench's latency-bound run takes 0.945 of the
# CPU (docs/performance.md, "CPU per call"). Both bounds cap what the read-ahead adds to a producer's memory.
_READ_AHEAD_RECORDS = 256
_READ_AHEAD_CHARS = 4 * 2**20


def load_sweep_manifest(config: SweepConfig) -> Manifest | None:
    name = config.sweep.manifest
    return None if name is None else load_manifest(name)


def iter_records(
    config: SweepConfig, manifest: Manifest | None, on_problem: Callable[[DataError], None]
) -> Iterator[Record]:
    """The dataset's records, or only those a manifest lists with the SHA-256 it pins.

    A listed record whose bytes differ is a data problem and is left out (the manifest promises those exact
    bytes); a listed qid the dataset lacks is reported once the dataset has been read.
    """
    records = iter_dataset(Path(config.sweep.dataset), strict=config.sweep.strict_data, on_problem=on_problem)
    if manifest is None:
        yield from records
        return
    # The listed records not met yet: shrinks as the dataset is read (no second set of the qids met).
    listed = manifest.by_qid()
    for record in records:
        entry = listed.pop(record.trajectory.qid, None)
        if entry is None:
            continue
        if entry.sha256 != record.trajectory.sha256:
            on_problem(
                DataError(
                    f"SHA-256 {record.trajectory.sha256} differs from the manifest's {entry.sha256}; left out",
                    path=record.origin,
                    record=entry.qid,
                )
            )
            continue
        yield record
    for entry in manifest.records:
        if entry.qid in listed:
            on_problem(DataError("listed in the manifest but not in the dataset", record=entry.qid))


def read_ahead(
    config: SweepConfig, manifest: Manifest | None, limit: int | None
) -> Iterator[Record | DataError]:
    """`iter_records` (at most ``limit`` records) and the problems it meets, in the order met, a batch at a time.

    Every walk of the dataset sees the same events in the same order, as `TrajectoryRecorder` needs. An error
    (a strict dataset's first problem) is raised once the events met before it are delivered.
    """
    met: list[Record | DataError] = []
    records = itertools.islice(iter_records(config, manifest, met.append), limit)
    while True:
        chars = 0
        exhausted = True
        try:
            for record in records:
                met.append(record)
                chars += sum(len(step.content) for step in record.trajectory.steps)
                if len(met) >= _READ_AHEAD_RECORDS or chars >= _READ_AHEAD_CHARS:
                    exhausted = False
                    break
        except Exception:
            yield from met
            raise
        # The walk is paused while the batch is handed on: nothing is added to it meanwhile.
        yield from met
        met.clear()
        if exhausted:
            return
