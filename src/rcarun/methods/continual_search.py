"""Continual Search and Passive Continuation: one judge, several turns of the same conversation.

"Root-Cause Attribution Is a Search Problem" (``../shared/papers/003_*.txt``, Sec. 3.1 and App. B.2) shows that on
long logs a judge pushed, turn after turn, to search evidence it has not examined beats a one-shot judge and a
judge merely asked to reconsider. Both conditions start from the same turn 1 and differ only in what later turns
say:

- **Turn 1** is a base method, unchanged (``base``: All-at-once by default, or RCTA, whose last call sends the
  final attribution package). The base method runs against a wrapper that keeps its calls; the conversation of its
  last ``turn1_stage`` call (default ``"attribution"``; a retried call: the retry) with the answer it got is the
  session the later turns continue, and the base method's own verdict is the turn-1 prediction.
- **Continual Search** (``continual-search``): turns 2..``turns`` (default 4) each append one user prompt built by
  the paper's decision tree (`continuation_prompt`) from the fixed sentences in
  ``prompts/continual_search_sentences.txt``:
  1. the opening line and 2. the trust line are chosen by the turn (turn 2; a middle turn; the last turn);
  3. the search action by two questions: does the evidence come as separate pieces the judge can leave unopened
     (``layout="pieces"``: turn 2 derives the answer again from the start, later turns open the unopened pieces,
     listed), and, when it does not, is the answer one item or a list (``answer_kind``: a list gets another sweep
     of the least-covered parts; a single item gets "test each candidate and keep the earliest one that was never
     fixed and still leads to the failure");
  4. the change rule, at turns 3 and later for a single-item answer: the answer may move only to an earlier cause
     backed by an exact quote;
  5. the answer format (the benchmark's: ``responsible_role`` and ``root_step``, plus ``quote``).
- **Passive Continuation** (``passive-continuation``): one fixed sentence ("Reconsider your answer and verify it
  again.") and the answer format, every turn.

The change rule is enforced, not only asked for: at a turn where it applies, an answer that differs from the
standing one is accepted only when its step is valid and earlier than the standing step (any valid step when the
standing answer has none) and its ``quote`` is found in the record. "Found" is `normalize_quote_text` equality
as a substring (whitespace runs collapsed, lowercased; punctuation kept) of a quote of at least 15 characters, in
the chosen step's content (``quote_scope="step"``, default) or anywhere in the log (``"log"``). A rejected move —
including an answer that is not valid JSON — leaves the standing answer in place; the rejection and its reason are
recorded. Where the rule does not apply (turn 2, Passive Continuation, list answers) the turn's answer stands as
answered, invalid fields included (never repaired).

Reading (``reading``): ``"inline"`` (default) continues a conversation whose turn 1 showed the log; ``"agentic"``
gives every turn the trajectory tools of `rcarun.methods.reading` (read a step range, search by regex, list roles;
at most ``max_tool_calls`` per turn) and, with All-at-once as the base, makes turn 1 read that way too (unless
``base_options`` says otherwise). Every tool call and its result are recorded per turn (``tool_log``).

Choices where the paper is silent (each an option):
- ``layout="auto"``: "pieces" when the judge reads the log through tools (pieces are blocks of ``piece_steps``
  consecutive steps; a piece is unopened while none of its steps has been read), else "whole" — an inlined log is
  one artifact the judge has already read.
- The opening and trust lines have three forms: turn 2, middle turns, and the last turn (with ``turns=4``:
  turns 2, 3 and 4, as in the paper).
- ``answer_kind="list"`` asks, from turn 2, for every failure earliest first; the prediction is the listed
  failure with the earliest valid step (the root cause is the earliest decisive error).
- Continuation turns use the turn-1 call's output budget, temperature and reasoning setting unless
  ``max_tokens`` is given. Their stage is ``stage`` (default ``"continuation"``).
- Turn 1 is declared shareable (``shareable_stages``), so Continual Search and Passive Continuation over the same
  base and backbone pay for one turn 1 between them, as the paper branches one session.

Unreadable answers and fallbacks (``Attribution.error`` / ``fallback``) follow the answer that stands at the
end, from the turn that gave it:
- ``error``: that turn's answer could not be read (not a JSON object, the tool-call cap spent,
  ``responsible_role`` / ``root_step`` missing or mistyped, no listed failure with a valid step); when the
  standing answer is turn 1's, the base method's own ``error``. A later unreadable answer that the change rule
  rejected leaves the standing answer, and so no error.
- ``fallback``: the change rule kept the standing answer against the model's later answers (counted over the
  turns after the standing answer was given), and, when turn 1's answer stands, the base method's own
  fallback.

Evidence read per turn: deduplicated tokens (`EvidenceLedger`: whitespace tokens not inside a 13-gram seen before,
as the paper dedupes observation tokens). With an inlined log, the judge has read at turn 1 everything its
prompt showed (the turn-1 user messages, instructions included) and reads nothing new later; with tools, it is the
text the tools returned each turn (turn 1's executed calls are replayed from the base method's ``tool_log`` to
rebuild what it read). Every turn's prediction, ``changed_from_prev`` and evidence are in the output
(``turns``), which `rcarun report` turns into per-turn accuracy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from string import Template
from typing import Any, Literal

from rcarun.data import Trajectory
from rcarun.errors import ConfigError
from rcarun.methods._options import check_base_method, reject_unknown_options
from rcarun.methods.all_at_once import AllAtOnce, answer_error, answer_schema
from rcarun.methods.base import Attribution, is_int, role_is_valid, step_is_valid
from rcarun.methods.llm import LLM, Message, Reply, ToolCall
from rcarun.methods.proxies import TranscriptLLM
from rcarun.methods.rcta.grounding import MIN_QUOTE_CHARS, normalize_quote_text
from rcarun.methods.reading import EvidenceLedger, TrajectoryReader, converse_with_tools
from rcarun.methods.registry import create_method, method

__all__ = [
    "SENTENCES",
    "ContinualSearch",
    "ContinualSearchOptions",
    "ContinuationPrompt",
    "continuation_prompt",
    "passive_prompt",
    "quote_found",
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
) -> ContinuationPrompt:
    """Continual Search's prompt for ``turn`` (2..turns), by the paper's decision tree (module docstring)."""
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
    if answer_kind == "single" and turn >= 3:
        parts.append(("change.single", SENTENCES["change.single"]))
    key = f"format.{answer_kind}"
    parts.append((key, Template(SENTENCES[key]).substitute(schema=schema_text)))
    return ContinuationPrompt(tuple(parts))


def passive_prompt(*, schema_text: str) -> ContinuationPrompt:
    """Passive Continuation's prompt: the same fixed sentence every turn, then the answer format."""
    return ContinuationPrompt(
        (
            ("passive", SENTENCES["passive"]),
            ("format.single", Template(SENTENCES["format.single"]).substitute(schema=schema_text)),
        )
    )


def quote_found(quote: object, text: str) -> bool:
    """The change rule's check: a quote of at least 15 characters occurring in ``text`` (module docstring)."""
    if not isinstance(quote, str):
        return False
    wanted = normalize_quote_text(quote)
    return len(wanted) >= MIN_QUOTE_CHARS and wanted in normalize_quote_text(text)


@dataclass(frozen=True, slots=True)
class ContinualSearchOptions:
    base: str = "all-at-once"
    base_options: dict[str, Any] = field(default_factory=dict)
    turns: int = 4
    turn1_stage: str = "attribution"
    stage: str = "continuation"
    max_tokens: int | None = None
    layout: Literal["auto", "whole", "pieces"] = "auto"
    answer_kind: AnswerKind = "single"
    quote_scope: Literal["step", "log"] = "step"
    piece_steps: int = 20
    reading: Literal["inline", "agentic"] = "inline"
    max_tool_calls: int = 24

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any], *, name: str) -> ContinualSearchOptions:
        reject_unknown_options(name, cls, options)
        if name == "passive-continuation":
            searching = sorted(set(options) & {"layout", "answer_kind", "quote_scope", "piece_steps"})
            if searching:
                raise ConfigError(
                    f"{name}: {searching} shape Continual Search's prompts; passive has one sentence"
                )
        parsed = cls(**options)
        if not is_int(parsed.turns) or not 1 <= parsed.turns <= 16:
            raise ConfigError(f"{name}: turns must be an integer from 1 to 16")
        if parsed.max_tokens is not None and (not is_int(parsed.max_tokens) or parsed.max_tokens <= 0):
            raise ConfigError(f"{name}: max_tokens must be a positive integer or absent")
        if parsed.layout not in ("auto", "whole", "pieces"):
            raise ConfigError(f"{name}: layout must be 'auto', 'whole' or 'pieces'")
        if parsed.answer_kind not in ("single", "list"):
            raise ConfigError(f"{name}: answer_kind must be 'single' or 'list'")
        if parsed.quote_scope not in ("step", "log"):
            raise ConfigError(f"{name}: quote_scope must be 'step' or 'log'")
        if not is_int(parsed.piece_steps) or parsed.piece_steps <= 0:
            raise ConfigError(f"{name}: piece_steps must be a positive integer")
        if parsed.reading not in ("inline", "agentic"):
            raise ConfigError(f"{name}: reading must be 'inline' or 'agentic'")
        if not is_int(parsed.max_tool_calls) or parsed.max_tool_calls <= 0:
            raise ConfigError(f"{name}: max_tool_calls must be a positive integer")
        for key in ("stage", "turn1_stage"):
            if not isinstance(getattr(parsed, key), str) or not getattr(parsed, key):
                raise ConfigError(f"{name}: {key} must be a non-empty string")
        check_base_method(
            name,
            parsed.base,
            parsed.base_options,
            excluded=_MULTI_TURN,
            kind="a one-shot method",
            create_with=parsed.turn1_options(),
        )
        return parsed

    def turn1_options(self) -> dict[str, Any]:
        """The base method's options: All-at-once reads the way the continuation does unless told otherwise."""
        options = dict(self.base_options) if isinstance(self.base_options, dict) else {}
        if self.base == "all-at-once" and "reading" not in options:
            return {**options, "reading": self.reading, "max_tool_calls": self.max_tool_calls}
        return options


_MULTI_TURN = ("continual-search", "passive-continuation", "self-consistency", "judge-panel")


@dataclass(frozen=True, slots=True)
class _Answer:
    """One turn's standing prediction."""

    role: str | None
    step: int | None
    role_valid: bool
    step_valid: bool

    @classmethod
    def of(cls, attribution: Attribution) -> _Answer:
        return cls(
            attribution.pred_role, attribution.pred_step, attribution.role_valid, attribution.step_valid
        )

    def same_as(self, other: _Answer) -> bool:
        return (self.role, self.step) == (other.role, other.step)


def _list_schema(trajectory: Trajectory) -> dict[str, Any]:
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


def _search_schema(trajectory: Trajectory) -> dict[str, Any]:
    schema = answer_schema(trajectory)
    properties = {**schema["properties"], "quote": {"type": "string"}}
    return {**schema, "properties": properties, "required": [*schema["required"], "quote"]}


def _pieces(n_steps: int, size: int) -> list[tuple[int, int]]:
    return [(start, min(start + size, n_steps) - 1) for start in range(0, n_steps, size)]


_STEP_IDS = re.compile(r"\[step (\d+)\]")


class ContinualSearch:
    """Turn 1 by the base method, then turns of the same conversation (Continual Search or Passive Continuation)."""

    def __init__(self, label: str, options: ContinualSearchOptions, mode: Mode) -> None:
        self.label = label
        self.options = options
        self.mode = mode
        self._base = create_method(options.base, options=options.turn1_options())
        # Turn 1 is the same request under both conditions: paid once (module docstring).
        self.shareable_stages = frozenset(getattr(self._base, "shareable_stages", ())) | {options.turn1_stage}

    def _layout(self) -> Layout:
        if self.options.layout != "auto":
            return self.options.layout
        return "pieces" if self.options.reading == "agentic" else "whole"

    def _reader(self, trajectory: Trajectory, messages: list[Message], llm: LLM) -> TrajectoryReader:
        """The continuation's tools, with All-at-once's result cap for this context when it is the base."""
        if isinstance(self._base, AllAtOnce):
            return TrajectoryReader(trajectory, max_result_chars=self._base.result_chars(messages, llm))
        return TrajectoryReader(trajectory)

    def _schema(self, trajectory: Trajectory) -> dict[str, Any]:
        if self.mode == "passive":
            return answer_schema(trajectory)
        return _list_schema(trajectory) if self.options.answer_kind == "list" else _search_schema(trajectory)

    def _prompt(
        self, turn: int, trajectory: Trajectory, schema: Mapping[str, Any], read: set[int]
    ) -> ContinuationPrompt:
        schema_text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
        if self.mode == "passive":
            return passive_prompt(schema_text=schema_text)
        unread = [
            f"- steps {start}-{end}"
            for start, end in _pieces(trajectory.n_steps, self.options.piece_steps)
            if not read.intersection(range(start, end + 1))
        ]
        return continuation_prompt(
            turn,
            turns=self.options.turns,
            layout=self._layout(),
            answer_kind=self.options.answer_kind,
            schema_text=schema_text,
            pieces=f"parts of the log ({self.options.piece_steps} steps each)",
            unread_block="\n".join(unread),
        )

    def _parse(self, reply: Reply, trajectory: Trajectory) -> tuple[_Answer, str, str | None]:
        """The turn's answer as given, its quote, and why it is invalid (None when it is a JSON object)."""
        answer = reply.parsed if isinstance(reply.parsed, dict) else None
        if answer is None:
            return (
                _Answer(None, None, False, False),
                "",
                reply.parse_error or "the answer is not a JSON object",
            )
        if self.mode == "search" and self.options.answer_kind == "list":
            failures = answer.get("failures")
            entries = [f for f in failures if isinstance(f, dict)] if isinstance(failures, list) else []
            valid = [f for f in entries if step_is_valid(f.get("root_step"), trajectory)]
            if not valid:
                return _Answer(None, None, False, False), "", "no listed failure has a valid root_step"
            earliest = min(valid, key=lambda f: f["root_step"])
            role = earliest.get("responsible_role")
            quote = earliest.get("quote")
            return (
                _Answer(
                    role if isinstance(role, str) else None,
                    earliest["root_step"],
                    role_is_valid(role, trajectory),
                    True,
                ),
                quote if isinstance(quote, str) else "",
                None,
            )
        role = answer.get("responsible_role")
        step = answer.get("root_step")
        quote = answer.get("quote")
        return (
            _Answer(
                role if isinstance(role, str) else None,
                step if is_int(step) else None,
                role_is_valid(role, trajectory),
                step_is_valid(step, trajectory),
            ),
            quote if isinstance(quote, str) else "",
            None,
        )

    def _change_rule_applies(self, turn: int) -> bool:
        return self.mode == "search" and self.options.answer_kind == "single" and turn >= 3

    def _judge_move(
        self, standing: _Answer, proposed: _Answer, quote: str, invalid: str | None, trajectory: Trajectory
    ) -> str | None:
        """Why a move from ``standing`` to ``proposed`` is rejected under the change rule, or None if allowed."""
        if invalid is not None:
            return f"invalid answer: {invalid}"
        if not proposed.step_valid or proposed.step is None:
            return "the new root_step is not a step of the log"
        if standing.step_valid and standing.step is not None and proposed.step >= standing.step:
            return f"step {proposed.step} is not earlier than the standing step {standing.step}"
        scope = (
            trajectory.steps[proposed.step].content
            if self.options.quote_scope == "step"
            else "\n".join(s.content for s in trajectory.steps)
        )
        if not quote_found(quote, scope):
            where = f"step {proposed.step}" if self.options.quote_scope == "step" else "the log"
            return f"the quote is not found in {where}"
        return None

    async def attribute(self, trajectory: Trajectory, llm: LLM) -> Attribution:
        options = self.options
        transcript = TranscriptLLM(llm)
        first = await self._base.attribute(trajectory, transcript)
        standing = _Answer.of(first)
        exchange = transcript.last(options.turn1_stage)
        output: dict[str, Any] = {
            "mode": self.mode,
            "base": options.base,
            "reading": options.reading,
            "layout": self._layout(),
            "answer_kind": options.answer_kind if self.mode == "search" else "single",
            "turn1": dict(first.output),
        }
        evidence = EvidenceLedger()
        if exchange is None:
            output["turns"] = [
                _turn_record(1, standing, changed=False, evidence_new=0, evidence=evidence, calls=0)
                | {"base_calls": len(transcript.exchanges)}
            ]
            if options.turns > 1:
                output["no_continuation"] = f"the base method made no {options.turn1_stage!r} call"
            return _final(first, standing, output, error=first.error, fallback=first.fallback)

        conversation: list[Message] = [*exchange.messages, Message("assistant", exchange.reply.text)]
        reader = self._reader(trajectory, conversation, llm) if options.reading == "agentic" else None
        read, turn1_evidence = self._turn1_reading(trajectory, first, exchange.messages, reader, evidence)
        turns: list[dict[str, Any]] = [
            _turn_record(1, standing, changed=False, evidence_new=turn1_evidence, evidence=evidence, calls=0)
            | {"base_calls": len(transcript.exchanges), "steps_read": len(read)}
        ]
        output["turns"] = turns
        schema = self._schema(trajectory)
        # The turn whose answer stands, why it could not be read, and the change rule's rejections since then.
        source_turn, standing_error, rejected = 1, first.error, 0
        for turn in range(2, options.turns + 1):
            prompt = self._prompt(turn, trajectory, schema, read)
            conversation.append(Message("user", prompt.text))
            record: dict[str, Any] = {"prompt_parts": list(prompt.keys)}
            max_tokens = options.max_tokens or exchange.max_tokens
            if reader is not None:
                tool_turn = await converse_with_tools(
                    llm,
                    conversation,
                    reader=reader,
                    ledger=evidence,
                    stage=options.stage,
                    max_tokens=max_tokens,
                    schema=schema,
                    temperature=exchange.temperature,
                    reasoning=exchange.reasoning,
                    max_tool_calls=options.max_tool_calls,
                )
                reply, conversation, calls = tool_turn.reply, tool_turn.messages, tool_turn.calls
                evidence_new = tool_turn.evidence_tokens
                record.update(
                    tool_calls=tool_turn.tool_calls, capped=tool_turn.capped, tool_log=tool_turn.tool_log
                )
            else:
                reply = await llm.chat(
                    conversation,
                    stage=options.stage,
                    max_tokens=max_tokens,
                    schema=schema,
                    temperature=exchange.temperature,
                    reasoning=exchange.reasoning,
                )
                conversation.append(Message("assistant", reply.text))
                calls, evidence_new = 1, 0
            record["finish_reason"] = reply.finish_reason
            proposed, quote, invalid = self._parse(reply, trajectory)
            if record.get("capped"):
                invalid = (
                    f"the model still called tools after its {options.max_tool_calls} tool calls were spent"
                )
                proposed = _Answer(None, None, False, False)
            if invalid is not None:
                record["invalid_answer"] = invalid
                record["raw_text"] = reply.text[:2000]
            if quote:
                record["quote"] = quote[:500]
            accepted = proposed
            if self._change_rule_applies(turn) and not proposed.same_as(standing):
                rejection = self._judge_move(standing, proposed, quote, invalid, trajectory)
                record["proposed"] = {"role": proposed.role, "step": proposed.step}
                if rejection is not None:
                    record["move_rejected"] = rejection
                    accepted = standing
            if "move_rejected" in record:
                rejected += 1
            else:
                source_turn, standing_error, rejected = turn, self._turn_error(reply, invalid, record), 0
            changed = not accepted.same_as(standing)
            standing = accepted
            turns.append(
                _turn_record(
                    turn, standing, changed=changed, evidence_new=evidence_new, evidence=evidence, calls=calls
                )
                | {"steps_read": len(read)}
                | record
            )
        rules = []
        if rejected:  # every turn after the standing answer's was a rejected move
            rules.append(
                f"continual search: change rule rejected the model's new answer at the {rejected} turn(s) "
                f"after turn {source_turn}, whose answer stands (paper's rule)"
            )
        if source_turn == 1 and first.fallback is not None:
            rules.append(f"turn 1: {first.fallback}")
        return _final(first, standing, output, error=standing_error, fallback="; ".join(rules) or None)

    def _turn_error(self, reply: Reply, invalid: str | None, record: Mapping[str, Any]) -> str | None:
        """Why a turn's accepted answer could not be read, or None (module docstring)."""
        if record.get("capped"):
            return f"tool-call cap reached: {invalid}"
        if invalid is not None:
            return invalid
        if self.mode == "search" and self.options.answer_kind == "list":
            return None
        return answer_error(reply.parsed if isinstance(reply.parsed, dict) else None)

    @staticmethod
    def _turn1_reading(
        trajectory: Trajectory,
        first: Attribution,
        messages: tuple[Message, ...],
        reader: TrajectoryReader | None,
        evidence: EvidenceLedger,
    ) -> tuple[set[int], int]:
        """What turn 1 read: its steps (the set later turns keep adding to) and its new evidence tokens.

        A base that read with tools left its executed calls in ``tool_log``: replaying them through the
        continuation's reader rebuilds both exactly. An inlined prompt was read whole: its user messages.
        """
        log = first.output.get("tool_log")
        if reader is not None and isinstance(log, list):
            before = evidence.total
            for entry in log:
                if isinstance(entry, dict) and entry.get("executed"):
                    call = ToolCall(
                        id="turn-1", name=str(entry.get("name")), arguments=str(entry.get("arguments"))
                    )
                    evidence.add(reader.run(call).text_read)
            return reader.steps_read, evidence.total - before
        read = {int(found) for m in messages if m.role == "user" for found in _STEP_IDS.findall(m.content)}
        if reader is not None:
            reader.steps_read.update(read)
            read = reader.steps_read
        new = sum(evidence.add(m.content) for m in messages if m.role == "user")
        return read, new


def _turn_record(
    turn: int, answer: _Answer, *, changed: bool, evidence_new: int, evidence: EvidenceLedger, calls: int
) -> dict[str, Any]:
    return {
        "turn": turn,
        "pred_role": answer.role,
        "pred_step": answer.step,
        "role_valid": answer.role_valid,
        "step_valid": answer.step_valid,
        "changed_from_prev": changed,
        "evidence_tokens": evidence_new,
        "evidence_total": evidence.total,
        "calls": calls,
    }


def _final(
    first: Attribution, standing: _Answer, output: dict[str, Any], *, error: str | None, fallback: str | None
) -> Attribution:
    return Attribution(
        pred_role=standing.role,
        pred_step=standing.step,
        role_valid=standing.role_valid,
        step_valid=standing.step_valid,
        abstained=first.abstained and standing.same_as(_Answer.of(first)),
        output=output,
        error=error,
        fallback=fallback,
    )


@method("continual-search")
def _create_continual_search(label: str, options: Mapping[str, Any]) -> ContinualSearch:
    return ContinualSearch(
        label, ContinualSearchOptions.from_mapping(options, name="continual-search"), "search"
    )


@method("passive-continuation")
def _create_passive_continuation(label: str, options: Mapping[str, Any]) -> ContinualSearch:
    parsed = ContinualSearchOptions.from_mapping(options, name="passive-continuation")
    return ContinualSearch(label, parsed, "passive")
