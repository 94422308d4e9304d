"""ECHO's per-target context: the paper's C_i of each target step i, put before an analyst in one document.

An analyst makes one call per trajectory, so its contexts share one prompt: the L4 milestones once, then one
block per target. Every step is a target when that fits the cap, else the most evenly spaced ones; why, and how
neighbours that are targets are shown: ``docs/methods/echo.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from rcarun.data import Trajectory
from rcarun.methods.echo.context import (
    MIN_FULL_CHARS,
    Extract,
    context_level,
    cut_middle,
    extract_cue,
    full_line,
    omission_marker,
    reduced_line,
    spread_steps,
)

__all__ = [
    "GLOBAL_HEADER",
    "NEIGHBOUR_TARGETS",
    "NeighbourTargets",
    "TargetContext",
    "target_block_header",
    "target_context",
]

NeighbourTargets = Literal["in-full", "referenced"]
NEIGHBOUR_TARGETS: tuple[str, ...] = get_args(NeighbourTargets)

GLOBAL_HEADER = "=== Global context: every step reduced to a milestone (the L4 level of every target) ==="
_TARGET_TAG = "target"
_IN_ITS_OWN_BLOCK = "(a target: shown in full in its own context)"
_LOCAL = (2, 3)  # distances of L2
_DISTANT = (4, 5, 6)  # distances of L3


def target_block_header(step: int, agent: str) -> str:
    """The line that opens target ``step``'s context."""
    return f"=== Context of target step {step} ({agent}) ==="


@dataclass(frozen=True, slots=True)
class TargetContext:
    """The per-target document and what was done to fit it under the character cap.

    Attributes:
        text: the document.
        targets: the target steps, in order.
        every_step: every step of the log is a target.
        fits: ``len(text) <= char_cap`` (always True without a cap).
        full_char_cap: the cap applied to full contents, None when none was needed.
        omitted: the steps whose milestone was left out of the global context.
        cue_fallbacks: reduced lines of the document taken from a first sentence because no cue matched.
    """

    text: str
    targets: tuple[int, ...]
    every_step: bool
    fits: bool
    full_char_cap: int | None = None
    omitted: tuple[int, ...] = ()
    cue_fallbacks: int = 0


class _Document:
    """A log's steps reduced once for every level, rendered for any set of targets, content cap and omissions."""

    def __init__(self, trajectory: Trajectory, context_type: str, neighbour_targets: str) -> None:
        self.trajectory = trajectory
        self.refer_to_targets = neighbour_targets == "referenced"
        self.extracts: list[dict[int, Extract]] = [
            {level: extract_cue(step.content, level, context_type) for level in (2, 3, 4)}
            for step in trajectory.steps
        ]

    def render(
        self, targets: Sequence[int], full_cap: int | None = None, omitted: frozenset[int] = frozenset()
    ) -> tuple[str, int]:
        """The document and its number of cue fallbacks."""
        steps = self.trajectory.steps
        n = len(steps)
        shown_as_target = frozenset(targets) if self.refer_to_targets else frozenset()
        fallbacks = 0
        out = [GLOBAL_HEADER]
        run: list[int] = []
        for step in steps:
            if step.index in omitted:
                run.append(step.index)
                continue
            if run:
                out.append(omission_marker(run[0], run[-1]))
                run = []
            extract = self.extracts[step.index][4]
            fallbacks += not extract.cue_matched
            out.append(reduced_line(step.index, step.agent, 4, extract.text))
        if run:
            out.append(omission_marker(run[0], run[-1]))
        for target in targets:
            out.append("")
            out.append(target_block_header(target, steps[target].agent))
            out.append("L1 immediate (the target and its neighbours, in full):")
            for index in range(max(target - 1, 0), min(target + 2, n)):
                step = steps[index]
                if index != target and index in shown_as_target:
                    out.append(full_line(index, step.agent, _IN_ITS_OWN_BLOCK))
                    continue
                content = step.content if full_cap is None else cut_middle(step.content, full_cap)
                out.append(full_line(index, step.agent, content, _TARGET_TAG if index == target else None))
            for level, distances, title in (
                (2, _LOCAL, "L2 local (two or three steps away, key decisions):"),
                (3, _DISTANT, "L3 distant (four to six steps away, outcomes):"),
            ):
                near = sorted(
                    index
                    for distance in distances
                    for index in (target - distance, target + distance)
                    if 0 <= index < n
                )
                out.append(title + ("" if near else " none"))
                for index in near:
                    extract = self.extracts[index][level]
                    fallbacks += not extract.cue_matched
                    out.append(reduced_line(index, steps[index].agent, level, extract.text))
            out.append("L4 global (the other steps): " + _far_ranges(target, n))
        return "\n".join(out), fallbacks


def _far_ranges(target: int, n: int) -> str:
    """Which steps the target's L4 level covers, as said in its block."""
    far = [
        (first, last)
        for first, last in ((0, target - _DISTANT[-1] - 1), (target + _DISTANT[-1] + 1, n - 1))
        if first <= last
    ]
    if not far:
        return "none"
    spans = " and ".join(f"step {a}" if a == b else f"steps {a}-{b}" for a, b in far)
    return f"{spans}, as milestones in the global context"


def target_context(
    trajectory: Trajectory,
    context_type: str = "decision-quality",
    char_cap: int | None = None,
    *,
    neighbour_targets: str = "in-full",
) -> TargetContext:
    """The per-target document of ``trajectory``, fitted to ``char_cap`` characters.

    In this order, the first that fits: every step a target; the largest count of evenly spaced targets
    (`spread_steps`) that fits with nothing cut, found by bisection on the count; one target (the middle step)
    with full contents cut in the middle to the largest common cap that fits, not below 1,000 characters; then
    milestones left out, those without a cue first, the farthest from the target first. ``fits`` is False only
    when even the last is longer than the cap.

    Raises:
        ValueError: the trajectory has no step, or ``neighbour_targets`` is unknown.
    """
    n = trajectory.n_steps
    if n == 0:
        raise ValueError("a per-target context needs at least one step")
    if neighbour_targets not in NEIGHBOUR_TARGETS:
        raise ValueError(f"neighbour_targets must be one of {NEIGHBOUR_TARGETS}, not {neighbour_targets!r}")
    document = _Document(trajectory, context_type, neighbour_targets)

    def made(
        targets: Sequence[int], full_cap: int | None = None, omitted: frozenset[int] = frozenset()
    ) -> TargetContext:
        text, fallbacks = document.render(targets, full_cap, omitted)
        fits = char_cap is None or len(text) <= char_cap
        return TargetContext(
            text, tuple(targets), len(targets) == n, fits, full_cap, tuple(sorted(omitted)), fallbacks
        )

    every = made(range(n))
    if every.fits:
        return every
    low, high = 0, n - 1  # invariant: ``low`` targets fit (0: none found yet), more than ``high`` do not
    while low < high:
        count = (low + high + 1) // 2
        if made(spread_steps(n, count)).fits:
            low = count
        else:
            high = count - 1
    if low:
        return made(spread_steps(n, low))

    targets = spread_steps(n, 1)
    shown = range(max(targets[0] - 1, 0), min(targets[0] + 2, n))
    longest = max(len(trajectory.steps[index].content) for index in shown)
    floor = min(MIN_FULL_CHARS, longest)
    if made(targets, floor).fits:
        low, high = floor, longest  # invariant: a cap of ``low`` fits, above ``high`` none does
        while low < high:
            cap = (low + high + 1) // 2
            if made(targets, cap).fits:
                low = cap
            else:
                high = cap - 1
        return made(targets, low)

    order = _milestone_order(document, targets[0])
    if not made(targets, floor, frozenset(order)).fits:
        return made(targets, floor, frozenset(order))
    low, high = 0, len(order)  # invariant: leaving out ``low`` does not fit, ``high`` does
    while high - low > 1:
        count = (low + high) // 2
        if made(targets, floor, frozenset(order[:count])).fits:
            high = count
        else:
            low = count
    return made(targets, floor, frozenset(order[:high]))


def _milestone_order(document: _Document, target: int) -> list[int]:
    """Milestones in the order they are left out: without a cue first, then farthest, then latest first.

    The target's own L1-L3 steps come last: their milestone is all that stays of them outside the block.
    """
    steps = document.trajectory.steps
    return [
        step.index
        for step in sorted(
            steps,
            key=lambda step: (
                context_level(abs(step.index - target)) < 4,
                document.extracts[step.index][4].cue_matched,
                -abs(step.index - target),
                -step.index,
            ),
        )
    ]
