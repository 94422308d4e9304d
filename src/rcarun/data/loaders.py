"""Readers that turn Who&When and LongRCA files into `Record`s, or say exactly what is wrong with them.

A sweep reads thousands of trajectories and must neither stop nor silently skip because one is bad: every
loader is lazy (one file or line in memory at a time) and every problem is a `DataError` naming the file, the
record and the field; `iter_dataset(strict=False)` hands those to a callback and goes on. Layouts, the qid
scheme, the checks and the surrogate rules: docs/reliability.md ("Dataset files").
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from rcarun.errors import DataError

from .records import Loaded, decode_json, parse_record, require_identifier, shown
from .trajectory import Record

__all__ = ["ProblemHandler", "iter_dataset", "load_jsonl", "load_trajectory_file", "natural_sort_key"]

ProblemHandler = Callable[[DataError], None]

_DIGIT_RUNS = re.compile(r"(\d+)")


def natural_sort_key(name: str) -> tuple[tuple[int, str], ...]:
    """A sort key that orders embedded numbers by value: ``"2.json"`` before ``"10.json"``."""
    # re.split with a capture group alternates text, number, text, ...; tagging keeps positions comparable.
    return tuple(
        (int(part), "") if index % 2 else (-1, part.casefold())
        for index, part in enumerate(_DIGIT_RUNS.split(name))
    )


def load_trajectory_file(path: str | Path, source: str) -> Record:
    """Load one Who&When- or LongRCA-shaped JSON file of sub-benchmark ``source`` (reference None: no label).

    Raises:
        DataError: the file is unreadable or malformed; the message names file, record and field.
    """
    return _load_file(str(Path(path)), source).record


def load_jsonl(
    path: str | Path, *, strict: bool = True, on_problem: ProblemHandler | None = None
) -> Iterator[Record]:
    """Lazily load a JSONL file, one record per non-blank line, each carrying a ``source`` field.

    ``strict`` raises the first problem (a `DataError`); else each goes to ``on_problem``, which is then required
    (a `ValueError` otherwise: problems would vanish).
    """
    _check_policy(strict, on_problem)
    return _deliver(_iter_jsonl(Path(path)), strict, on_problem)


def iter_dataset(
    path: str | Path, *, strict: bool = True, on_problem: ProblemHandler | None = None
) -> Iterator[Record]:
    """Lazily load every record of a dataset directory or ``.jsonl`` file, checking qids are unique.

    ``strict`` and ``on_problem`` as in `load_jsonl`; an empty or missing dataset is a problem too.
    """
    _check_policy(strict, on_problem)
    return _deliver(_iter_layout(Path(path)), strict, on_problem)


def count_entries(path: str | Path) -> int:
    """How many records `iter_dataset` will try to load from ``path``, bad ones included, without parsing
    (to size progress bars); 0 for a path that is not a dataset."""
    root = Path(path)
    if root.is_file():
        return _count_jsonl_lines(root) if root.suffix == ".jsonl" else 0
    if not root.is_dir():
        return 0
    count = 0
    try:
        entries = list(root.iterdir())
        for entry in entries:
            if entry.suffix == ".jsonl" and entry.is_file():
                count += _count_jsonl_lines(entry)
            elif entry.is_dir() and not entry.name.startswith((".", "__")):
                # As the walk lists a source (`_iter_source_dir`): no stat per file, no Path per file.
                with os.scandir(entry) as files:
                    count += sum(1 for file in files if _is_json_file(file))
    except OSError:
        return count
    return count


def _count_jsonl_lines(path: Path) -> int:
    try:
        with path.open("rb") as handle:
            return sum(1 for line in handle if line.strip())
    except OSError:
        return 0


def _check_policy(strict: bool, on_problem: ProblemHandler | None) -> None:
    if not strict and on_problem is None:
        raise ValueError("strict=False needs an on_problem callback, or problems would be lost")


def _deliver(
    outcomes: Iterable[Loaded | DataError], strict: bool, on_problem: ProblemHandler | None
) -> Iterator[Record]:
    # Every qid met, with where: the one structure of a walk that grows with the dataset (~200 bytes a record).
    first_seen: dict[str, str] = {}
    for outcome in outcomes:
        if isinstance(outcome, Loaded):
            qid = outcome.record.trajectory.qid
            if qid not in first_seen:
                first_seen[qid] = outcome.path
                yield outcome.record
                continue
            outcome = DataError(
                f"duplicate qid {qid!r} (first seen in {first_seen[qid]})",
                path=outcome.path,
                record=outcome.label,
                field=outcome.qid_field,
            )
        if strict:
            raise outcome
        assert on_problem is not None  # guaranteed by _check_policy
        on_problem(outcome)


def _iter_layout(root: Path) -> Iterator[Loaded | DataError]:
    if root.is_file():
        if root.suffix == ".jsonl":
            yield from _iter_jsonl(root)
        else:
            yield DataError("not a dataset: expected a directory or a .jsonl file", path=shown(str(root)))
        return
    if not root.is_dir():
        yield DataError("no such file or directory", path=shown(str(root)))
        return
    try:
        entries = sorted(root.iterdir(), key=lambda entry: natural_sort_key(entry.name))
    except OSError as exc:
        yield DataError(f"cannot list directory: {exc.strerror or exc}", path=shown(str(root)))
        return
    found_any = False
    for entry in entries:
        if entry.suffix == ".jsonl" and entry.is_file():
            found_any = True
            yield from _iter_jsonl(entry)
    for entry in entries:
        if entry.is_dir() and not entry.name.startswith((".", "__")):
            for outcome in _iter_source_dir(entry):
                found_any = True
                yield outcome
    if not found_any:
        hint = ""
        if any(entry.suffix == ".json" for entry in entries):
            parent = shown(str(root.parent))
            hint = f" (if the .json files here are one source's trajectories, pass {parent} instead)"
        yield DataError(
            f"no trajectories found: expected <source>/*.json subdirectories or *.jsonl files{hint}",
            path=shown(str(root)),
        )


def _iter_source_dir(directory: Path) -> Iterator[Loaded | DataError]:
    source = directory.name
    # Names, not Paths (60 against 350 bytes each, held while the source is read); scandir needs no stat per file.
    folder = os.fspath(directory)
    try:
        with os.scandir(folder) as entries:
            names = sorted((entry.name for entry in entries if _is_json_file(entry)), key=natural_sort_key)
    except OSError as exc:
        yield DataError(f"cannot list directory: {exc.strerror or exc}", path=shown(folder))
        return
    for name in names:
        try:
            yield _load_file(os.path.join(folder, name), source)
        except DataError as problem:
            yield problem


def _is_json_file(entry: os.DirEntry[str]) -> bool:
    # As `Path.suffix` has it, ".json" alone is a hidden file's name, not a suffix.
    name = entry.name
    try:
        return name.endswith(".json") and len(name) > len(".json") and entry.is_file()
    except OSError:
        return False  # gone since the listing, or unreadable: as `Path.is_file` has it


def _load_file(path: str, source: str) -> Loaded:
    stem = os.path.splitext(os.path.basename(path))[0]
    fallback_qid = f"{source}/{stem}"
    where, label = shown(path), shown(fallback_qid)
    require_identifier(
        source, path=where, label=label, field="", what=f"source {source!r} (the directory's name) "
    )
    try:
        data = _read_file(path)
    except OSError as exc:
        raise DataError(f"cannot read file: {exc.strerror or exc}", path=where, record=label) from exc
    obj = decode_json(data, path=where, label=label)
    return parse_record(
        obj,
        path=where,
        source=source,
        fallback_qid=fallback_qid,
        line=None,
        raw=data,
    )


# Takes a whole bundled trajectory in one read, below malloc's mmap threshold; a larger file takes one more.
_FIRST_READ_BYTES = 1 << 16


def _read_file(path: str) -> bytes:
    """The file's bytes in four system calls, not the eight of ``open().read()``: a sweep reads one file per
    item on its event loop (7.5 against 4.6 us, `benchmarks/per_call_parts.py`)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, _FIRST_READ_BYTES)]
        if len(chunks[0]) == _FIRST_READ_BYTES:
            chunks.append(os.read(fd, max(os.fstat(fd).st_size - _FIRST_READ_BYTES, 0) + 1))
        while chunks[-1]:
            chunks.append(os.read(fd, _FIRST_READ_BYTES))
    finally:
        os.close(fd)
    return chunks[0] if len(chunks) == 2 else b"".join(chunks)


def _iter_jsonl(path: Path) -> Iterator[Loaded | DataError]:
    where = shown(str(path))
    try:
        handle = path.open("rb")
    except OSError as exc:
        yield DataError(f"cannot read file: {exc.strerror or exc}", path=where)
        return
    with handle:
        line_no = 0
        try:
            for line_no, raw_line in enumerate(handle, start=1):
                line = raw_line.rstrip(b"\r\n")
                if not line.strip():
                    continue
                try:
                    yield _parse_jsonl_line(line, path=where, line_no=line_no)
                except DataError as problem:
                    yield problem
        except OSError as exc:
            yield DataError(f"read failed after line {line_no}: {exc.strerror or exc}", path=where, record="")


def _parse_jsonl_line(line: bytes, *, path: str, line_no: int) -> Loaded:
    label = f"line {line_no}"
    obj = decode_json(line, path=path, label=label)
    source = obj.get("source")
    if not isinstance(source, str) or not source.strip():
        raise DataError(
            "each JSONL record needs a non-empty string 'source'", path=path, record=label, field="source"
        )
    require_identifier(source, path=path, label=label, field="source")
    question_id = obj.get("question_ID")
    fallback_qid = f"{source}/{question_id}" if isinstance(question_id, str) and question_id.strip() else None
    return parse_record(
        obj,
        path=path,
        source=source,
        fallback_qid=fallback_qid,
        line=line_no,
        raw=line,
    )
