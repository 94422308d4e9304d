"""What a continuation turn sends and how its answer is judged: the prompt tree, schemas, the change rule.

The sentence set is ``prompts/continual_search_sentences.txt``; `continuation_prompt` assembles paper 003's
decision tree from it (App. B.2). The change rule is only a sentence of the prompt: `rule_record` says whether an
answer followed it, for analysis. The rules: ``docs/methods/continual-search.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from string import Template
from typing import Any, Literal

from rcarun.data import Trajectory
from rcarun.methods.all_at_once import answer_schema
from rcarun.methods.base import Attribution
from rcarun.methods.rcta.grounding import MIN_QUOTE_CHARS, normalize_quote_text

__all__ = [
    "SENTENCES",
    "UNREAD",
    "AnswerKind",
    "ContinuationPrompt",
    "Layout",
    "Mode",
    "TurnAnswer",
    "change_rule_applies",
    "continuation_prompt",
    "list_schema",
    "passive_prompt",
    "pieces",
    "quote_found",
    "quote_schema",
    "rule_record",
]

Mode = Literal["search", "passive"]
Layout = Literal["whole", "pieces"]
AnswerKind = Literal["single", "list"]


def _load_sentences() -> dict[str, str]:
    text = resources.files("rcarun.methods").joinpath("prompts", "continual_search_sentences.txt")
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            current = sections.setdefault(line[3:].strip(), [])
        elif line.startswith("#"):
            continue
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines).strip() for name, lines in sections.items()}


SENTENCES = _load_sentences()
"""The fixed sentence set by name (``opening.2``, ``trust.3``, ``search.single``, ``change.single``, ...)."""


@dataclass(frozen=True, slots=True)
class ContinuationPrompt:
    """A turn's prompt as the tree assembled it: (part, sentence) in order, and the text sent."""

    parts: tuple[tuple[str, str], ...]

    @property
    def text(self) -> str:
        return "\n\n".join(sentence for _, sentence in self.parts)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.parts)


def _turn_form(turn: int, turns: int) -> int:
    """Which opening/trust line a turn gets: 2 (turn 2), 4 (the last turn), else 3 (a middle turn)."""
    if turn == 2:
        return 2
    return 4 if turn == turns else 3


def continuation_prompt(
    turn: int,
    *,
    turns: int,
    layout: Layout,
    answer_kind: AnswerKind,
    schema_text: str,
    pieces: str = "parts of the log",
    unread_block: str = "",
    quote_field: bool = False,
) -> ContinuationPrompt:
    """Continual Search's prompt for ``turn`` (2..turns), by the paper's decision tree (docs/methods/continual-search.md)."""
    if not 2 <= turn <= turns:
        raise ValueError(f"continuation turns run from 2 to {turns}, got {turn}")
    form = _turn_form(turn, turns)
    parts: list[tuple[str, str]] = [
        (f"opening.{form}", SENTENCES[f"opening.{form}"]),
        (f"trust.{form}", SENTENCES[f"trust.{form}"]),
    ]
    if layout == "pieces":
        key = "search.pieces.first" if turn == 2 else "search.pieces.later"
        sentence = Template(SENTENCES[key]).substitute(pieces=pieces, unread_block=unread_block or "(none)")
        parts.append((key, sentence))
    elif answer_kind == "list":
        parts.append(("search.list", SENTENCES["search.list"]))
    else:
        parts.append(("search.single", SENTENCES["search.single"]))
    if change_rule_applies(turn, answer_kind):
        parts.append(("change.single", SENTENCES["change.single"]))
        if quote_field:
            parts.append(("format.quote", SENTENCES["format.quote"]))
    key = f"format.{answer_kind}"
    parts.append((key, Template(SENTENCES[key]).substitute(schema=schema_text)))
    return ContinuationPrompt(tuple(parts))


def change_rule_applies(turn: int, answer_kind: AnswerKind) -> bool:
    """The tree adds the change rule at turns 3 and later, for a single-item answer (003 App. B.2.2)."""
    return answer_kind == "single" and turn >= 3


def passive_prompt(*, schema_text: str) -> ContinuationPrompt:
    """Passive Continuation's prompt: the same fixed sentence every turn, then the answer format."""
    return ContinuationPrompt(
        (
            ("passive", SENTENCES["passive"]),
            ("format.single", Template(SENTENCES["format.single"]).substitute(schema=schema_text)),
        )
    )


def quote_found(quote: object, text: str) -> bool:
    """Whether a quote of at least 15 characters occurs in ``text`` (the change rule's record; docs/methods/continual-search.md)."""
    if not isinstance(quote, str):
        return False
    wanted = normalize_quote_text(quote)
    return len(wanted) >= MIN_QUOTE_CHARS and wanted in normalize_quote_text(text)


@dataclass(frozen=True, slots=True)
class TurnAnswer:
    """One turn's prediction, as the model gave it."""

    role: str | None
    step: int | None
    role_valid: bool
    step_valid: bool

    @classmethod
    def of(cls, attribution: Attribution) -> TurnAnswer:
        return cls(
            attribution.pred_role, attribution.pred_step, attribution.role_valid, attribution.step_valid
        )

    def same_as(self, other: TurnAnswer) -> bool:
        return (self.role, self.step) == (other.role, other.step)


UNREAD = TurnAnswer(None, None, False, False)


def list_schema(trajectory: Trajectory) -> dict[str, Any]:
    """``answer_kind="list"``: every failure, earliest first, each with its quote."""
    single = answer_schema(trajectory)["properties"]
    failure = {
        "type": "object",
        "properties": {
            "responsible_role": single["responsible_role"],
            "root_step": single["root_step"],
            "quote": {"type": "string"},
        },
        "required": ["responsible_role", "root_step", "quote"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {
            "reason": {"type": "string"},
            "failures": {"type": "array", "items": failure, "minItems": 1},
        },
        "required": ["reason", "failures"],
        "additionalProperties": False,
    }


def quote_schema(trajectory: Trajectory) -> dict[str, Any]:
    """The benchmark's answer schema with the change rule's ``quote`` (``quote_field``; docs/methods/continual-search.md)."""
    schema = answer_schema(trajectory)
    properties = {**schema["properties"], "quote": {"type": "string"}}
    return {**schema, "properties": properties, "required": [*schema["required"], "quote"]}


def pieces(n_steps: int, size: int) -> list[tuple[int, int]]:
    """``layout="pieces"``: the inclusive step ranges of consecutive blocks of ``size`` steps."""
    return [(start, min(start + size, n_steps) - 1) for start in range(0, n_steps, size)]


def rule_record(
    previous: TurnAnswer,
    answer: TurnAnswer,
    quotes: list[str],
    invalid: str | None,
    trajectory: Trajectory,
    *,
    quote_scope: str,
) -> dict[str, Any]:
    """Whether the turn's answer followed the change rule, for analysis only (docs/methods/continual-search.md)."""
    changed = not answer.same_as(previous)
    if invalid is not None:
        return {
            "changed": changed,
            "followed": False,
            "broken": [f"the answer could not be read: {invalid}"],
        }
    if not changed:
        return {"changed": False, "followed": True}
    broken: list[str] = []
    step = answer.step if answer.step_valid else None
    if step is None:
        earlier = False
        broken.append("the new root_step is not a step of the log")
    else:
        earlier = not previous.step_valid or previous.step is None or step < previous.step
        if not earlier:
            relation = "the same step as" if step == previous.step else "later than"
            broken.append(f"step {step} is {relation} the previous step {previous.step}, not earlier")
    in_step = step is not None and any(quote_found(q, trajectory.steps[step].content) for q in quotes)
    log = "\n".join(s.content for s in trajectory.steps)
    in_log = any(quote_found(q, log) for q in quotes)
    if not (in_step if quote_scope == "step" else in_log):
        where = "the chosen step" if quote_scope == "step" else "the log"
        broken.append(f"no quote of at least {MIN_QUOTE_CHARS} characters is found in {where}")
    record: dict[str, Any] = {
        "changed": True,
        "followed": not broken,
        "earlier": earlier,
        "quote_in_step": in_step,
        "quote_in_log": in_log,
    }
    if broken:
        record["broken"] = broken
    return record
