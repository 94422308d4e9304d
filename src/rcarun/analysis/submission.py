"""LongRCA leaderboard files: reading a ``predictions.jsonl`` submission and labels, and the leaderboard entry.

Why a module of its own: a submission is an outside file that is checked line by line, and a user needs the
whole list of what is wrong with it (bad lines, duplicates, unknown and missing qids) in one pass rather than
the first error. Scoring itself is `rcarun.analysis.scoring`; this module only reads, reports and counts.

Submission format (LongRCA CONTRIBUTING): one JSON object per line,
``{"question_ID": str, "predicted_role": str, "predicted_step": int}`` with a 0-based step, one line per
expected trajectory. Reading rules of `load_predictions_jsonl`:

- blank lines are skipped;
- a line that is not UTF-8, not JSON, not an object, or has no non-empty string ``question_ID`` is dropped and
  reported as a problem (file and line number);
- a ``question_ID`` seen before is a duplicate: the first line is kept, later ones are reported and dropped;
- a kept line whose ``predicted_role`` or ``predicted_step`` is missing or unusable stays a prediction (the
  field is simply invalid when scored, an error for its own target) and is reported as a note;
- other keys are ignored; qids that are not expected are reported by `score_submission`.

The leaderboard entry (`leaderboard_entry`) carries counts, never fractions, and no label-bearing field, as the
leaderboard's exporter and validator expect: ``valid_step_n + failed_n == n``; ``root_mae`` is the plain mean
of the absolute step errors of valid steps (the exporter's "mean of non-empty step_abs_err"), unlike the
paper's source-weighted MAE of `rcarun.analysis.scoring.pooled`.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypedDict

from rcarun.data import iter_dataset, natural_sort_key, parse_step
from rcarun.data.roles import normalize_role
from rcarun.errors import DataError

from .scoring import AbstentionRule, Expected, ItemScore, Prediction, score_items

__all__ = [
    "LABEL_COLUMNS",
    "BenchmarkCounts",
    "DuplicateLine",
    "LeaderboardEntry",
    "PredictionsFile",
    "References",
    "SubmissionScore",
    "leaderboard_entry",
    "load_labels",
    "load_predictions_jsonl",
    "references_from_dataset",
    "score_submission",
    "write_predictions_jsonl",
]

# The columns (CSV) or keys (JSONL) of a labels file, in this order when written.
LABEL_COLUMNS = ("question_ID", "source", "n_steps", "reference_role", "reference_step")


@dataclass(frozen=True, slots=True)
class DuplicateLine:
    """A submission line whose ``question_ID`` appeared on an earlier line (that earlier line is kept).

    Attributes:
        qid: the repeated ``question_ID``.
        line: the 1-based line number of the dropped repetition.
        first_line: the 1-based line number of the kept line.
    """

    qid: str
    line: int
    first_line: int


@dataclass(frozen=True, slots=True)
class PredictionsFile:
    """What `load_predictions_jsonl` read from one submission file.

    Attributes:
        path: the file, as given.
        predictions: the kept predictions by qid, in file order.
        lines: the 1-based line number of each kept prediction.
        duplicates: dropped repetitions of a qid, in file order.
        problems: dropped lines (not UTF-8, not JSON, not an object, no usable ``question_ID``).
        notes: kept lines with a missing or unusable role or step (scored as invalid fields).
    """

    path: str
    predictions: Mapping[str, Prediction]
    lines: Mapping[str, int]
    duplicates: tuple[DuplicateLine, ...]
    problems: tuple[DataError, ...]
    notes: tuple[DataError, ...]


class References(NamedTuple):
    """Expected trajectories read from a dataset, and what could not be used."""

    expected: list[Expected]
    problems: list[DataError]


class BenchmarkCounts(TypedDict):
    """One source's counts in a leaderboard entry (the leaderboard shows exact counts per source)."""

    n: int
    role_correct: int
    root_exact_correct: int
    root_within_5_correct: int


class LeaderboardEntry(TypedDict):
    """A leaderboard row: pooled counts, the plain valid-step MAE and per-source counts (sources sorted)."""

    n: int
    role_correct: int
    root_exact_correct: int
    root_within_5_correct: int
    root_mae: float | None
    valid_step_n: int
    failed_n: int
    by_benchmark: dict[str, BenchmarkCounts]


@dataclass(frozen=True, slots=True)
class SubmissionScore:
    """A scored submission and everything wrong with it.

    Attributes:
        items: one score per expected trajectory, in the order of the expected list.
        entry: the leaderboard entry of ``items``.
        missing: expected qids without a prediction (scored as errors), in expected order.
        duplicates: repeated qids in the file (the first line was scored).
        unknown: predicted qids that are not expected (ignored), in file order.
        problems: dropped lines of the file.
        notes: kept lines with an invalid role or step field.
    """

    items: tuple[ItemScore, ...]
    entry: LeaderboardEntry
    missing: tuple[str, ...]
    duplicates: tuple[DuplicateLine, ...]
    unknown: tuple[str, ...]
    problems: tuple[DataError, ...]
    notes: tuple[DataError, ...]

    @property
    def clean(self) -> bool:
        """True when the file has exactly one usable line per expected trajectory and nothing else."""
        return not (self.missing or self.duplicates or self.unknown or self.problems)


def _iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Non-blank lines with their 1-based numbers, line terminators removed.

    Raises:
        DataError: the file cannot be opened or read.
    """
    try:
        with path.open("rb") as handle:
            for line_no, raw_line in enumerate(handle, start=1):
                line = raw_line.rstrip(b"\r\n")
                if line.strip():
                    yield line_no, line
    except OSError as exc:
        raise DataError(f"cannot read file: {exc.strerror or exc}", path=str(path)) from exc


def _decode_object(line: bytes, *, path: str, label: str) -> dict[str, Any]:
    """The JSON object on one line (a UTF-8 byte-order mark is tolerated).

    Raises:
        DataError: not UTF-8, not JSON or not an object.
    """
    try:
        obj = json.loads(line.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 text: {exc.reason} at byte {exc.start}", path=path, record=label) from exc
    except json.JSONDecodeError as exc:
        raise DataError(f"not valid JSON: {exc.msg} at column {exc.colno}", path=path, record=label) from exc
    if not isinstance(obj, dict):
        raise DataError(f"expected a JSON object, got {type(obj).__name__}", path=path, record=label)
    return obj


def load_predictions_jsonl(path: str | Path) -> PredictionsFile:
    """Read a ``predictions.jsonl`` submission, keeping every usable line (rules in the module docstring).

    Args:
        path: the submission file.

    Returns:
        The kept predictions with the dropped lines, duplicates and notes; never raises on a bad line.

    Raises:
        DataError: the file itself cannot be read.
    """
    file = Path(path)
    where = str(path)
    predictions: dict[str, Prediction] = {}
    lines: dict[str, int] = {}
    duplicates: list[DuplicateLine] = []
    problems: list[DataError] = []
    notes: list[DataError] = []
    for line_no, line in _iter_lines(file):
        label = f"line {line_no}"
        try:
            obj = _decode_object(line, path=where, label=label)
        except DataError as problem:
            problems.append(problem)
            continue
        qid = obj.get("question_ID")
        if not isinstance(qid, str) or not qid.strip():
            problems.append(
                DataError(
                    f"expected a non-empty string, got {qid!r}; line dropped",
                    path=where,
                    record=label,
                    field="question_ID",
                )
            )
            continue
        qid = qid.strip()
        if qid in lines:
            duplicates.append(DuplicateLine(qid=qid, line=line_no, first_line=lines[qid]))
            continue
        record = f"{qid} ({label})"
        role = obj.get("predicted_role")
        if not isinstance(role, str):
            notes.append(_field_note(role, "a string", path=where, record=record, field="predicted_role"))
            role = None
        elif not normalize_role(role):
            notes.append(
                DataError("empty; scored as a wrong role", path=where, record=record, field="predicted_role")
            )
        step = obj.get("predicted_step")
        if parse_step(step) is None:
            notes.append(_field_note(step, "an integer", path=where, record=record, field="predicted_step"))
        predictions[qid] = Prediction(role=role, step=step)
        lines[qid] = line_no
    return PredictionsFile(
        path=where,
        predictions=predictions,
        lines=lines,
        duplicates=tuple(duplicates),
        problems=tuple(problems),
        notes=tuple(notes),
    )


def _field_note(value: object, wanted: str, *, path: str, record: str, field: str) -> DataError:
    found = "missing" if value is None else f"expected {wanted}, got {value!r}"
    return DataError(f"{found}; kept and scored as invalid", path=path, record=record, field=field)


def _label_integer(value: object, *, path: str, record: str, field: str) -> int:
    number = parse_step(value)
    if number is None:
        raise DataError(f"expected an integer, got {value!r}", path=path, record=record, field=field)
    return number


def _label_text(value: object, *, path: str, record: str, field: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"expected a non-empty string, got {value!r}", path=path, record=record, field=field)
    return value


def _parse_label(row: Mapping[str, object], *, path: str, label: str) -> Expected:
    qid = _label_text(row.get("question_ID"), path=path, record=label, field="question_ID").strip()
    record = f"{qid} ({label})"
    source = _label_text(row.get("source"), path=path, record=record, field="source").strip()
    n_steps = _label_integer(row.get("n_steps"), path=path, record=record, field="n_steps")
    if n_steps < 1:
        raise DataError(f"must be at least 1, got {n_steps}", path=path, record=record, field="n_steps")
    role = _label_text(row.get("reference_role"), path=path, record=record, field="reference_role")
    if not normalize_role(role):
        raise DataError(
            f"{role!r} is empty once normalised", path=path, record=record, field="reference_role"
        )
    step = _label_integer(row.get("reference_step"), path=path, record=record, field="reference_step")
    if not 0 <= step < n_steps:
        raise DataError(
            f"{step} is out of range: the trajectory has {n_steps} steps (0-based)",
            path=path,
            record=record,
            field="reference_step",
        )
    return Expected(qid=qid, source=source, n_steps=n_steps, ref_role=role, ref_step=step)


def _csv_rows(file: Path, columns: Sequence[str]) -> Iterator[tuple[str, Mapping[str, object]]]:
    where = str(file)
    try:
        with file.open(encoding="utf-8-sig", newline="") as handle:
            reader = csv.DictReader(handle)
            header = reader.fieldnames or []
            for column in columns:
                if column not in header:
                    raise DataError("missing column", path=where, record="header", field=column)
            for row in reader:
                label = f"line {reader.line_num}"
                if None in row:
                    raise DataError("more fields than the header has columns", path=where, record=label)
                yield label, row
    except OSError as exc:
        raise DataError(f"cannot read file: {exc.strerror or exc}", path=where) from exc
    except UnicodeDecodeError as exc:
        raise DataError(f"not UTF-8 text: {exc.reason}", path=where) from exc
    except csv.Error as exc:
        raise DataError(f"not valid CSV: {exc}", path=where) from exc


def _jsonl_rows(file: Path) -> Iterator[tuple[str, Mapping[str, object]]]:
    for line_no, line in _iter_lines(file):
        label = f"line {line_no}"
        yield label, _decode_object(line, path=str(file), label=label)


def table_rows(file: Path, columns: Sequence[str], what: str) -> Iterator[tuple[str, Mapping[str, object]]]:
    """The rows of a ``.csv`` (with ``columns`` in its header) or ``.jsonl`` table, each with its line label.

    Raises:
        DataError: an unknown extension (naming ``what`` the file should hold), an unreadable file, a missing
            column, a row that is not an object.
    """
    suffix = file.suffix.lower()
    if suffix == ".csv":
        return _csv_rows(file, columns)
    if suffix == ".jsonl":
        return _jsonl_rows(file)
    raise DataError(f"unknown {what} format {file.suffix!r}: expected .csv or .jsonl", path=str(file))


def load_labels(path: str | Path) -> list[Expected]:
    """Read reference labels from a ``.csv`` or ``.jsonl`` file with the columns of `LABEL_COLUMNS`.

    Integers may be written as JSON integers or as strings holding one (CSV cells are strings). The recorded
    role set is not part of a labels file, so ``roles`` is None (coverage then only asks for a non-empty role).

    Args:
        path: the labels file; the format is chosen by its extension.

    Returns:
        The expected trajectories in file order.

    Raises:
        DataError: on the first bad row (file, record and field named), a repeated ``question_ID``, an unknown
            extension, an unreadable or empty file.
    """
    where = str(path)
    rows = table_rows(Path(path), LABEL_COLUMNS, "labels")
    expected: list[Expected] = []
    first_seen: dict[str, str] = {}
    for label, row in rows:
        item = _parse_label(row, path=where, label=label)
        if item.qid in first_seen:
            raise DataError(
                f"duplicate question_ID {item.qid!r} (first on {first_seen[item.qid]})",
                path=where,
                record=label,
                field="question_ID",
            )
        first_seen[item.qid] = label
        expected.append(item)
    if not expected:
        raise DataError("no labels found", path=where)
    return expected


def references_from_dataset(path: str | Path) -> References:
    """Expected trajectories, with their recorded role sets, from a dataset `rcarun.data.iter_dataset` reads.

    Records that cannot be loaded are reported (the loaders' `DataError`s), and so are records without a
    reference label, which are skipped.

    Args:
        path: a dataset directory or a ``.jsonl`` file.
    """
    problems: list[DataError] = []
    expected: list[Expected] = []
    for record in iter_dataset(path, strict=False, on_problem=problems.append):
        trajectory = record.trajectory
        if record.reference is None:
            problems.append(DataError("no reference label; skipped", path=str(path), record=trajectory.qid))
            continue
        expected.append(
            Expected(
                qid=trajectory.qid,
                source=trajectory.source,
                n_steps=trajectory.n_steps,
                ref_role=record.reference.role,
                ref_step=record.reference.step,
                roles=frozenset(trajectory.agents),
            )
        )
    return References(expected=expected, problems=problems)


def _counts(scores: Sequence[ItemScore]) -> BenchmarkCounts:
    return BenchmarkCounts(
        n=len(scores),
        role_correct=sum(1 for score in scores if score.role_correct),
        root_exact_correct=sum(1 for score in scores if score.step_exact),
        root_within_5_correct=sum(1 for score in scores if score.step_pm5),
    )


def leaderboard_entry(scores: Sequence[ItemScore]) -> LeaderboardEntry:
    """The leaderboard's fields for one method: counts, the plain valid-step MAE and per-source counts."""
    by_source: dict[str, list[ItemScore]] = {}
    for score in scores:
        by_source.setdefault(score.source, []).append(score)
    errors = [score.abs_err for score in scores if score.abs_err is not None]
    pooled = _counts(scores)
    return LeaderboardEntry(
        n=pooled["n"],
        role_correct=pooled["role_correct"],
        root_exact_correct=pooled["root_exact_correct"],
        root_within_5_correct=pooled["root_within_5_correct"],
        root_mae=sum(errors) / len(errors) if errors else None,
        valid_step_n=len(errors),
        failed_n=len(scores) - len(errors),
        by_benchmark={source: _counts(by_source[source]) for source in sorted(by_source)},
    )


def score_submission(
    predictions_file: PredictionsFile, expected: Sequence[Expected], *, keep_handoff: bool = False
) -> SubmissionScore:
    """Score a submission against the expected trajectories and collect everything wrong with it.

    Args:
        predictions_file: what `load_predictions_jsonl` read.
        expected: the trajectories that count; every one stays in the denominators.
        keep_handoff: the ablation role rule (keep handoff suffixes).

    Raises:
        ValueError: a qid appears twice in ``expected``.
    """
    predictions = predictions_file.predictions
    items = score_items(expected, predictions, keep_handoff=keep_handoff)
    expected_qids = {item.qid for item in expected}
    return SubmissionScore(
        items=tuple(items),
        entry=leaderboard_entry(items),
        missing=tuple(item.qid for item in expected if item.qid not in predictions),
        duplicates=predictions_file.duplicates,
        unknown=tuple(qid for qid in predictions if qid not in expected_qids),
        problems=predictions_file.problems,
        notes=predictions_file.notes,
    )


def write_predictions_jsonl(
    path: str | Path, predictions: Mapping[str, Prediction], *, abstentions: AbstentionRule = "fields"
) -> int:
    """Write predictions in the submission format, one line per qid in natural qid order.

    The format has no abstention flag and a step must be an int, so: a step that does not parse
    (`rcarun.data.parse_step`) is written as -1, a missing role as ``""``, and an abstained
    prediction by ``abstentions``: its own role and step under ``"fields"`` (the main comparisons' rule, the
    leaderboard's), role ``""`` and step -1 under ``"error"``. Each of those scores as an error for its target
    exactly as `rcarun.analysis.scoring.score_items` scores the prediction itself under the same rule, so reading
    the file back gives the same scores.

    Args:
        path: the file to (over)write.
        predictions: predictions by qid.
        abstentions: the `AbstentionRule` the file must reproduce.

    Returns:
        The number of lines written.
    """
    with Path(path).open("w", encoding="utf-8", newline="\n") as handle:
        for qid in sorted(predictions, key=natural_sort_key):
            prediction = predictions[qid]
            step = parse_step(prediction.step)
            role = prediction.role
            if prediction.abstained and abstentions == "error":
                role, step = None, None
            row = {
                "question_ID": qid,
                "predicted_role": role if role is not None else "",
                "predicted_step": step if step is not None else -1,
            }
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return len(predictions)
