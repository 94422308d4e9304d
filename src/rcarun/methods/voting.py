"""Majority vote over several attributions of one trajectory (self-consistency, judge panels).

Role and step are voted separately (the protocol scores them independently); only valid values vote; ties go
by ``tie_break``. The rules: ``docs/methods/ensembles.md``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from rcarun.data import Trajectory
from rcarun.errors import ConfigError
from rcarun.methods.base import Attribution, role_is_valid, step_is_valid

__all__ = ["TIE_BREAKS", "TieBreak", "Vote", "majority", "vote"]

TieBreak = Literal["first-voter", "earliest-step"]
TIE_BREAKS: tuple[TieBreak, ...] = ("first-voter", "earliest-step")

_Value = TypeVar("_Value", str, int)


@dataclass(frozen=True, slots=True)
class Vote:
    """The voted prediction and the tallies behind it (kept in the method's output)."""

    attribution: Attribution
    role_votes: dict[str, int]
    step_votes: dict[int, int]
    role_tied: bool
    step_tied: bool

    def as_output(self) -> dict[str, Any]:
        return {
            "role_votes": self.role_votes,
            "step_votes": {str(step): count for step, count in self.step_votes.items()},
            "role_tied": self.role_tied,
            "step_tied": self.step_tied,
        }


def majority(values: Sequence[_Value], *, prefer_smallest: bool = False) -> tuple[_Value | None, bool]:
    """The most frequent value (None when there is none), and whether the top count was tied.

    ``values`` are in voter order; a tie goes to the first voter's value, or to the smallest value with
    ``prefer_smallest``.
    """
    if not values:
        return None, False
    counts = Counter(values)
    top = max(counts.values())
    tied = [value for value in dict.fromkeys(values) if counts[value] == top]  # voter order, first kept
    winner = min(tied) if prefer_smallest else tied[0]
    return winner, len(tied) > 1


def vote(
    trajectory: Trajectory,
    answers: Sequence[Attribution | None],
    *,
    tie_break: TieBreak = "first-voter",
    output: dict[str, Any] | None = None,
) -> Vote:
    """Vote ``answers`` (in voter order; None for a voter that failed) into one attribution for ``trajectory``."""
    if tie_break not in TIE_BREAKS:
        raise ConfigError(f"tie_break must be one of {list(TIE_BREAKS)}, got {tie_break!r}")
    roles = [a.pred_role for a in answers if a is not None and a.role_valid and a.pred_role is not None]
    steps = [a.pred_step for a in answers if a is not None and a.step_valid and a.pred_step is not None]
    role, role_tied = majority(roles)
    step, step_tied = majority(steps, prefer_smallest=tie_break == "earliest-step")
    abstained = all(a is None or a.abstained for a in answers)
    attribution = Attribution(
        pred_role=role,
        pred_step=step,
        role_valid=role_is_valid(role, trajectory),
        step_valid=step_is_valid(step, trajectory),
        abstained=abstained and role is None and step is None,
        output=output or {},
    )
    return Vote(
        attribution=attribution,
        role_votes=dict(Counter(roles)),
        step_votes=dict(Counter(steps)),
        role_tied=role_tied,
        step_tied=step_tied,
    )
