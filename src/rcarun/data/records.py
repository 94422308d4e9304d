"""One record object, as read from a file or a JSONL line, checked and turned into a `Record`.

Every problem is a `DataError` naming the file, the record and the field. Identifiers holding an unpaired
surrogate are refused; free text has them repaired. Rules: docs/reliability.md ("Dataset files").
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from rcarun import jsonfast
from rcarun.errors import DataError
from rcarun.text import first_lone_surrogate, repair_surrogates

from .roles import normalize_role
from .task import derive_task
from .trajectory import Record, Reference, Step, Trajectory, agent_of_step, parse_step

__all__ = ["Loaded", "decode_json", "parse_record", "require_identifier", "shown"]

_LONGRCA_QID = re.compile(r"^[A-Za-z0-9_]+__\d+$")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # how JSON spells one: \ud800 to \uDFFF


@dataclass(frozen=True, slots=True)
class Loaded:
    """A parsed record with where it came from, for duplicate-qid messages."""

    record: Record
    path: str
    label: str
    qid_field: str


@dataclass(frozen=True, slots=True)
class _Where:
    """The file and record a problem is in, which every `DataError` of a record names."""

    path: str
    label: str

    def problem(self, message: str, field: str = "") -> DataError:
        return DataError(message, path=self.path, record=self.label, field=field)

    def not_a_string(self, value: object, field: str) -> DataError:
        return self.problem(f"expected a string, got {type(value).__name__}", field)

    def require_identifier(self, text: str, field: str, what: str = "") -> None:
        """Raise `DataError` if an identifier holds an unpaired surrogate; ``what`` names it if no field does."""
        position = first_lone_surrogate(text)
        if position is not None:
            surrogate = f"\\u{ord(text[position]):04x}"
            raise self.problem(
                f"{what}contains an unpaired UTF-16 surrogate ({surrogate} at character {position}); "
                "identifiers must be valid Unicode",
                field,
            )


def require_identifier(text: str, *, path: str, label: str, field: str, what: str = "") -> None:
    """Raise `DataError` if an identifier holds an unpaired surrogate; ``what`` names it if no field does."""
    _Where(path, label).require_identifier(text, field, what)


def decode_json(data: bytes, *, path: str, label: str) -> dict[str, Any]:
    at = _Where(path, label)
    try:
        obj = jsonfast.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise at.problem(f"not UTF-8 text: {exc.reason} at byte {exc.start}") from exc
    except json.JSONDecodeError as exc:
        raise at.problem(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    if not isinstance(obj, dict):
        raise at.problem(f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _choose_qid(obj: dict[str, Any], at: _Where, fallback_qid: str | None) -> tuple[str, str]:
    """The record's qid and the field it came from (scheme in docs/reliability.md)."""
    explicit = obj.get("qid")
    if explicit is not None:
        if not isinstance(explicit, str) or not explicit.strip():
            raise at.problem("'qid' must be a non-empty string", "qid")
        at.require_identifier(explicit, "qid")
        return explicit.strip(), "qid"
    question_id = obj.get("question_ID")
    if question_id is not None and not isinstance(question_id, str):
        raise at.not_a_string(question_id, "question_ID")
    if question_id is not None:
        at.require_identifier(question_id, "question_ID")
    if question_id is not None and _LONGRCA_QID.match(question_id.strip()):
        return question_id.strip(), "question_ID"
    if fallback_qid is None:
        raise at.problem("no identifier: the record needs a 'qid' or a 'question_ID'", "question_ID")
    # A JSONL fallback's parts are checked by now; a file's comes from its directory and file names.
    at.require_identifier(fallback_qid, "", what=f"qid {fallback_qid!r} (from the file and directory names) ")
    return fallback_qid, "question_ID"


def parse_record(
    obj: dict[str, Any],
    *,
    path: str,
    source: str,
    fallback_qid: str | None,
    line: int | None,
    raw: bytes,
) -> Loaded:
    first_label = f"line {line}" if line is not None else shown(fallback_qid or "")
    qid, qid_field = _choose_qid(obj, _Where(path, first_label), fallback_qid)
    label = qid if line is None else f"{qid} (line {line})"
    at = _Where(path, label)
    sha256 = hashlib.sha256(raw).hexdigest()
    # UTF-8 cannot carry a surrogate, so a decoded str holds one only where the bytes spell it as an escape;
    # one pass over the bytes spares the per-string checks of almost every record.
    screen = _SURROGATE_ESCAPE.search(raw) is not None

    repaired = _screen_surrogates(obj, at) if screen else ()
    steps = _parse_history(obj, at)
    question = obj.get("question")
    if question is not None and not isinstance(question, str):
        raise at.not_a_string(question, "question")
    ground_truth = obj.get("ground_truth")
    if ground_truth is not None and not isinstance(ground_truth, str):
        raise at.not_a_string(ground_truth, "ground_truth")
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
    reference = _parse_reference(obj, trajectory, at)
    origin = path if line is None else f"{path}:{line}"
    record = Record(trajectory, reference, origin, repaired_fields=repaired)
    return Loaded(record, path=path, label=label, qid_field=qid_field)


def _parse_history(obj: dict[str, Any], at: _Where) -> tuple[Step, ...]:
    if "history" not in obj:
        raise at.problem("missing", "history")
    history = obj["history"]
    if not isinstance(history, list):
        raise at.problem(f"expected a list of steps, got {type(history).__name__}", "history")
    if not history:
        raise at.problem("empty: a trajectory needs at least one step", "history")
    steps: list[Step] = []
    # Runs once per step of every record loaded: the field names of the errors are only spelled when one is raised.
    for index, item in enumerate(history):
        if type(item) is not dict:
            raise at.problem(f"expected an object, got {type(item).__name__}", f"history[{index}]")
        content = item.get("content")
        role = item.get("role")
        if type(content) is not str or type(role) is not str:
            key, value = ("content", content) if type(content) is not str else ("role", role)
            problem = "missing" if value is None else f"expected a string, got {type(value).__name__}"
            raise at.problem(problem, f"history[{index}].{key}")
        name = item.get("name")
        if name is not None and type(name) is not str:
            raise at.not_a_string(name, f"history[{index}].name")
        recorded_step = item.get("step")
        if recorded_step is not None and (type(recorded_step) is not int or recorded_step != index):
            raise at.problem(
                f"is {recorded_step!r} but the item is at 0-based position {index}", f"history[{index}].step"
            )
        agent = agent_of_step(name, role)
        if not agent:
            raise at.problem(
                f"no agent: name {name!r} and role {role!r} are empty once the suffix is removed",
                f"history[{index}].name" if name is not None else f"history[{index}].role",
            )
        steps.append(Step(index=index, agent=agent, role=role, content=content))
    return tuple(steps)


def _parse_reference(obj: dict[str, Any], trajectory: Trajectory, at: _Where) -> Reference | None:
    has_agent, has_step = "mistake_agent" in obj, "mistake_step" in obj
    if not has_agent and not has_step:
        return None
    if not has_agent or not has_step:
        missing = "mistake_agent" if not has_agent else "mistake_step"
        raise at.problem("missing while the other label field is present", missing)

    agent = obj["mistake_agent"]
    if not isinstance(agent, str) or not agent.strip():
        raise at.problem(f"expected a non-empty agent name, got {agent!r}", "mistake_agent")
    if normalize_role(agent) not in {normalize_role(known) for known in trajectory.agents}:
        raise at.problem(
            f"unknown agent {agent!r}: not among the recorded agents {list(trajectory.agents)}",
            "mistake_agent",
        )

    value = obj["mistake_step"]
    step = parse_step(value)
    if step is None:
        raise at.problem(
            f"expected a 0-based integer step (or a string holding one), got {value!r}", "mistake_step"
        )
    if step < 0 or step >= trajectory.n_steps:
        raise at.problem(
            f"{step} is out of range: the history has {trajectory.n_steps} steps (0-based)", "mistake_step"
        )

    rationale = obj.get("mistake_reason")
    if rationale is not None and not isinstance(rationale, str):
        raise at.not_a_string(rationale, "mistake_reason")
    return Reference(role=agent, step=step, rationale=rationale or "")


def _screen_surrogates(obj: dict[str, Any], at: _Where) -> tuple[str, ...]:
    """Reject identifiers that hold an unpaired surrogate, repair free text in ``obj`` in place, and return the
    repaired fields in file order (a field of the wrong type is left to the parser)."""
    repaired: list[str] = []
    history = obj.get("history")
    for index, item in enumerate(history if isinstance(history, list) else ()):
        if not isinstance(item, dict):
            continue
        where = f"history[{index}]"
        for key in ("role", "name"):
            if isinstance(value := item.get(key), str):
                at.require_identifier(value, f"{where}.{key}")
        if isinstance(content := item.get("content"), str):
            item["content"] = _repaired(content, f"{where}.content", repaired)
    if isinstance(agent := obj.get("mistake_agent"), str):
        at.require_identifier(agent, "mistake_agent")
    for key in ("question", "ground_truth", "mistake_reason"):
        if isinstance(text := obj.get(key), str):
            obj[key] = _repaired(text, key, repaired)
    return tuple(repaired)


def shown(text: str) -> str:
    """``text`` with each unpaired surrogate written as its ``\\uXXXX`` escape: printable and storable."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _repaired(text: str, field: str, repairs: list[str]) -> str:
    """``text`` with each unpaired surrogate replaced by U+FFFD; ``field`` goes to ``repairs`` if any was."""
    fixed = repair_surrogates(text)
    if fixed is not text:
        repairs.append(field)
    return fixed
