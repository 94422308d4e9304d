"""All-at-once: the whole failed log in one prompt, one call per trajectory (Who&When, Zhang et al. 2025).

The baseline as the LongRCA paper runs it (Sec. 5, App. L.1): role and step as separate, schema-bounded fields,
never repaired. The options (step numbers, budgets, truncation, agentic reading) and how an unreadable answer is
recorded are in ``docs/methods/all-at-once.md``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, PositiveInt, model_validator

from rcarun.data import Trajectory, parse_step
from rcarun.methods._options import MethodOptions, ReasoningOption
from rcarun.methods.base import Attribution, Method, role_is_valid, step_is_valid
from rcarun.methods.context import (
    TokenCounter,
    TruncationPolicy,
    fit_prompt,
    ground_truth_line,
    render_steps,
    task_text,
)
from rcarun.methods.llm import LLM, Message, Reply
from rcarun.methods.prompt_files import load_prompt
from rcarun.methods.reading import EvidenceLedger, TrajectoryReader, converse_with_tools
from rcarun.methods.registry import method

__all__ = ["AllAtOnce", "AllAtOnceOptions", "answer_error", "answer_schema", "render_log"]


class AllAtOnceOptions(MethodOptions):
    method_name = "all-at-once"

    max_tokens: PositiveInt = 8000
    temperature: float | None = 0.0
    reasoning: ReasoningOption = None
    step_numbers: bool = True
    include_task: bool = True
    include_ground_truth: bool = False
    truncation: TruncationPolicy = "cap-steps"
    stage: Annotated[str, Field(min_length=1)] = "attribution"
    reading: Literal["inline", "agentic"] = "inline"
    max_tool_calls: PositiveInt = 24

    @model_validator(mode="after")
    def _tools_show_step_numbers(self) -> AllAtOnceOptions:
        if self.reading == "agentic" and not self.step_numbers:
            raise ValueError("reading='agentic' needs step_numbers=true (the tools show step numbers)")
        return self


def answer_schema(trajectory: Trajectory) -> dict[str, Any]:
    """The JSON schema of the answer: reason first (so the model explains before it commits), then the two fields."""
    return {
        "type": "object",
        "properties": {
            "reason": {"type": "string"},
            "responsible_role": {"type": "string", "enum": list(trajectory.agents)},
            "root_step": {"type": "integer", "minimum": 0, "maximum": trajectory.n_steps - 1},
        },
        "required": ["reason", "responsible_role", "root_step"],
        "additionalProperties": False,
    }


def render_log(trajectory: Trajectory, *, step_numbers: bool, step_char_cap: int | None = None) -> str:
    """The whole log as ``[step k] agent: content`` lines (``agent: content`` without step numbers)."""
    return render_steps(trajectory.steps, step_numbers=step_numbers, step_char_cap=step_char_cap)


# `json.dumps(schema, ensure_ascii=False)` (the prompt's text, so its cache key, stays the same) without
# building an encoder for every prompt.
_SCHEMA_JSON = json.JSONEncoder(ensure_ascii=False)

_MAX_RESULT_CHARS = 12_000
_MIN_RESULT_CHARS = 500
# Conservative characters per token for sizing tool results to the context left (most tokenizers give more).
_RESULT_CHARS_PER_TOKEN = 3


class AllAtOnce(Method):
    """One attribution call over the whole (possibly truncated) log."""

    def __init__(self, label: str, options: AllAtOnceOptions) -> None:
        self.label = label
        self.options = options
        self._system = load_prompt("all_at_once_system.txt").template.strip()
        self._user = load_prompt("all_at_once_user.txt")
        self._agentic_user = load_prompt("all_at_once_agentic_user.txt")

    def build_messages(
        self, trajectory: Trajectory, llm: TokenCounter, schema: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """The prompt for ``trajectory``, and what truncation (if any) was applied to fit ``llm``'s context."""
        schema = schema if schema is not None else answer_schema(trajectory)
        schema_text = _SCHEMA_JSON.encode(schema)
        agents = ", ".join(trajectory.agents)
        step_format = (
            'Each step is shown as "[step k] agent: content".'
            if self.options.step_numbers
            else 'Each step is shown as "agent: content", one step after another; count them from 0.'
        )

        def user_prompt(cap: int | None, note: str) -> str:
            return self._user.substitute(
                task=task_text(trajectory, include=self.options.include_task),
                ground_truth=ground_truth_line(trajectory, self.options.include_ground_truth),
                agents=agents,
                n_steps=trajectory.n_steps,
                step_format=step_format,
                log=render_log(trajectory, step_numbers=self.options.step_numbers, step_char_cap=cap),
                truncation_note=note,
                schema=schema_text,
            )

        note = "\nSome long steps were cut in the middle to fit the model's context; their step numbers are kept.\n"
        fitted = fit_prompt(
            lambda cap: user_prompt(cap, "" if cap is None else note),
            [len(step.content) for step in trajectory.steps],
            llm=llm,
            max_tokens=self.options.max_tokens,
            system=self._system,
            policy=self.options.truncation,
        )
        return self._messages(fitted.text), fitted.truncation.as_output()

    def build_agentic_messages(
        self, trajectory: Trajectory, schema: dict[str, Any] | None = None
    ) -> list[Message]:
        """The prompt of the agentic reading mode: everything but the log, which the judge reads with tools."""
        schema = schema if schema is not None else answer_schema(trajectory)
        user = self._agentic_user.substitute(
            task=task_text(trajectory, include=self.options.include_task),
            ground_truth=ground_truth_line(trajectory, self.options.include_ground_truth),
            agents=", ".join(trajectory.agents),
            n_steps=trajectory.n_steps,
            last_step=trajectory.n_steps - 1,
            max_tool_calls=self.options.max_tool_calls,
            schema=json.dumps(schema, ensure_ascii=False),
        )
        return self._messages(user)

    def result_chars(self, messages: list[Message], llm: TokenCounter) -> int:
        """The per-result character cap of the agentic mode for ``llm``'s context (docs/methods/all-at-once.md)."""
        window = llm.context_window
        if window is None:
            return _MAX_RESULT_CHARS
        prompt_tokens = sum(llm.estimate_tokens(m.content) for m in messages)
        room_tokens = window - self.options.max_tokens - prompt_tokens
        share = room_tokens * _RESULT_CHARS_PER_TOKEN // self.options.max_tool_calls
        return max(_MIN_RESULT_CHARS, min(_MAX_RESULT_CHARS, share))

    def _messages(self, user: str) -> list[Message]:
        return [Message("system", self._system), Message("user", user)]

    async def attribute(self, trajectory: Trajectory, llm: LLM) -> Attribution:
        if self.options.reading == "agentic":
            return await self._attribute_agentic(trajectory, llm)
        schema = answer_schema(trajectory)
        messages, truncation = self.build_messages(trajectory, llm, schema)
        reply = await llm.chat(
            messages,
            stage=self.options.stage,
            max_tokens=self.options.max_tokens,
            schema=schema,
            temperature=self.options.temperature,
            reasoning=self.options.reasoning,
        )
        answer = reply.parsed if isinstance(reply.parsed, dict) else None
        output: dict[str, Any] = {
            "answer": answer,
            "finish_reason": reply.finish_reason,
            "truncation": truncation,
        }
        invalid = None
        if answer is None:
            invalid = output["invalid_answer"] = reply.parse_error or "the answer is not a JSON object"
            output["raw_text"] = reply.text[:2000]
        return _attribution(trajectory, answer, output, invalid)

    async def _attribute_agentic(self, trajectory: Trajectory, llm: LLM) -> Attribution:
        schema = answer_schema(trajectory)
        messages = self.build_agentic_messages(trajectory, schema)
        result_chars = self.result_chars(messages, llm)
        reader = TrajectoryReader(trajectory, max_result_chars=result_chars)
        turn = await converse_with_tools(
            llm,
            messages,
            reader=reader,
            ledger=EvidenceLedger(),
            stage=self.options.stage,
            max_tokens=self.options.max_tokens,
            schema=schema,
            temperature=self.options.temperature,
            reasoning=self.options.reasoning,
            max_tool_calls=self.options.max_tool_calls,
        )
        reply: Reply = turn.reply
        answer = reply.parsed if isinstance(reply.parsed, dict) and not turn.capped else None
        output: dict[str, Any] = {
            "answer": answer,
            "finish_reason": reply.finish_reason,
            "reading": "agentic",
            "calls": turn.calls,
            "tool_calls": turn.tool_calls,
            "capped": turn.capped,
            "evidence_tokens": turn.evidence_tokens,
            "steps_read": sorted(reader.steps_read),
            "max_result_chars": result_chars,
            "tool_log": turn.tool_log,
        }
        invalid = None
        if answer is None:
            output["invalid_answer"] = (
                f"the model still called tools after its {self.options.max_tool_calls} tool calls were spent"
                if turn.capped
                else reply.parse_error or "the answer is not a JSON object"
            )
            output["raw_text"] = reply.text[:2000]
            invalid = (
                f"tool-call cap reached: {output['invalid_answer']}"
                if turn.capped
                else output["invalid_answer"]
            )
        return _attribution(trajectory, answer, output, invalid)


def _attribution(
    trajectory: Trajectory, answer: dict[str, Any] | None, output: dict[str, Any], invalid: str | None = None
) -> Attribution:
    role = answer.get("responsible_role") if answer else None
    step = parse_step(answer.get("root_step")) if answer else None
    return Attribution(
        pred_role=role if isinstance(role, str) else None,
        pred_step=step,
        role_valid=role_is_valid(role, trajectory),
        step_valid=step_is_valid(step, trajectory),
        abstained=False,
        output=output,
        error=answer_error(answer, invalid),
    )


def answer_error(answer: Mapping[str, Any] | None, invalid: object = None) -> str | None:
    """Why an answer of `answer_schema` could not be used, or None when both fields were read.

    ``invalid`` is the reason already known (parse error, tool-call cap); otherwise a missing or mistyped
    ``responsible_role`` / ``root_step`` is a schema violation. A ``root_step`` given as a digit string
    (``"12"``) is read as the integer (`rcarun.data.parse_step`, the scorer's rule), not a violation. Values that
    were read but are out of range or not a recorded agent are validity, not errors.
    """
    if answer is None:
        return str(invalid) if invalid else "the answer is not a JSON object"
    problems = []
    if not isinstance(answer.get("responsible_role"), str):
        problems.append(_field_problem(answer, "responsible_role", "a string"))
    if parse_step(answer.get("root_step")) is None:
        problems.append(_field_problem(answer, "root_step", "an integer"))
    return "; ".join(problems) or None


def _field_problem(answer: Mapping[str, Any], name: str, kind: str) -> str:
    if name not in answer:
        return f"{name} is missing"
    return f"{name} is not {kind}: {json.dumps(answer[name], ensure_ascii=False, default=str)[:80]}"


@method("all-at-once")
def _create_all_at_once(label: str, options: Mapping[str, Any]) -> AllAtOnce:
    return AllAtOnce(label, AllAtOnceOptions.from_mapping(options))
