"""Continual Search and Passive Continuation: one judge, several turns of the same conversation.

Paper 003 ("Root-Cause Attribution Is a Search Problem") shows that a judge pushed turn after turn to search
evidence it has not read beats a one-shot judge and one merely asked to reconsider. Both methods continue the
base method's turn-1 conversation; they differ only in the later turns' prompts. The decision tree, the change
rule's record, the reading modes and the choices where the paper is silent are in
``docs/methods/continual-search.md``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import Field, PositiveInt

from rcarun.data import Trajectory, parse_step
from rcarun.errors import ConfigError
from rcarun.methods._options import MethodOptions, check_base_method, parse_options
from rcarun.methods.all_at_once import AllAtOnce, answer_error, answer_schema
from rcarun.methods.base import Attribution, Method, role_is_valid, step_is_valid
from rcarun.methods.continuation import (
    SENTENCES,
    UNREAD,
    AnswerKind,
    ContinuationPrompt,
    Layout,
    Mode,
    TurnAnswer,
    change_rule_applies,
    continuation_prompt,
    list_schema,
    passive_prompt,
    pieces,
    quote_found,
    quote_schema,
    rule_record,
)
from rcarun.methods.llm import LLM, Message, Reply, ToolCall
from rcarun.methods.proxies import Exchange, TranscriptLLM
from rcarun.methods.reading import EvidenceLedger, TrajectoryReader, converse_with_tools
from rcarun.methods.registry import create_method, method

__all__ = [
    "SENTENCES",
    "ContinualSearch",
    "ContinualSearchOptions",
    "ContinuationPrompt",
    "change_rule_applies",
    "continuation_prompt",
    "passive_prompt",
    "quote_found",
]


class ContinualSearchOptions(MethodOptions):
    """The options table of Continual Search and Passive Continuation (docs/methods/continual-search.md).

    Attributes:
        base: the one-shot method that makes turn 1 (All-at-once by default, or RCTA).
        base_options: the base method's own options table.
        turns: how many turns in all, turn 1 included (1 to 16; the paper's 4).
        turn1_stage: the base method's stage whose last call is the conversation the later turns continue.
        stage: the stage name the continuation turns are recorded under.
        max_tokens: the continuation turns' output budget; None keeps the turn-1 call's.
        layout: how the evidence is stored: ``"whole"``, ``"pieces"`` (blocks of ``piece_steps`` steps), or
            ``"auto"`` (pieces when the judge reads with tools). Continual Search only.
        answer_kind: ``"single"`` (one root cause, with the change rule) or ``"list"`` (every failure, earliest
            first). Continual Search only.
        quote_field: add a ``quote`` field to the answer schema of the turns that carry the change rule (off:
            every turn keeps the benchmark's schema, as 003 App. B.2.2). Continual Search only.
        quote_scope: where the change rule's quote must be found for the record: ``"step"`` or ``"log"``.
            Continual Search only.
        piece_steps: how many consecutive steps make one piece under ``layout="pieces"``. Continual Search only.
        reading: ``"agentic"`` (every turn reads the log through tools) or ``"inline"`` (no tools).
        max_tool_calls: the most tool calls per turn when reading with tools.
    """

    base: str = "all-at-once"
    base_options: dict[str, Any] = Field(default_factory=dict)
    turns: Annotated[int, Field(ge=1, le=16)] = 4
    turn1_stage: Annotated[str, Field(min_length=1)] = "attribution"
    stage: Annotated[str, Field(min_length=1)] = "continuation"
    max_tokens: PositiveInt | None = None
    layout: Literal["auto", "whole", "pieces"] = "whole"
    answer_kind: AnswerKind = "single"
    quote_field: bool = False
    quote_scope: Literal["step", "log"] = "step"
    piece_steps: PositiveInt = 20
    reading: Literal["inline", "agentic"] = "agentic"
    max_tool_calls: PositiveInt = 24

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any], *, name: str = "continual-search") -> Self:
        """Parse and check an options table; ``name`` is the registered method name used in error messages."""
        parsed = parse_options(name, cls, options)
        if name == "passive-continuation":
            searching = sorted(parsed.model_fields_set & _SEARCH_ONLY)
            if searching:
                raise ConfigError(
                    f"{name}: {searching} shape Continual Search's prompts; passive has one sentence"
                )
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
        options = dict(self.base_options)
        if self.base == "all-at-once" and "reading" not in options:
            return {**options, "reading": self.reading, "max_tool_calls": self.max_tool_calls}
        return options


_SEARCH_ONLY = frozenset({"layout", "answer_kind", "quote_field", "quote_scope", "piece_steps"})
_MULTI_TURN = ("continual-search", "passive-continuation", "self-consistency", "judge-panel")


_STEP_IDS = re.compile(r"\[step (\d+)\]")
# Quoted spans in a ``reason``, where the rule's quote is looked for when the schema has no ``quote`` field.
_QUOTED = re.compile(r'"([^"]+)"|“([^”]+)”')


class ContinualSearch(Method):
    """Turn 1 by the base method, then turns of the same conversation (Continual Search or Passive Continuation)."""

    def __init__(self, label: str, options: ContinualSearchOptions, mode: Mode) -> None:
        self.label = label
        self.options = options
        self.mode = mode
        self._base = create_method(options.base, options=options.turn1_options())
        # Turn 1 is the same request under both conditions: paid once (docs/methods/continual-search.md).
        self.shareable_stages = self._base.shareable_stages | {options.turn1_stage}

    def _layout(self) -> Layout:
        if self.options.layout != "auto":
            return self.options.layout
        return "pieces" if self.options.reading == "agentic" else "whole"

    def _answer_kind(self) -> AnswerKind:
        return self.options.answer_kind if self.mode == "search" else "single"

    def _rule_applies(self, turn: int) -> bool:
        return self.mode == "search" and change_rule_applies(turn, self.options.answer_kind)

    def _reader(self, trajectory: Trajectory, messages: list[Message], llm: LLM) -> TrajectoryReader:
        """The continuation's tools, with All-at-once's result cap for this context when it is the base."""
        if isinstance(self._base, AllAtOnce):
            return TrajectoryReader(trajectory, max_result_chars=self._base.result_chars(messages, llm))
        return TrajectoryReader(trajectory)

    def _schema(self, trajectory: Trajectory, turn: int) -> dict[str, Any]:
        if self._answer_kind() == "list":
            return list_schema(trajectory)
        if self._rule_applies(turn) and self.options.quote_field:
            return quote_schema(trajectory)
        return answer_schema(trajectory)

    def _prompt(
        self, turn: int, trajectory: Trajectory, schema: Mapping[str, Any], read: set[int]
    ) -> ContinuationPrompt:
        schema_text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
        if self.mode == "passive":
            return passive_prompt(schema_text=schema_text)
        unread = [
            f"- steps {start}-{end}"
            for start, end in pieces(trajectory.n_steps, self.options.piece_steps)
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
            quote_field=self.options.quote_field,
        )

    def _parse(
        self, reply: Reply, trajectory: Trajectory, *, rule: bool
    ) -> tuple[TurnAnswer, list[str], str | None]:
        """The turn's answer as given, its quotes, and why it is invalid (None when it is a JSON object)."""
        answer = reply.parsed if isinstance(reply.parsed, dict) else None
        if answer is None:
            return UNREAD, [], reply.parse_error or "the answer is not a JSON object"
        if self._answer_kind() == "list":
            failures = answer.get("failures")
            entries = [f for f in failures if isinstance(f, dict)] if isinstance(failures, list) else []
            steps = [(parse_step(f.get("root_step")), f) for f in entries]
            valid = [(step, f) for step, f in steps if step is not None and step_is_valid(step, trajectory)]
            if not valid:
                return UNREAD, [], "no listed failure has a valid root_step"
            first_step, earliest = min(valid, key=lambda pair: pair[0])
            role = earliest.get("responsible_role")
            quote = earliest.get("quote")
            return (
                TurnAnswer(
                    role if isinstance(role, str) else None,
                    first_step,
                    role_is_valid(role, trajectory),
                    True,
                ),
                [quote] if isinstance(quote, str) and quote else [],
                None,
            )
        role = answer.get("responsible_role")
        step = parse_step(answer.get("root_step"))  # a digit string is the step, as All-at-once reads it
        return (
            TurnAnswer(
                role if isinstance(role, str) else None,
                step,
                role_is_valid(role, trajectory),
                step_is_valid(step, trajectory),
            ),
            self._quotes(answer, rule=rule),
            None,
        )

    def _quotes(self, answer: Mapping[str, Any], *, rule: bool) -> list[str]:
        """The quotes a single answer gives: its ``quote`` field, or at a rule turn without that field
        (``quote_field=False``) the quoted spans of its ``reason``."""
        if rule and not self.options.quote_field:
            reason = answer.get("reason")
            return [a or b for a, b in _QUOTED.findall(reason)] if isinstance(reason, str) else []
        quote = answer.get("quote")
        return [quote] if isinstance(quote, str) and quote else []

    async def attribute(self, trajectory: Trajectory, llm: LLM) -> Attribution:
        options = self.options
        transcript = TranscriptLLM(llm)
        first = await self._base.attribute(trajectory, transcript)
        turn1 = TurnAnswer.of(first)
        exchange = transcript.last(options.turn1_stage)
        output: dict[str, Any] = {
            "mode": self.mode,
            "base": options.base,
            "reading": options.reading,
            "layout": self._layout(),
            "answer_kind": self._answer_kind(),
            "turn1": dict(first.output),
        }
        evidence = EvidenceLedger()
        if exchange is None:
            output["turns"] = [
                _turn_record(1, turn1, turn1=turn1, changed=False, evidence_new=0, evidence=evidence, calls=0)
                | {"base_calls": len(transcript.exchanges)}
            ]
            if options.turns > 1:
                output["no_continuation"] = f"the base method made no {options.turn1_stage!r} call"
            return _final(first, turn1, output, error=first.error, fallback=first.fallback)

        conversation: list[Message] = [*exchange.messages, Message("assistant", exchange.reply.text)]
        reader = self._reader(trajectory, conversation, llm) if options.reading == "agentic" else None
        read, turn1_evidence = self._turn1_reading(trajectory, first, exchange.messages, reader, evidence)
        turns: list[dict[str, Any]] = [
            _turn_record(
                1, turn1, turn1=turn1, changed=False, evidence_new=turn1_evidence, evidence=evidence, calls=0
            )
            | {"base_calls": len(transcript.exchanges), "steps_read": len(read)}
        ]
        output["turns"] = turns
        rule_turns: dict[str, list[int]] = {"applies_at": [], "changed_at": [], "broken_at": []}
        # The prediction so far (the last turn's answer as given) and why it could not be read.
        answer, error = turn1, first.error
        for turn in range(2, options.turns + 1):
            schema = self._schema(trajectory, turn)
            prompt = self._prompt(turn, trajectory, schema, read)
            conversation.append(Message("user", prompt.text))
            record: dict[str, Any] = {"prompt_parts": list(prompt.keys)}
            reply, conversation, calls, evidence_new = await self._ask(
                llm, conversation, exchange, schema, reader, evidence, record
            )
            given, invalid = self._judge(turn, reply, trajectory, answer, record, rule_turns)
            changed = not given.same_as(answer)
            answer, error = given, self._turn_error(reply, invalid, record)
            turns.append(
                _turn_record(
                    turn,
                    answer,
                    turn1=turn1,
                    changed=changed,
                    evidence_new=evidence_new,
                    evidence=evidence,
                    calls=calls,
                )
                | {"steps_read": len(read)}
                | record
            )
        if self._rule_applies(options.turns):
            output["change_rule"] = rule_turns
        # Fallback: only turn 1's, and only when turn 1's answer is the prediction.
        fallback = first.fallback if options.turns == 1 else None
        return _final(first, answer, output, error=error, fallback=fallback)

    async def _ask(
        self,
        llm: LLM,
        conversation: list[Message],
        exchange: Exchange,
        schema: dict[str, Any],
        reader: TrajectoryReader | None,
        evidence: EvidenceLedger,
        record: dict[str, Any],
    ) -> tuple[Reply, list[Message], int, int]:
        """One continuation turn's calls, with turn 1's settings: the reply, the conversation after it, the
        calls made and the new evidence tokens; the tool record goes into ``record``."""
        options = self.options
        max_tokens = options.max_tokens or exchange.max_tokens
        if reader is None:
            reply = await llm.chat(
                conversation,
                stage=options.stage,
                max_tokens=max_tokens,
                schema=schema,
                temperature=exchange.temperature,
                reasoning=exchange.reasoning,
            )
            conversation.append(Message("assistant", reply.text))
            record["finish_reason"] = reply.finish_reason
            return reply, conversation, 1, 0
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
        record.update(tool_calls=tool_turn.tool_calls, capped=tool_turn.capped, tool_log=tool_turn.tool_log)
        record["finish_reason"] = tool_turn.reply.finish_reason
        return tool_turn.reply, tool_turn.messages, tool_turn.calls, tool_turn.evidence_tokens

    def _judge(
        self,
        turn: int,
        reply: Reply,
        trajectory: Trajectory,
        previous: TurnAnswer,
        record: dict[str, Any],
        rule_turns: dict[str, list[int]],
    ) -> tuple[TurnAnswer, str | None]:
        """The turn's answer as given and why it is unreadable; the reading and, at a rule turn, the change
        rule's record go into ``record`` and ``rule_turns``."""
        rule_turn = self._rule_applies(turn)
        given, quotes, invalid = self._parse(reply, trajectory, rule=rule_turn)
        if record.get("capped"):
            invalid = (
                f"the model still called tools after its {self.options.max_tool_calls} tool calls were spent"
            )
            given, quotes = UNREAD, []
        if invalid is not None:
            record["invalid_answer"] = invalid
            record["raw_text"] = reply.text[:2000]
        if quotes:
            record["quote"] = quotes[0][:500]
        if rule_turn:
            rule = rule_record(
                previous, given, quotes, invalid, trajectory, quote_scope=self.options.quote_scope
            )
            record["change_rule"] = rule
            rule_turns["applies_at"].append(turn)
            if rule["changed"]:
                rule_turns["changed_at"].append(turn)
            if not rule["followed"]:
                rule_turns["broken_at"].append(turn)
        return given, invalid

    def _turn_error(self, reply: Reply, invalid: str | None, record: Mapping[str, Any]) -> str | None:
        """Why a turn's answer could not be read, or None (docs/methods/continual-search.md)."""
        if record.get("capped"):
            return f"tool-call cap reached: {invalid}"
        if invalid is not None:
            return invalid
        if self._answer_kind() == "list":
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
    turn: int,
    answer: TurnAnswer,
    *,
    turn1: TurnAnswer,
    changed: bool,
    evidence_new: int,
    evidence: EvidenceLedger,
    calls: int,
) -> dict[str, Any]:
    return {
        "turn": turn,
        "pred_role": answer.role,
        "pred_step": answer.step,
        "role_valid": answer.role_valid,
        "step_valid": answer.step_valid,
        "changed_from_prev": changed,
        "changed_from_turn1": not answer.same_as(turn1),
        "evidence_tokens": evidence_new,
        "evidence_total": evidence.total,
        "calls": calls,
    }


def _final(
    first: Attribution, answer: TurnAnswer, output: dict[str, Any], *, error: str | None, fallback: str | None
) -> Attribution:
    return Attribution(
        pred_role=answer.role,
        pred_step=answer.step,
        role_valid=answer.role_valid,
        step_valid=answer.step_valid,
        abstained=first.abstained and answer.same_as(TurnAnswer.of(first)),
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
