"""Spill files: the rows a full results.db could not take, kept on another disk until a resume stores them.

A spill file is JSON lines (a header naming the results.db, the run and its calls so far, then one record per
row), written whole or not at all, on another file system than results.db where one is at hand; a resume of the
same run finds it by name. Details: docs/reliability.md ("Spill files").
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import os
import sqlite3
import tempfile
import uuid
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from rcarun.errors import StoreError
from rcarun.store.batch import TABLES, BatchWriter, Blob, Row, answered_calls
from rcarun.store.connect import DEFAULT_BUSY_TIMEOUT_S
from rcarun.store.rows import EventRow

__all__ = [
    "SPILL_DIR_VARIABLE",
    "SPILL_TAKEN_UP",
    "SpillHeader",
    "find_spills",
    "read_spill",
    "spill_dirs",
    "spill_rows",
    "take_up_spill",
    "write_spill",
]

SPILL_DIR_VARIABLE: Final = "RCARUN_SPILL_DIR"
SPILL_TAKEN_UP: Final = "spill_taken_up"
_FORMAT: Final = "rcarun-spill"
_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class SpillHeader:
    """Whose rows a spill file holds: the results.db and run, and ``calls_before``, the run's largest call_id
    then (a file with other calls since went on without the spill)."""

    db: str
    run_id: int
    run_name: str
    run_created_at: str
    calls_before: int
    spill_id: str
    rows: int
    answered: int


def _name_prefix(db: Path, run_id: int) -> str:
    digest = hashlib.sha256(str(db.resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return f"rcarun-{digest}-run{run_id}-"


_SUFFIX: Final = ".spill.jsonl"


def _device(path: Path) -> int | None:
    for place in (path, *path.parents):
        with contextlib.suppress(OSError):
            return place.stat().st_dev
    return None


def spill_dirs(db: Path) -> list[Path]:
    """Where spill files of ``db`` go, best first (docs/reliability.md, "Spill files")."""
    chosen = os.environ.get(SPILL_DIR_VARIABLE)
    if chosen:
        return [Path(chosen)]
    places = [Path(tempfile.gettempdir())]
    state = os.environ.get("XDG_STATE_HOME")
    with contextlib.suppress(RuntimeError):  # no home directory to be found
        state = state or str(Path.home() / ".local" / "state")
    if state:
        places.insert(0, Path(state) / "rcarun" / "spill")
    db_device = _device(db.resolve().parent)
    return sorted(
        places, key=lambda place: _device(place) == db_device
    )  # stable: state dir first among equals


def find_spills(db: Path, run_id: int) -> list[Path]:
    """The spill files of ``db``'s run ``run_id``, wherever `spill_dirs` would have put them, oldest first."""
    prefix = _name_prefix(db, run_id)
    found: list[tuple[float, Path]] = []
    for place in spill_dirs(db):
        with contextlib.suppress(OSError):
            for path in place.glob(f"{prefix}*{_SUFFIX}"):
                found.append((path.stat().st_mtime, path))
    return [path for _, path in sorted(found)]


def write_spill(header: SpillHeader, records: Iterable[Mapping[str, Any]]) -> Path:
    """Write a spill file in the first of `spill_dirs` that takes it whole; `StoreError` naming each failure."""
    db = Path(header.db)
    lines = [json.dumps({"format": _FORMAT, "version": _VERSION, **_header_fields(header)})]
    lines += [json.dumps(record, ensure_ascii=True) for record in records]
    data = ("\n".join(lines) + "\n").encode("ascii")
    problems = []
    for place in spill_dirs(db):
        path = place / f"{_name_prefix(db, header.run_id)}{header.spill_id}{_SUFFIX}"
        try:
            place.mkdir(mode=0o700, parents=True, exist_ok=True)
            _write_whole(path, data)
        except OSError as error:
            problems.append(f"{place}: {error.strerror or error}")
            continue
        return path
    raise StoreError("; ".join(problems))


def _header_fields(header: SpillHeader) -> dict[str, Any]:
    return {name: getattr(header, name) for name in SpillHeader.__slots__}


def _write_whole(path: Path, data: bytes) -> None:
    """``data`` at ``path`` whole or not at all, readable by its owner only (prompts may be private)."""
    partial = path.with_name(path.name + ".partial")
    try:
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(descriptor, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        partial.replace(path)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def read_spill(path: Path) -> tuple[SpillHeader, Iterator[dict[str, Any]]]:
    """The header of the spill file at ``path`` and its records, in order (`StoreError` if unreadable)."""
    try:
        lines = path.read_text(encoding="ascii").splitlines()
        first = json.loads(lines[0]) if lines else {}
        if first.get("format") != _FORMAT or first.get("version") != _VERSION:
            raise ValueError("not an rcarun spill file of this version")
        header = SpillHeader(**{name: first[name] for name in SpillHeader.__slots__})
        records = [json.loads(line) for line in lines[1:]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise StoreError(f"{path}: cannot read this spill file ({error})") from error
    return header, iter(records)


def _spill_record(row: Row) -> dict[str, Any]:
    if isinstance(row, Blob):
        return {
            "table": "blobs",
            "sha256": row.sha256,
            "zlib": base64.b64encode(zlib.compress(row.data, 1)).decode(),
        }
    return {"table": TABLES[type(row)], "row": dataclasses.asdict(row)}


_ROW_TYPES: Final[dict[str, type]] = {
    table: row_type for row_type, table in TABLES.items() if row_type is not Blob
}


def _spilled_row(record: dict[str, Any]) -> Row:
    if record["table"] == "blobs":
        return Blob(str(record["sha256"]), zlib.decompress(base64.b64decode(record["zlib"])))
    row: Row = _ROW_TYPES[record["table"]](**record["row"])
    return row


def _largest_call_id(connection: sqlite3.Connection, run_id: int) -> int:
    found = connection.execute("SELECT max(call_id) FROM calls WHERE run_id = ?", (run_id,)).fetchone()
    return int(found[0] or 0)


def _run_of(connection: sqlite3.Connection, run_id: int) -> tuple[str, str] | None:
    run = connection.execute("SELECT name, created_at FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return None if run is None else (str(run[0]), str(run[1]))


def spill_rows(connection: sqlite3.Connection, db: Path, run_id: int, rows: Sequence[Row]) -> Path:
    """Write ``rows`` to a spill file of ``db``'s run ``run_id`` (``connection`` still reads ``db``)."""
    run = _run_of(connection, run_id)
    if run is None:
        raise StoreError(f"{db} has no run {run_id}")
    header = SpillHeader(
        db=str(db.resolve()),
        run_id=run_id,
        run_name=run[0],
        run_created_at=run[1],
        calls_before=_largest_call_id(connection, run_id),
        spill_id=uuid.uuid4().hex,
        rows=len(rows),
        answered=answered_calls(rows),
    )
    return write_spill(header, (_spill_record(row) for row in rows))


def take_up_spill(path: str | Path, run_id: int, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> list[str]:
    """Store the rows a full disk left in this run's spill files, remove the files, return lines to tell; call
    it holding the run's lease. `StoreError` (the file kept) when a file or its rows cannot be taken."""
    path = Path(path)
    told = [_take_up_one(path, run_id, spill, busy_timeout_s) for spill in find_spills(path, run_id)]
    return [line for line in told if line is not None]


def _take_up_one(path: Path, run_id: int, spill: Path, busy_timeout_s: float) -> str | None:
    header, records = read_spill(spill)
    writer = BatchWriter(path, busy_timeout_s, run_id)
    try:
        connection = writer.connection
        taken = connection.execute(
            "SELECT 1 FROM run_events WHERE run_id = ? AND kind = ? AND json_extract(detail_json, '$.spill_id') = ?",
            (run_id, SPILL_TAKEN_UP, header.spill_id),
        ).fetchone()
        if taken is None:
            if (
                header.db != str(path.resolve())
                or header.run_id != run_id
                or _run_of(connection, run_id) != (header.run_name, header.run_created_at)
                or header.calls_before != _largest_call_id(connection, run_id)
            ):
                return (
                    f"{spill} holds {header.rows} rows of run {header.run_name!r} of {header.db} that this "
                    "results.db cannot take (another file or run, or the run went on without them); it was left "
                    "as is"
                )
            detail = {
                "spill_id": header.spill_id,
                "file": str(spill),
                "rows": header.rows,
                "answered": header.answered,
            }
            try:
                rows = [_spilled_row(record) for record in records]
            except (KeyError, TypeError, ValueError, zlib.error) as error:  # binascii.Error is a ValueError
                raise StoreError(
                    f"{spill}: a row in it cannot be read ({error!r}); the file is kept"
                ) from error
            rows.append(EventRow(run_id=run_id, kind=SPILL_TAKEN_UP, detail_json=json.dumps(detail)))
            try:
                writer.write(rows)
            except (sqlite3.Error, OSError) as error:
                raise StoreError(
                    f"storing the {header.rows} rows kept in {spill} into {path} failed "
                    f"({type(error).__name__}: {error}); the file is kept"
                ) from error
    finally:
        writer.close()
    spill.unlink()
    if taken is not None:
        return None
    return (
        f"stored the {header.rows} rows ({header.answered} answered calls) kept in {spill} since {path} "
        "was full; the file is removed"
    )
