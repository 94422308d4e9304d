"""The context policy every log-reading method shares: how a prompt is made to fit the backbone's window.

One policy (``"cap-steps"``: cut every long step content in the middle at the largest common cap that fits;
``"none"``: leave overflow to the provider) so that results differ by method, not by how each shortened its
input; also the shared renderings of steps, task and ground truth. The rules: ``docs/methods/common.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from rcarun.data import Step, Trajectory

__all__ = [
    "CONTEXT_MARGIN_TOKENS",
    "TASK_CHAR_CAP",
    "TRUNCATION_POLICIES",
    "FittedPrompt",
    "TokenCounter",
    "Truncation",
    "TruncationPolicy",
    "cut_middle",
    "fit_prompt",
    "ground_truth_line",
    "prompt_token_budget",
    "render_steps",
    "task_text",
    "truncation_summary",
]

TruncationPolicy = Literal["cap-steps", "none"]
TRUNCATION_POLICIES: tuple[str, ...] = ("cap-steps", "none")

# Tokens kept free besides the output budget: chat-template overhead and estimate error.
CONTEXT_MARGIN_TOKENS = 512

_ELISION = " [... {n} characters elided ...] "


class TokenCounter(Protocol):
    """The part of the `LLM` protocol the policy reads (an `LLM` is one; so is a plain chars-per-token estimator)."""

    @property
    def context_window(self) -> int | None: ...

    def estimate_tokens(self, text: str) -> int: ...


@dataclass(frozen=True, slots=True)
class Truncation:
    """What the policy did to one prompt.

    Attributes:
        policy: the configured policy, ``"cap-steps"`` or ``"none"``.
        applied: step contents were cut.
        step_char_cap: the common per-step character cap, when applied.
        steps_cut: how many shown steps were longer than the cap, when applied.
        context_window: the window the prompt was fitted to, when applied.
        fits: the cut prompt fits the budget (False only when even a cap of 0 is too long).
    """

    policy: str
    applied: bool = False
    step_char_cap: int | None = None
    steps_cut: int = 0
    context_window: int | None = None
    fits: bool = True

    def as_output(self) -> dict[str, Any]:
        """The JSON kept in a method's output: only ``applied`` and ``policy`` when nothing was cut."""
        if not self.applied:
            return {"applied": False, "policy": self.policy}
        return {
            "applied": True,
            "policy": self.policy,
            "step_char_cap": self.step_char_cap,
            "steps_cut": self.steps_cut,
            "context_window": self.context_window,
            "fits": self.fits,
        }


@dataclass(frozen=True, slots=True)
class FittedPrompt:
    """A user prompt after the policy, and what was done to it."""

    text: str
    truncation: Truncation


def prompt_token_budget(llm: TokenCounter, *, max_tokens: int, system: str) -> int | None:
    """Tokens the user prompt may take beside ``system`` and the output budget; None when the window is unknown."""
    window = llm.context_window
    if window is None:
        return None
    return window - max_tokens - CONTEXT_MARGIN_TOKENS - llm.estimate_tokens(system)


def fit_prompt(
    render: Callable[[int | None], str],
    step_lengths: Sequence[int],
    *,
    llm: TokenCounter,
    max_tokens: int,
    system: str,
    policy: str,
) -> FittedPrompt:
    """Apply the context policy (docs/methods/common.md) to one prompt.

    Args:
        render: ``render(None)`` gives the full user prompt; ``render(cap)`` the prompt with every shown step
            content cut to at most ``cap`` characters (plus the elision marker) and a truncation note.
        step_lengths: the content length in characters of every step the prompt shows.
        llm: the token estimator and context window to fit.
        max_tokens: the output budget of the call.
        system: the system prompt sent with it.
        policy: ``"cap-steps"`` or ``"none"``.

    Returns:
        The user prompt to send and the truncation applied.
    """
    full = render(None)
    not_cut = Truncation(policy=policy)
    allowed = prompt_token_budget(llm, max_tokens=max_tokens, system=system)
    if allowed is None or policy == "none" or llm.estimate_tokens(full) <= allowed:
        return FittedPrompt(full, not_cut)

    # Bisection for the largest cap that fits; rendering is monotone in the cap, and `longest` is the full length.
    low, high = 0, max(step_lengths, default=0)
    while low < high:
        mid = (low + high + 1) // 2
        if llm.estimate_tokens(render(mid)) <= allowed:
            low = mid
        else:
            high = mid - 1
    cap = low
    text = render(cap)
    return FittedPrompt(
        text,
        Truncation(
            policy=policy,
            applied=True,
            step_char_cap=cap,
            steps_cut=sum(1 for length in step_lengths if length > cap),
            context_window=llm.context_window,
            fits=llm.estimate_tokens(text) <= allowed,
        ),
    )


def truncation_summary(policy: str, truncations: Sequence[Truncation]) -> dict[str, Any]:
    """One compact record for a method that fits many prompts (one per step, or per segment).

    Returns:
        ``policy``, ``prompts`` (how many were fitted), ``prompts_cut`` (how many had steps cut), and when any
        was cut: ``min_step_char_cap`` (the tightest cap), ``context_window`` and ``all_fit``.
    """
    cut = [t for t in truncations if t.applied]
    summary: dict[str, Any] = {"policy": policy, "prompts": len(truncations), "prompts_cut": len(cut)}
    if cut:
        summary["min_step_char_cap"] = min(t.step_char_cap for t in cut if t.step_char_cap is not None)
        summary["context_window"] = cut[0].context_window
        summary["all_fit"] = all(t.fits for t in cut)
    return summary


TASK_CHAR_CAP = 12_000
"""The most characters of the task instruction a prompt shows; a longer task is cut in the middle, and says so.

LongRCA's tasks are short (a question, a travel request, a code issue); the cap only keeps a pathological record
(a task step that holds a whole document) from crowding out the log.
"""


def task_text(trajectory: Trajectory, include: bool = True, cap: int = TASK_CHAR_CAP) -> str:
    """The task instruction every call of every method shows, whole up to ``cap`` characters.

    ``trajectory.task`` is the record's ``question`` when it has one, else the instruction the loader derived
    from the opening steps of its history (`rcarun.data.derive_task`). ``include=False`` (a method's
    ``include_task`` option) or a record with neither gives ``"(not recorded)"``.
    """
    if not include or not trajectory.task:
        return "(not recorded)"
    task = trajectory.task
    return task if len(task) <= cap else cut_middle(task, cap)


def ground_truth_line(trajectory: Trajectory, include: bool) -> str:
    """The prompt line stating the task's correct final answer: empty unless ``include`` and one is recorded.

    An empty string leaves the prompt byte-identical to the protocol's default prompt (and its cache key).
    """
    if not include or not trajectory.ground_truth:
        return ""
    return f"Correct final answer: {trajectory.ground_truth}\n"


def render_steps(steps: Sequence[Step], *, step_numbers: bool, step_char_cap: int | None = None) -> str:
    """Steps as ``[step k] agent: content`` lines (``agent: content`` without step numbers), contents capped."""
    lines = []
    for step in steps:
        content = step.content
        if step_char_cap is not None and len(content) > step_char_cap:
            content = cut_middle(content, step_char_cap)
        prefix = f"[step {step.index}] " if step_numbers else ""
        lines.append(f"{prefix}{step.agent}: {content}")
    return "\n".join(lines)


def cut_middle(text: str, cap: int) -> str:
    """``text`` with its middle replaced by an elision marker so that ``cap`` of its characters remain."""
    head = cap // 2
    tail = cap - head
    elided = len(text) - cap
    return text[:head] + _ELISION.format(n=elided) + (text[-tail:] if tail else "")
