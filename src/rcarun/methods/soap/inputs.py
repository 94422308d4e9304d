"""SOAP's inputs (paper 004, App. A.2): a trajectory's text segments and the forward passes that score them.

One causal pass over ``[task, s_a … s_b]`` gives every target in ``a … b`` what its own prompt would, so the
passes are planned on that equivalence (`plan_passes`); oversized segments are cut or refused
(`prepare_segments`). The rules: ``docs/methods/soap.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal

from rcarun.data import Step, Trajectory
from rcarun.errors import DataError
from rcarun.methods.context import cut_middle, task_text

__all__ = [
    "OVERSIZE_POLICIES",
    "SHARING_MODES",
    "InputPlan",
    "Oversize",
    "PlannedPass",
    "Segments",
    "Sharing",
    "plan_passes",
    "prepare_segments",
    "step_segment",
    "task_segment",
    "window_starts",
]

Sharing = Literal["grouped", "prefix", "none"]
SHARING_MODES: tuple[str, ...] = ("grouped", "prefix", "none")
Oversize = Literal["cut", "error"]
OVERSIZE_POLICIES: tuple[str, ...] = ("cut", "error")


def task_segment(trajectory: Trajectory, char_cap: int | None = None) -> str:
    """The first segment of every pass: the task description (``(not recorded)`` when there is none)."""
    task = task_text(trajectory)
    if char_cap is not None and len(task) > char_cap:
        task = cut_middle(task, char_cap)
    return f"Task: {task}\n\nSteps:\n"


def step_segment(step: Step, char_cap: int | None = None) -> str:
    """One step as ``[step k] agent: content`` and a newline, its content cut to ``char_cap`` characters."""
    content = step.content
    if char_cap is not None and len(content) > char_cap:
        content = cut_middle(content, char_cap)
    return f"[step {step.index}] {step.agent}: {content}\n"


@dataclass(frozen=True, slots=True)
class Segments:
    """A trajectory's segments as the model will see them.

    Attributes:
        texts: the task segment first, then one segment per step in order.
        tokens: the tokens of each text, by the model's ``count_tokens``.
        task_cut: the task text was cut to fit.
        steps_cut: the steps whose content was cut to fit, ascending.
    """

    texts: tuple[str, ...]
    tokens: tuple[int, ...]
    task_cut: bool = False
    steps_cut: tuple[int, ...] = ()

    @property
    def task_tokens(self) -> int:
        return self.tokens[0]

    @property
    def step_tokens(self) -> tuple[int, ...]:
        return self.tokens[1:]


def _largest_fitting(
    render: Callable[[int], str], length: int, limit: int, count: Callable[[str], int]
) -> str:
    """``render(cap)`` for the largest cap in ``[0, length)`` whose text takes at most ``limit`` tokens.

    Bisection assumes more characters never take fewer tokens, as `rcarun.methods.context.fit_prompt` does.
    """
    low, high = 0, max(length - 1, 0)
    if count(render(0)) > limit:
        raise ValueError("even the cut text does not fit")
    while low < high:
        mid = (low + high + 1) // 2
        if count(render(mid)) <= limit:
            low = mid
        else:
            high = mid - 1
    return render(low)


def prepare_segments(
    trajectory: Trajectory,
    count_tokens: Callable[[str], int],
    *,
    context_tokens: int,
    template_tokens: int,
    oversize: Oversize = "cut",
) -> Segments:
    """The segments of ``trajectory``, cut where one would not fit in a pass (rules in docs/methods/soap.md).

    Raises:
        ValueError: ``context_tokens`` leaves no room beside the template, or ``oversize`` is unknown.
        DataError: ``oversize="error"`` and the task, or the task with one step, exceeds the limit; or even a
            cut segment cannot fit (a step whose agent name alone is too long).
    """
    if oversize not in OVERSIZE_POLICIES:
        raise ValueError(f"unknown oversize policy {oversize!r}; expected one of {OVERSIZE_POLICIES}")
    room = context_tokens - template_tokens
    if room <= 0:
        raise ValueError(
            f"context_tokens {context_tokens} leaves no room beside {template_tokens} template tokens"
        )
    task = task_segment(trajectory)
    steps = [step_segment(step) for step in trajectory.steps]
    task_tokens = count_tokens(task)
    step_tokens = [count_tokens(text) for text in steps]
    longest = max(step_tokens, default=0)
    if task_tokens + longest <= room:
        return Segments((task, *steps), (task_tokens, *step_tokens))

    if oversize == "error":
        raise _oversize_error(trajectory.qid, task_tokens, step_tokens, template_tokens, context_tokens)

    task_cut = False
    task_limit = max(room // 2, room - longest)
    if task_tokens > task_limit:
        try:
            task = _largest_fitting(
                partial(task_segment, trajectory),
                len(task_text(trajectory)),
                task_limit,
                count_tokens,
            )
        except ValueError:
            raise DataError(
                f"even a cut task does not fit in {task_limit} tokens", record=trajectory.qid, field="task"
            ) from None
        task_tokens = count_tokens(task)
        task_cut = True
    steps_cut: list[int] = []
    step_limit = room - task_tokens
    for index, tokens in enumerate(step_tokens):
        if tokens <= step_limit:
            continue
        step = trajectory.steps[index]
        try:
            steps[index] = _largest_fitting(
                partial(step_segment, step), len(step.content), step_limit, count_tokens
            )
        except ValueError:
            raise DataError(
                f"step {index} does not fit beside the task in {step_limit} tokens even with its content cut",
                record=trajectory.qid,
                field=f"history[{index}]",
            ) from None
        step_tokens[index] = count_tokens(steps[index])
        steps_cut.append(index)
    return Segments((task, *steps), (task_tokens, *step_tokens), task_cut, tuple(steps_cut))


def _oversize_error(
    qid: str, task_tokens: int, step_tokens: Sequence[int], template_tokens: int, context_tokens: int
) -> DataError:
    """``oversize="error"``: the task, or else the longest step beside it, that does not fit in a pass."""
    if task_tokens >= context_tokens - template_tokens:
        return DataError(
            f"the task takes {task_tokens} tokens, {template_tokens} more go to the chat template and "
            f"the model's limit is {context_tokens}: no step fits beside it (oversize='error')",
            record=qid,
            field="task",
        )
    longest = max(step_tokens)
    worst = step_tokens.index(longest)
    return DataError(
        f"step {worst} takes {longest} tokens; with the task ({task_tokens}) and the chat template "
        f"({template_tokens}) its pass exceeds the model's limit of {context_tokens} (oversize='error')",
        record=qid,
        field=f"history[{worst}]",
    )


@dataclass(frozen=True, slots=True)
class PlannedPass:
    """One forward pass: the task and ``steps[start:stop]``, scoring the targets ``first_target … stop - 1``.

    Attributes:
        start: the first step in the pass (every target's window starts here).
        stop: one past the last step in the pass (the last target).
        first_target: the first step scored from this pass.
        tokens: tokens the pass holds, chat template included.
    """

    start: int
    stop: int
    first_target: int
    tokens: int

    @property
    def targets(self) -> range:
        return range(self.first_target, self.stop)

    @property
    def n_segments(self) -> int:
        return 1 + self.stop - self.start

    def segment_of(self, step: int) -> int:
        """The index of ``step``'s segment in this pass (0 is the task)."""
        if not self.start <= step < self.stop:
            raise IndexError(f"step {step} is not in the pass over steps {self.start}..{self.stop - 1}")
        return 1 + step - self.start


@dataclass(frozen=True, slots=True)
class InputPlan:
    """The passes that score every step of one trajectory once.

    Attributes:
        passes: in order of their targets; each step is a target of exactly one pass.
        starts: per step, the first step its window keeps (``a(t)`` of rule 2).
    """

    passes: tuple[PlannedPass, ...]
    starts: tuple[int, ...]

    @property
    def tokens(self) -> int:
        """Tokens fed to the model over all passes, chat template included."""
        return sum(p.tokens for p in self.passes)

    @property
    def windowed(self) -> bool:
        """Some step's window dropped older steps (the trajectory did not fit in one pass)."""
        return any(self.starts)

    def pass_of(self, step: int) -> PlannedPass:
        for forward_pass in self.passes:
            if step in forward_pass.targets:
                return forward_pass
        raise IndexError(f"step {step} is not planned")


def window_starts(task_tokens: int, step_tokens: Sequence[int], room: int) -> tuple[int, ...]:
    """``a(t)`` for every step: the oldest step kept when ``task + steps[a..t]`` must fit in ``room`` tokens.

    Raises:
        ValueError: a step does not fit beside the task even alone (`prepare_segments` prevents that).
    """
    starts: list[int] = []
    start = 0
    held = 0
    for target, tokens in enumerate(step_tokens):
        if task_tokens + tokens > room:
            raise ValueError(
                f"step {target} ({tokens} tokens) does not fit beside the task ({task_tokens}) "
                f"in {room} tokens"
            )
        held += tokens
        while task_tokens + held > room:
            held -= step_tokens[start]
            start += 1
        starts.append(start)
    return tuple(starts)


def plan_passes(
    task_tokens: int,
    step_tokens: Sequence[int],
    *,
    context_tokens: int,
    template_tokens: int,
    sharing: Sharing = "grouped",
) -> InputPlan:
    """The forward passes for one trajectory (rules in docs/methods/soap.md).

    Args:
        task_tokens: tokens of the task segment.
        step_tokens: tokens of each step segment.
        context_tokens: the most tokens one pass may hold, template included.
        template_tokens: tokens the chat template adds to every pass.
        sharing: ``"grouped"``, ``"prefix"`` or ``"none"``.
    """
    if sharing not in SHARING_MODES:
        raise ValueError(f"unknown sharing mode {sharing!r}; expected one of {SHARING_MODES}")
    room = context_tokens - template_tokens
    starts = window_starts(task_tokens, step_tokens, room)

    def make(start: int, first: int, stop: int) -> PlannedPass:
        return PlannedPass(start, stop, first, template_tokens + task_tokens + sum(step_tokens[start:stop]))

    passes: list[PlannedPass] = []
    first = 0
    for target, start in enumerate(starts):
        last_of_group = target + 1 == len(starts) or starts[target + 1] != start
        shares = sharing == "grouped" or (sharing == "prefix" and start == 0)
        if not shares:
            passes.append(make(start, target, target + 1))
            first = target + 1
        elif last_of_group:
            passes.append(make(start, first, target + 1))
            first = target + 1
    return InputPlan(tuple(passes), starts)
