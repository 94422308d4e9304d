"""Step-by-step: walk the failed log from step 0 and stop at the first step judged to be the decisive error.

The Who&When baseline (baselines.md §2.2) under the LongRCA protocol: one ``step_check`` call per prefix, the
role is the speaker of the flagged step, no flag is an abstention. Differences from the original, options and
fallbacks: ``docs/methods/step-by-step.md``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, PositiveInt

from rcarun.data import Trajectory
from rcarun.methods._options import JudgeOptions
from rcarun.methods.base import Attribution, CostBound, Method, abstention, speaker_attribution
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
    "StepByStep",
    "StepByStepOptions",
    "StepVerdict",
    "Verdict",
    "estimate_calls_and_prompt_tokens",
    "read_verdict",
]

_NAME = "step-by-step"
_KEPT_CHARS = 500  # reasons and raw texts kept in the output
_TRUNCATION_NOTE = (
    "\nSome long steps were cut in the middle to fit the model's context; their step numbers are kept.\n"
)

StepVerdict = Literal["yes", "no", "malformed"]

ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reason": {"type": "string"},
        "decisive_error": {"type": "boolean"},
    },
    "required": ["reason", "decisive_error"],
    "additionalProperties": False,
}
"""The answer of one ``step_check`` call: reason first, so the model explains before it commits."""


class StepByStepOptions(JudgeOptions):
    """Step-by-step's options table (a sweep's ``options`` for the method).

    Attributes:
        max_tokens: the output budget of each ``step_check`` call (the original's 1,024).
        temperature: the sampling temperature of each call; None leaves it to the backbone.
        reasoning: the reasoning effort asked of the backbone; None leaves it to the backbone.
        include_task: show the task instruction in every call.
        include_ground_truth: add a ``Correct final answer: ...`` line after the task (off: the protocol).
        truncation: the shared context policy, ``"cap-steps"`` or ``"none"`` (`rcarun.methods.context`).
        max_steps: stop the walk after this many steps (an abstention); None walks the whole log (the paper).
        stage: the stage name the calls are recorded under.
    """

    method_name = _NAME

    truncation: TruncationPolicy = "cap-steps"
    max_steps: PositiveInt | None = None
    stage: Annotated[str, Field(min_length=1)] = "step_check"


@dataclass(frozen=True, slots=True)
class Verdict:
    """One ``step_check`` answer as read.

    Attributes:
        verdict: ``"yes"`` / ``"no"`` from the boolean, ``"malformed"`` when there is none (counted as "no").
        reason: the answer's reason, None when absent or not a string.
        error: why the answer is malformed, None when it is not.
    """

    verdict: StepVerdict
    reason: str | None
    error: str | None = None


def read_verdict(reply: Reply) -> Verdict:
    """Read one answer strictly: only a JSON object with a boolean ``decisive_error`` gives a yes or a no."""
    answer = reply.parsed
    if not isinstance(answer, dict):
        return Verdict("malformed", None, reply.parse_error or "the answer is not a JSON object")
    reason = answer.get("reason")
    reason = reason if isinstance(reason, str) else None
    flag = answer.get("decisive_error")
    if not isinstance(flag, bool):
        return Verdict("malformed", reason, "decisive_error is missing or not a boolean")
    return Verdict("yes" if flag else "no", reason)


class StepByStep(Method):
    """One ``step_check`` call per step, from step 0, until a step is judged to introduce the decisive error."""

    def __init__(self, label: str, options: StepByStepOptions) -> None:
        self.label = label
        self.options = options
        self._system = load_prompt("step_by_step_system.txt").template.strip()
        self._user = load_prompt("step_by_step_user.txt")
        self._schema_text = json.dumps(ANSWER_SCHEMA, ensure_ascii=False)

    def worst_case(self, trajectory: Trajectory, counter: TokenCounter) -> CostBound:
        """The most calls and prompt tokens this method can spend on ``trajectory`` (no step flagged), for
        `rcarun estimate`: its answers decide when it stops, so dry runs alone would understate the bound."""
        return estimate_calls_and_prompt_tokens(trajectory, counter, self.options)

    def steps_to_check(self, trajectory: Trajectory) -> int:
        """How many steps the walk covers at most: the whole log, or ``max_steps`` when that is smaller."""
        if self.options.max_steps is None:
            return trajectory.n_steps
        return min(trajectory.n_steps, self.options.max_steps)

    def build_prompt(self, trajectory: Trajectory, step: int, llm: TokenCounter) -> FittedPrompt:
        """The user prompt that asks about ``step``, showing steps ``0..step``, fitted to ``llm``'s context."""
        shown = trajectory.steps[: step + 1]
        task = task_text(trajectory, include=self.options.include_task)

        def render(cap: int | None) -> str:
            return self._user.substitute(
                task=task,
                ground_truth=ground_truth_line(trajectory, self.options.include_ground_truth),
                agents=", ".join(trajectory.agents),
                step=step,
                agent=trajectory.steps[step].agent,
                log=render_steps(shown, step_numbers=True, step_char_cap=cap),
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

    @property
    def system_prompt(self) -> str:
        return self._system

    def messages(self, user: str) -> list[Message]:
        return [Message("system", self._system), Message("user", user)]

    async def attribute(self, trajectory: Trajectory, llm: LLM) -> Attribution:
        checks: list[dict[str, Any]] = []
        truncations: list[Truncation] = []
        flagged: int | None = None
        for step in range(self.steps_to_check(trajectory)):
            prompt = self.build_prompt(trajectory, step, llm)
            truncations.append(prompt.truncation)
            reply = await llm.chat(
                self.messages(prompt.text),
                stage=self.options.stage,
                max_tokens=self.options.max_tokens,
                schema=ANSWER_SCHEMA,
                temperature=self.options.temperature,
                reasoning=self.options.reasoning,
            )
            read = read_verdict(reply)
            check: dict[str, Any] = {
                "step": step,
                "verdict": read.verdict,
                "reason": None if read.reason is None else read.reason[:_KEPT_CHARS],
                "finish_reason": reply.finish_reason,
            }
            if prompt.truncation.applied:
                check["step_char_cap"] = prompt.truncation.step_char_cap
            if read.error is not None:
                check["error"] = read.error
                check["raw_text"] = reply.text[:_KEPT_CHARS]
            checks.append(check)
            if read.verdict == "yes":
                flagged = step
                break

        if flagged is not None:
            stopped = "decisive_error"
        elif len(checks) < trajectory.n_steps:
            stopped = "max_steps"
        else:
            stopped = "end_of_log"
        malformed = [c for c in checks if c["verdict"] == "malformed"]
        output: dict[str, Any] = {
            "stopped": stopped,
            "steps_checked": len(checks),
            "malformed_steps": [c["step"] for c in malformed],
            "checks": checks,
            "truncation": truncation_summary(self.options.truncation, truncations),
        }
        error = fallback = None
        if malformed:
            fallback = (
                f"step-by-step: unreadable verdict at {len(malformed)} of {len(checks)} checked steps, "
                "counted as 'no' (published rule)"
            )
        if checks and len(malformed) == len(checks):
            first = malformed[0]["error"]
            error = f"no step_check answer could be read ({len(checks)} of {len(checks)}); first: {first}"
        if flagged is None:
            return abstention(output, error=error, fallback=fallback)
        return speaker_attribution(trajectory, flagged, output, error=error, fallback=fallback)


class _CharsPerToken:
    """A `TokenCounter` from a fixed chars-per-token ratio, with no context window (so nothing is cut)."""

    context_window: int | None = None

    def __init__(self, chars_per_token: float) -> None:
        if chars_per_token <= 0:
            raise ValueError("chars_per_token must be positive")
        self._chars_per_token = chars_per_token

    def estimate_tokens(self, text: str) -> int:
        return math.ceil(len(text) / self._chars_per_token)


def estimate_calls_and_prompt_tokens(
    trajectory: Trajectory,
    llm: TokenCounter | float,
    options: StepByStepOptions | None = None,
) -> CostBound:
    """Worst-case calls and prompt tokens of Step-by-step on ``trajectory``: no step is flagged.

    Every prompt (system + user, as sent, after the context policy) is estimated with ``llm``'s estimator; a
    number is a chars-per-token ratio (tokens = ceil(chars / ratio), no context window, so no truncation). With
    no truncation the total grows quadratically in the number of steps, since prompt ``i`` holds steps ``0..i``.
    """
    counter: TokenCounter = _CharsPerToken(float(llm)) if isinstance(llm, int | float) else llm
    walker = StepByStep("estimate", options or StepByStepOptions())
    calls = walker.steps_to_check(trajectory)
    system_tokens = counter.estimate_tokens(walker.system_prompt)
    tokens = 0
    for step in range(calls):
        tokens += system_tokens + counter.estimate_tokens(walker.build_prompt(trajectory, step, counter).text)
    return CostBound(calls=calls, prompt_tokens=tokens)


@method(_NAME)
def _create_step_by_step(label: str, options: Mapping[str, Any]) -> StepByStep:
    return StepByStep(label, StepByStepOptions.from_mapping(options))
