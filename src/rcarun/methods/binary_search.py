"""Binary search: halve the failed log, asking each time which half holds the decisive error, down to one step.

The Who&When baseline (baselines.md §2.3) under the LongRCA protocol: ``⌈log2 n⌉`` ``bisect`` calls at most, the
role is the speaker of the selected step. Differences from the original, the ``unclear`` rule and fallbacks:
``docs/methods/binary-search.md``.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field

from rcarun.data import Trajectory
from rcarun.methods._options import JudgeOptions
from rcarun.methods.base import Attribution, Method, abstention, speaker_attribution
from rcarun.methods.context import (
    FittedPrompt,
    TokenCounter,
    Truncation,
    TruncationPolicy,
    fit_prompt,
    ground_truth_line,
    render_steps,
    task_text,
    truncation_summary,
)
from rcarun.methods.llm import LLM, Message, Reply
from rcarun.methods.prompt_files import load_prompt
from rcarun.methods.registry import method

__all__ = [
    "ANSWER_SCHEMA",
    "BinarySearch",
    "BinarySearchOptions",
    "Half",
    "HalfChoice",
    "decision_seed",
    "read_half",
    "split",
]

_NAME = "binary-search"
_KEPT_CHARS = 500
_HALVES = ("earlier", "later")
_TRUNCATION_NOTE = (
    "\nSome long steps were cut in the middle to fit the model's context; every step is still shown.\n"
)

Half = Literal["earlier", "later"]

ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reason": {"type": "string"},
        "half": {"type": "string", "enum": list(_HALVES)},
    },
    "required": ["reason", "half"],
    "additionalProperties": False,
}
"""The answer of one ``bisect`` call: reason first, so the model explains before it commits."""


class BinarySearchOptions(JudgeOptions):
    """Binary search's options table (a sweep's ``options`` for the method).

    Attributes:
        max_tokens: the output budget of each ``bisect`` call (the original's 1,024).
        temperature: the sampling temperature of each call; None leaves it to the backbone.
        reasoning: the reasoning effort asked of the backbone; None leaves it to the backbone.
        include_task: show the task instruction in every call.
        include_ground_truth: add a ``Correct final answer: ...`` line after the task (off: the protocol).
        step_numbers: render the segment as ``[step k] agent: content``; false gives ``agent: content`` lines.
        truncation: the shared context policy, ``"cap-steps"`` or ``"none"`` (`rcarun.methods.context`).
        unclear: how an unclear answer picks a half: ``"random"`` (a seeded draw) or ``"earlier"``.
        seed: the seed of the unclear-answer draws, mixed with the qid and the range.
        stage: the stage name the calls are recorded under.
    """

    method_name = _NAME

    step_numbers: bool = True
    truncation: TruncationPolicy = "cap-steps"
    unclear: Literal["random", "earlier"] = "random"
    seed: int = 0
    stage: Annotated[str, Field(min_length=1)] = "bisect"


@dataclass(frozen=True, slots=True)
class HalfChoice:
    """One ``bisect`` answer as read.

    Attributes:
        half: the half the answer names, None when it is unclear.
        reason: the answer's reason, None when absent or not a string.
        error: why the answer is unclear, None when it is not.
    """

    half: Half | None
    reason: str | None
    error: str | None = None


def split(start: int, end: int) -> int:
    """The last step of the earlier half of ``[start, end]``; the later half starts one step after it."""
    return start + (end - start) // 2


def decision_seed(seed: int, qid: str, start: int, end: int) -> int:
    """The seed of the unclear-answer draw for one range: stable across runs, processes and item order."""
    digest = hashlib.sha256(f"{seed}|{qid}|{start}|{end}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def read_half(reply: Reply) -> HalfChoice:
    """Read one answer strictly: only ``half`` exactly ``"earlier"`` or ``"later"`` in a JSON object is clear."""
    answer = reply.parsed
    if not isinstance(answer, dict):
        return HalfChoice(None, None, reply.parse_error or "the answer is not a JSON object")
    reason = answer.get("reason")
    reason = reason if isinstance(reason, str) else None
    half = answer.get("half")
    if half == "earlier":
        return HalfChoice("earlier", reason)
    if half == "later":
        return HalfChoice("later", reason)
    return HalfChoice(None, reason, "half is missing or not 'earlier' or 'later'")


class BinarySearch(Method):
    """Recursive halving of the log with one ``bisect`` call per level, down to a single step."""

    def __init__(self, label: str, options: BinarySearchOptions) -> None:
        self.label = label
        self.options = options
        self._system = load_prompt("binary_search_system.txt").template.strip()
        self._user = load_prompt("binary_search_user.txt")
        self._schema_text = json.dumps(ANSWER_SCHEMA, ensure_ascii=False)

    @property
    def system_prompt(self) -> str:
        return self._system

    def build_prompt(self, trajectory: Trajectory, start: int, end: int, llm: TokenCounter) -> FittedPrompt:
        """The user prompt for the segment ``[start, end]`` (inclusive), fitted to ``llm``'s context."""
        shown = trajectory.steps[start : end + 1]
        mid = split(start, end)
        task = task_text(trajectory, include=self.options.include_task)
        step_format = (
            'Each step is shown as "[step k] agent: content".'
            if self.options.step_numbers
            else f'Each step is shown as "agent: content", one step after another; the first one is step {start}.'
        )

        def render(cap: int | None) -> str:
            return self._user.substitute(
                task=task,
                ground_truth=ground_truth_line(trajectory, self.options.include_ground_truth),
                agents=", ".join(trajectory.agents),
                n_steps=trajectory.n_steps,
                start=start,
                end=end,
                mid=mid,
                mid_next=mid + 1,
                step_format=step_format,
                log=render_steps(shown, step_numbers=self.options.step_numbers, step_char_cap=cap),
                truncation_note="" if cap is None else _TRUNCATION_NOTE,
                schema=self._schema_text,
            )

        return fit_prompt(
            render,
            [len(s.content) for s in shown],
            llm=llm,
            max_tokens=self.options.max_tokens,
            system=self._system,
            policy=self.options.truncation,
        )

    def messages(self, user: str) -> list[Message]:
        return [Message("system", self._system), Message("user", user)]

    def _unclear_half(self, trajectory: Trajectory, start: int, end: int) -> Half:
        if self.options.unclear == "earlier":
            return "earlier"
        rng = random.Random(decision_seed(self.options.seed, trajectory.qid, start, end))
        return "earlier" if rng.random() < 0.5 else "later"

    async def attribute(self, trajectory: Trajectory, llm: LLM) -> Attribution:
        decisions: list[dict[str, Any]] = []
        truncations: list[Truncation] = []
        start, end = 0, trajectory.n_steps - 1
        while start < end:
            prompt = self.build_prompt(trajectory, start, end, llm)
            truncations.append(prompt.truncation)
            reply = await llm.chat(
                self.messages(prompt.text),
                stage=self.options.stage,
                max_tokens=self.options.max_tokens,
                schema=ANSWER_SCHEMA,
                temperature=self.options.temperature,
                reasoning=self.options.reasoning,
            )
            choice = read_half(reply)
            half = choice.half if choice.half is not None else self._unclear_half(trajectory, start, end)
            mid = split(start, end)
            decision: dict[str, Any] = {
                "start": start,
                "end": end,
                "mid": mid,
                "half": half,
                "unclear": choice.half is None,
                "reason": None if choice.reason is None else choice.reason[:_KEPT_CHARS],
                "finish_reason": reply.finish_reason,
            }
            if prompt.truncation.applied:
                decision["step_char_cap"] = prompt.truncation.step_char_cap
            if choice.error is not None:
                decision["error"] = choice.error
                decision["raw_text"] = reply.text[:_KEPT_CHARS]
            decisions.append(decision)
            start, end = (start, mid) if half == "earlier" else (mid + 1, end)

        output: dict[str, Any] = {
            "calls": len(decisions),
            "unclear_decisions": sum(1 for d in decisions if d["unclear"]),
            "unclear_rule": self.options.unclear,
            "decisions": decisions,
            "truncation": truncation_summary(self.options.truncation, truncations),
        }
        if trajectory.n_steps == 0:  # the loaders reject empty histories; an in-memory one gets no answer
            return abstention(output)
        unclear = [d for d in decisions if d["unclear"]]
        error = fallback = None
        if unclear:
            how = "half chosen at random" if self.options.unclear == "random" else "earlier half taken"
            fallback = (
                f"binary search: unclear verdict at {len(unclear)} of {len(decisions)} halvings, {how} "
                "(published rule)"
            )
        if decisions and len(unclear) == len(decisions):
            n = len(decisions)
            error = f"no bisect answer was clear ({n} of {n}); first: {unclear[0]['error']}"
        return speaker_attribution(trajectory, start, output, error=error, fallback=fallback)


@method(_NAME)
def _create_binary_search(label: str, options: Mapping[str, Any]) -> BinarySearch:
    return BinarySearch(label, BinarySearchOptions.from_mapping(options))
