"""Readers that turn Who&When and LongRCA files into `Record`s, or say exactly what is wrong with them.

A sweep reads thousands of trajectories and must not stop, or silently skip, because one is bad. So every
loader here is lazy (one file or line in memory at a time) and every problem is a `DataError` naming the file,
the record and the field; `iter_dataset(strict=False)` hands those to a callback and goes on.

Layouts understood by `iter_dataset`:

- a directory whose subdirectories are sources, each holding one ``*.json`` trajectory per file, read in
  natural numeric order (``2.json`` before ``10.json``); the source is the subdirectory's name (any
  ``source`` field inside the file is ignored); other files (LICENSE, README.md) are ignored;
- a single ``.jsonl`` file, one record per line, each with a ``source`` field;
- a directory holding ``.jsonl`` files (read before any source subdirectories).

qid scheme (unique within a dataset, stable across loads):

1. an explicit non-empty ``qid`` field, if the record has one (lets a JSONL export keep its qids);
2. else ``question_ID`` when it has the LongRCA form ``<source>__NNN``: globally unique by construction and
   the key of the Mini manifest and of leaderboard submissions;
3. else, for a file, ``"<source>/<file stem>"`` (``"hand_crafted/7"``). Who&When's question_IDs are task
   ids, not trajectory ids: 13 of them appear in both algorithm_generated and hand_crafted (e.g.
   algorithm_generated/21.json and hand_crafted/5.json), so they cannot key a trajectory;
4. else, for a JSONL line, ``"<source>/<question_ID>"`` (question_IDs do not repeat within a Who&When source).

Validation, all raised as `DataError`:

- the file cannot be read, is not UTF-8 JSON, or is not a JSON object;
- ``history`` missing, not a list, or empty;
- a history item that is not an object, has no string ``content`` (empty text is allowed: two Who&When
  steps are empty) or no string ``role``, a ``name`` that is not a string, a ``step`` that is not its 0-based
  position, or an agent that comes out empty (rule in `rcarun.data.trajectory`);
- ``question`` or ``ground_truth`` present but not a string;
- a reference with only one of ``mistake_agent`` / ``mistake_step``; an empty ``mistake_agent`` or one that
  matches no recorded agent once both sides are compared the way the scorer compares roles (trim, drop one
  trailing ``(-> X)`` handoff suffix, NFKC, casefold, collapse whitespace); a ``mistake_step`` that is not an
  integer (a string is stripped first), is negative, or is ``>= n_steps``; a non-string ``mistake_reason``;
- a qid seen before in the same dataset (the later record is the problem);
- an identifier holding an unpaired UTF-16 surrogate (below).

Unpaired surrogates. JSON may spell a code point as ``\\uXXXX``, and Python's json turns a lone
``"\\ud800"`` (half of an emoji cut off, say) into a str that cannot be encoded to UTF-8: SQLite cannot store
it and no prompt holding it can be sent. A valid pair (``"\\ud83d\\ude00"``) is joined into one code point by
the decoder and never seen here; other odd but encodable text (NUL, BOM, RTL override, ZWJ) loads as is.

- Identifiers must be exact, so a surrogate in one is a `DataError` naming the field and the first surrogate's
  0-based character position: the qid (``qid``; else ``question_ID``; else the file and directory names it is
  derived from, where a name that is not valid UTF-8 reads as surrogates), the source (JSONL ``source``, or
  the directory's name), a step's ``role`` or ``name``, and ``mistake_agent``.
- Free text is repaired: in a step's ``content``, ``question``, ``ground_truth`` and ``mistake_reason`` each
  surrogate becomes U+FFFD, and `Record.repaired_fields` lists the fields repaired (``rcarun data check``
  reports them). The SHA-256 stays that of the original bytes.

Cost: one regex pass over the record's bytes looks for an escape from ``\\ud800`` to ``\\udfff``; only a record
that has one (a valid pair included) has its strings checked, each in O(1) when ASCII and in one regex pass
otherwise. Paths and labels in messages show a surrogate as its ``\\uXXXX`` escape, so that every message can
be printed and stored.

Task: `Trajectory.task` is the record's ``question`` when it is a non-blank string (``task_source="question"``),
else the task instruction its history states in its opening step(s), by the per-source rule of
`rcarun.data.task.derive_task` (LongRCA records have no ``question``: 000 Sec. 3.2 puts the task in the history);
``task_source`` names the rule (``"history[0]"``, ``"history[0..1]"``, ... or ``"none"``). The steps stay exactly
as recorded: the task step remains step 0 of the log, with its id.

A record with neither ``mistake_agent`` nor ``mistake_step`` loads with ``reference=None`` (unlabelled data).
Labels that point at a step spoken by another agent are noisy but valid and are loaded unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rcarun import jsonfast
from rcarun.errors import DataError
from rcarun.text import first_lone_surrogate, repair_surrogates

from .roles import normalize_role
from .task import derive_task
from .trajectory import Record, Reference, Step, Trajectory, agent_of_step, parse_step

__all__ = ["ProblemHandler", "iter_dataset", "load_jsonl", "load_trajectory_file", "natural_sort_key"]

ProblemHandler = Callable[[DataError], None]

_LONGRCA_QID = re.compile(r"^[A-Za-z0-9_]+__\d+$")
_DIGIT_RUNS = re.compile(r"(\d+)")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # how JSON spells one: \ud800 to \uDFFF


def natural_sort_key(name: str) -> tuple[tuple[int, str], ...]:
    """A sort key that orders embedded numbers by value: ``"2.json"`` before ``"10.json"``."""
    # re.split with a capture group alternates text, number, text, ...; tagging keeps positions comparable.
    return tuple(
        (int(part), "") if index % 2 else (-1, part.casefold())
        for index, part in enumerate(_DIGIT_RUNS.split(name))
    )


def load_trajectory_file(path: str | Path, source: str) -> Record:
    """Load one Who&When- or LongRCA-shaped JSON file.

    Args:
        path: the ``.json`` file.
        source: the sub-benchmark it belongs to (in a dataset: its directory's name).

    Returns:
        The trajectory and its reference (``None`` when the file carries no label).

    Raises:
        DataError: the file is unreadable or malformed; the message names file, record and field.
    """
    return _load_file(str(Path(path)), source).record


def load_jsonl(
    path: str | Path, *, strict: bool = True, on_problem: ProblemHandler | None = None
) -> Iterator[Record]:
    """Lazily load a JSONL file, one record per non-blank line, each carrying a ``source`` field.

    Args:
        path: the ``.jsonl`` file.
        strict: raise the first problem (True) or report it to `on_problem` and go on (False).
        on_problem: receives each `DataError` when ``strict=False``; required then.

    Raises:
        DataError: with ``strict=True``, on the first bad line or duplicate qid.
        ValueError: ``strict=False`` without `on_problem` (problems would vanish).
    """
    _check_policy(strict, on_problem)
    return _deliver(_iter_jsonl(Path(path)), strict, on_problem)


def iter_dataset(
    path: str | Path, *, strict: bool = True, on_problem: ProblemHandler | None = None
) -> Iterator[Record]:
    """Lazily load every record of a dataset (layouts in the module docstring), checking qids are unique.

    Args:
        path: a dataset directory or a ``.jsonl`` file.
        strict: raise the first problem (True) or report it to `on_problem` and go on (False).
        on_problem: receives each `DataError` when ``strict=False``; required then.

    Raises:
        DataError: with ``strict=True``, on the first problem, including an empty or missing dataset.
        ValueError: ``strict=False`` without `on_problem` (problems would vanish).
    """
    _check_policy(strict, on_problem)
    return _deliver(_iter_layout(Path(path)), strict, on_problem)


def count_entries(path: str | Path) -> int:
    """How many records `iter_dataset` will try to load from ``path`` (files and non-blank JSONL lines).

    Nothing is parsed, so this is cheap enough to size progress bars before a sweep; bad records are counted
    too (they are found when loaded). A path that is not a dataset counts 0.
    """
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


@dataclass(frozen=True, slots=True)
class _Loaded:
    """A parsed record with where it came from, for duplicate-qid messages."""

    record: Record
    path: str
    label: str
    qid_field: str


def _check_policy(strict: bool, on_problem: ProblemHandler | None) -> None:
    if not strict and on_problem is None:
        raise ValueError("strict=False needs an on_problem callback, or problems would be lost")


def _deliver(
    outcomes: Iterable[_Loaded | DataError], strict: bool, on_problem: ProblemHandler | None
) -> Iterator[Record]:
    # Every qid met, with where: a duplicate may come anywhere later and its message names the first. The one
    # structure of a walk that grows with the dataset (about 200 bytes a trajectory), as finding duplicates needs.
    first_seen: dict[str, str] = {}
    for outcome in outcomes:
        if isinstance(outcome, _Loaded):
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


def _iter_layout(root: Path) -> Iterator[_Loaded | DataError]:
    if root.is_file():
        if root.suffix == ".jsonl":
            yield from _iter_jsonl(root)
        else:
            yield DataError("not a dataset: expected a directory or a .jsonl file", path=_shown(str(root)))
        return
    if not root.is_dir():
        yield DataError("no such file or directory", path=_shown(str(root)))
        return
    try:
        entries = sorted(root.iterdir(), key=lambda entry: natural_sort_key(entry.name))
    except OSError as exc:
        yield DataError(f"cannot list directory: {exc.strerror or exc}", path=_shown(str(root)))
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
            parent = _shown(str(root.parent))
            hint = f" (if the .json files here are one source's trajectories, pass {parent} instead)"
        yield DataError(
            f"no trajectories found: expected <source>/*.json subdirectories or *.jsonl files{hint}",
            path=_shown(str(root)),
        )


def _iter_source_dir(directory: Path) -> Iterator[_Loaded | DataError]:
    source = directory.name
    # The listing is held while the directory is read, so it holds names (about 60 bytes each), not Paths
    # (about 350): a source of 100,000 files costs 6 MB instead of 35 MB, in every producer that walks it.
    # scandir knows each entry's type from the listing itself (no stat per file on Linux), and the files are
    # opened by plain string paths: a sweep reads one file per trajectory, and each walk reads them all.
    folder = os.fspath(directory)
    try:
        with os.scandir(folder) as entries:
            names = sorted((entry.name for entry in entries if _is_json_file(entry)), key=natural_sort_key)
    except OSError as exc:
        yield DataError(f"cannot list directory: {exc.strerror or exc}", path=_shown(folder))
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


def _load_file(path: str, source: str) -> _Loaded:
    stem = os.path.splitext(os.path.basename(path))[0]
    fallback_qid = f"{source}/{stem}"
    where, label = _shown(path), _shown(fallback_qid)
    _require_identifier(
        source, path=where, label=label, field="", what=f"source {source!r} (the directory's name) "
    )
    try:
        data = _read_file(path)
    except OSError as exc:
        raise DataError(f"cannot read file: {exc.strerror or exc}", path=where, record=label) from exc
    obj = _decode_json(data, path=where, label=label)
    return _parse_record(
        obj,
        path=where,
        source=source,
        fallback_qid=fallback_qid,
        line=None,
        raw=data,
    )


# A first read this large takes a whole trajectory file in one call (the bundled ones are a few kilobytes) and
# stays below malloc's mmap threshold; a larger file is sized by `fstat` and read in one more call.
_FIRST_READ_BYTES = 1 << 16


def _read_file(path: str) -> bytes:
    """The file's bytes with the fewest system calls: open, read, read (end of file), close.

    ``open(path, "rb").read()`` makes eight (two ``fstat``, an ``ioctl`` for ``isatty``, an ``lseek``), and a
    sweep opens one file per item on its event loop: 7.5 against 4.6 us a bundled Who&When file
    (`benchmarks/per_call_parts.py`).
    """
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


def _iter_jsonl(path: Path) -> Iterator[_Loaded | DataError]:
    where = _shown(str(path))
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


def _parse_jsonl_line(line: bytes, *, path: str, line_no: int) -> _Loaded:
    label = f"line {line_no}"
    obj = _decode_json(line, path=path, label=label)
    source = obj.get("source")
    if not isinstance(source, str) or not source.strip():
        raise DataError(
            "each JSONL record needs a non-empty string 'source'", path=path, record=label, field="source"
        )
    _require_identifier(source, path=path, label=label, field="source")
    question_id = obj.get("question_ID")
    fallback_qid = f"{source}/{question_id}" if isinstance(question_id, str) and question_id.strip() else None
    return _parse_record(
        obj,
        path=path,
        source=source,
        fallback_qid=fallback_qid,
        line=line_no,
        raw=line,
    )


def _decode_json(data: bytes, *, path: str, label: str) -> dict[str, Any]:
    try:
        obj = jsonfast.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 text: {exc.reason} at byte {exc.start}", path=path, record=label) from exc
    except json.JSONDecodeError as exc:
        raise DataError(
            f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", path=path, record=label
        ) from exc
    if not isinstance(obj, dict):
        raise DataError(f"expected a JSON object, got {type(obj).__name__}", path=path, record=label)
    return obj


def _choose_qid(obj: dict[str, Any], *, path: str, fallback_qid: str | None, label: str) -> tuple[str, str]:
    """The record's qid and the field it came from (scheme in the module docstring)."""
    explicit = obj.get("qid")
    if explicit is not None:
        if not isinstance(explicit, str) or not explicit.strip():
            raise DataError("'qid' must be a non-empty string", path=path, record=label, field="qid")
        _require_identifier(explicit, path=path, label=label, field="qid")
        return explicit.strip(), "qid"
    question_id = obj.get("question_ID")
    if question_id is not None and not isinstance(question_id, str):
        raise _not_a_string(question_id, path=path, label=label, field="question_ID")
    if question_id is not None:
        _require_identifier(question_id, path=path, label=label, field="question_ID")
    if question_id is not None and _LONGRCA_QID.match(question_id.strip()):
        return question_id.strip(), "question_ID"
    if fallback_qid is None:
        raise DataError(
            "no identifier: the record needs a 'qid' or a 'question_ID'",
            path=path,
            record=label,
            field="question_ID",
        )
    # A JSONL fallback is made of the source and question_ID, both checked by now; a file's comes from its
    # directory and file names.
    _require_identifier(
        fallback_qid,
        path=path,
        label=label,
        field="",
        what=f"qid {fallback_qid!r} (from the file and directory names) ",
    )
    return fallback_qid, "question_ID"


def _parse_record(
    obj: dict[str, Any],
    *,
    path: str,
    source: str,
    fallback_qid: str | None,
    line: int | None,
    raw: bytes,
) -> _Loaded:
    first_label = f"line {line}" if line is not None else _shown(fallback_qid or "")
    qid, qid_field = _choose_qid(obj, path=path, fallback_qid=fallback_qid, label=first_label)
    label = qid if line is None else f"{qid} (line {line})"
    sha256 = hashlib.sha256(raw).hexdigest()
    # UTF-8 cannot carry a surrogate, so a decoded str holds one only where the bytes spell it as an escape;
    # one pass over the bytes spares the per-string checks of almost every record.
    screen = _SURROGATE_ESCAPE.search(raw) is not None

    repaired = _screen_surrogates(obj, path=path, label=label) if screen else ()
    steps = _parse_history(obj, path=path, label=label)
    question = obj.get("question")
    if question is not None and not isinstance(question, str):
        raise _not_a_string(question, path=path, label=label, field="question")
    ground_truth = obj.get("ground_truth")
    if ground_truth is not None and not isinstance(ground_truth, str):
        raise _not_a_string(ground_truth, path=path, label=label, field="ground_truth")
    if question is not None and question.strip():
        task, task_source = question, "question"
    else:
        derived = derive_task(steps, source)
        task, task_source = derived.text, derived.source
    trajectory = Trajectory(
        qid=qid,
        source=source,
        task=task,
        steps=steps,
        sha256=sha256,
        ground_truth=ground_truth or "",
        task_source=task_source,
    )
    reference = _parse_reference(obj, trajectory, path=path, label=label)
    origin = path if line is None else f"{path}:{line}"
    record = Record(trajectory, reference, origin, repaired_fields=repaired)
    return _Loaded(record, path=path, label=label, qid_field=qid_field)


def _parse_history(obj: dict[str, Any], *, path: str, label: str) -> tuple[Step, ...]:
    if "history" not in obj:
        raise DataError("missing", path=path, record=label, field="history")
    history = obj["history"]
    if not isinstance(history, list):
        raise DataError(
            f"expected a list of steps, got {type(history).__name__}",
            path=path,
            record=label,
            field="history",
        )
    if not history:
        raise DataError(
            "empty: a trajectory needs at least one step", path=path, record=label, field="history"
        )
    steps: list[Step] = []
    # Runs once per step of every record loaded: the field names of the errors are only spelled when one is raised.
    for index, item in enumerate(history):
        if type(item) is not dict:
            raise DataError(
                f"expected an object, got {type(item).__name__}",
                path=path,
                record=label,
                field=f"history[{index}]",
            )
        content = item.get("content")
        role = item.get("role")
        if type(content) is not str or type(role) is not str:
            key, value = ("content", content) if type(content) is not str else ("role", role)
            problem = "missing" if value is None else f"expected a string, got {type(value).__name__}"
            raise DataError(problem, path=path, record=label, field=f"history[{index}].{key}")
        name = item.get("name")
        if name is not None and type(name) is not str:
            raise _not_a_string(name, path=path, label=label, field=f"history[{index}].name")
        recorded_step = item.get("step")
        if recorded_step is not None and (type(recorded_step) is not int or recorded_step != index):
            raise DataError(
                f"is {recorded_step!r} but the item is at 0-based position {index}",
                path=path,
                record=label,
                field=f"history[{index}].step",
            )
        agent = agent_of_step(name, role)
        if not agent:
            raise DataError(
                f"no agent: name {name!r} and role {role!r} are empty once the suffix is removed",
                path=path,
                record=label,
                field=f"history[{index}].name" if name is not None else f"history[{index}].role",
            )
        steps.append(Step(index=index, agent=agent, role=role, content=content))
    return tuple(steps)


def _parse_reference(
    obj: dict[str, Any], trajectory: Trajectory, *, path: str, label: str
) -> Reference | None:
    has_agent, has_step = "mistake_agent" in obj, "mistake_step" in obj
    if not has_agent and not has_step:
        return None
    if not has_agent or not has_step:
        missing = "mistake_agent" if not has_agent else "mistake_step"
        raise DataError(
            "missing while the other label field is present", path=path, record=label, field=missing
        )

    agent = obj["mistake_agent"]
    if not isinstance(agent, str) or not agent.strip():
        raise DataError(
            f"expected a non-empty agent name, got {agent!r}", path=path, record=label, field="mistake_agent"
        )
    if normalize_role(agent) not in {normalize_role(known) for known in trajectory.agents}:
        raise DataError(
            f"unknown agent {agent!r}: not among the recorded agents {list(trajectory.agents)}",
            path=path,
            record=label,
            field="mistake_agent",
        )

    step = _parse_step_index(obj["mistake_step"], path=path, label=label)
    if step < 0 or step >= trajectory.n_steps:
        raise DataError(
            f"{step} is out of range: the history has {trajectory.n_steps} steps (0-based)",
            path=path,
            record=label,
            field="mistake_step",
        )

    rationale = obj.get("mistake_reason")
    if rationale is not None and not isinstance(rationale, str):
        raise _not_a_string(rationale, path=path, label=label, field="mistake_reason")
    return Reference(role=agent, step=step, rationale=rationale or "")


def _not_a_string(value: object, *, path: str, label: str, field: str) -> DataError:
    return DataError(f"expected a string, got {type(value).__name__}", path=path, record=label, field=field)


def _parse_step_index(value: object, *, path: str, label: str) -> int:
    step = parse_step(value)
    if step is not None:
        return step
    raise DataError(
        f"expected a 0-based integer step (or a string holding one), got {value!r}",
        path=path,
        record=label,
        field="mistake_step",
    )


def _screen_surrogates(obj: dict[str, Any], *, path: str, label: str) -> tuple[str, ...]:
    """Reject identifiers that hold an unpaired surrogate and repair free text in ``obj`` in place.

    Returns:
        The repaired fields in file order. A field of the wrong type is skipped: the parser reports it.
    """
    repaired: list[str] = []
    history = obj.get("history")
    for index, item in enumerate(history if isinstance(history, list) else ()):
        if not isinstance(item, dict):
            continue
        where = f"history[{index}]"
        for key in ("role", "name"):
            if isinstance(value := item.get(key), str):
                _require_identifier(value, path=path, label=label, field=f"{where}.{key}")
        if isinstance(content := item.get("content"), str):
            item["content"] = _repaired(content, f"{where}.content", repaired)
    if isinstance(agent := obj.get("mistake_agent"), str):
        _require_identifier(agent, path=path, label=label, field="mistake_agent")
    for key in ("question", "ground_truth", "mistake_reason"):
        if isinstance(text := obj.get(key), str):
            obj[key] = _repaired(text, key, repaired)
    return tuple(repaired)


def _shown(text: str) -> str:
    """``text`` with each unpaired surrogate written as its ``\\uXXXX`` escape: printable and storable."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _require_identifier(text: str, *, path: str, label: str, field: str, what: str = "") -> None:
    """Raise `DataError` if an identifier holds an unpaired surrogate; ``what`` names it if no field does."""
    position = first_lone_surrogate(text)
    if position is not None:
        surrogate = f"\\u{ord(text[position]):04x}"
        raise DataError(
            f"{what}contains an unpaired UTF-16 surrogate ({surrogate} at character {position}); "
            "identifiers must be valid Unicode",
            path=path,
            record=label,
            field=field,
        )


def _repaired(text: str, field: str, repairs: list[str]) -> str:
    """``text`` with each unpaired surrogate replaced by U+FFFD; ``field`` goes to ``repairs`` if any was."""
    fixed = repair_surrogates(text)
    if fixed is not text:
        repairs.append(field)
    return fixed
