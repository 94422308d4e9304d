"""Complementarity (which trajectories only one method solves; the paper's Fig. 8) and repeatability across
realizations (pairwise agreement of predictions, the spread of scores).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

# --- Complementarity -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Complementarity:
    """The 2x2 table of two methods' correctness over the same trajectories.

    Attributes:
        a_only: Solved by A only.
        b_only: Solved by B only (for `union_complementarity`: by some other method but not A).
        both: Solved by both.
        neither: Solved by neither.
    """

    a_only: int
    b_only: int
    both: int
    neither: int

    @property
    def n(self) -> int:
        """Number of trajectories."""
        return self.a_only + self.b_only + self.both + self.neither


def complementarity(a_correct: Sequence[bool], b_correct: Sequence[bool]) -> Complementarity:
    """Count the trajectories solved by A only, B only, both and neither.

    Raises:
        ValueError: If the two sequences differ in length.
    """
    if len(a_correct) != len(b_correct):
        raise ValueError(
            f"a_correct and b_correct must have equal lengths, got {len(a_correct)} and {len(b_correct)}"
        )
    a_only = b_only = both = neither = 0
    for x, y in zip(a_correct, b_correct, strict=True):
        if x and y:
            both += 1
        elif x:
            a_only += 1
        elif y:
            b_only += 1
        else:
            neither += 1
    return Complementarity(a_only=a_only, b_only=b_only, both=both, neither=neither)


def union_complementarity(a_correct: Sequence[bool], others: Sequence[Sequence[bool]]) -> Complementarity:
    """Method A against the union of several others (paper Figure 8).

    A trajectory counts as solved by the union if any of ``others`` solved it; the result's ``b_only`` is then
    "solved by some other method, not by A".

    Raises:
        ValueError: If ``others`` is empty or any of them differs in length from ``a_correct``.
    """
    if not others:
        raise ValueError("others is empty; the union of no methods solves nothing and is not a comparison")
    for i, other in enumerate(others):
        if len(other) != len(a_correct):
            raise ValueError(f"others[{i}] has length {len(other)}, a_correct has {len(a_correct)}")
    union = [any(bool(other[j]) for other in others) for j in range(len(a_correct))]
    return complementarity(a_correct, union)


# --- Repeatability across realizations -------------------------------------------------------------------------


@dataclass(frozen=True)
class Agreement:
    """How often two realizations of the same backbone and method predict the same value.

    Attributes:
        first: The smaller realization id.
        second: The larger realization id.
        n: Trajectories present in both realizations (the denominator, Nones included).
        agree: Trajectories where both predicted the same value and neither is None.
        both_missing: Trajectories where both have no valid prediction (None); not counted in ``agree``.
    """

    first: int
    second: int
    n: int
    agree: int
    both_missing: int

    @property
    def rate(self) -> float:
        """agree / n."""
        return self.agree / self.n


def pairwise_agreement(predictions: Mapping[int, Mapping[str, object]]) -> list[Agreement]:
    """Agreement between every unordered pair of realizations, over the trajectories both contain.

    None means "no valid prediction". Two Nones are not an agreement (two failures say nothing about whether
    the method is stable); they are counted in ``both_missing`` and stay in the denominator, as does a None
    against a value. Values are compared with ``==``.

    Args:
        predictions: realization id -> (trajectory id -> predicted value or None).

    Returns:
        One `Agreement` per pair (r1 < r2), ordered by (r1, r2); empty with fewer than two realizations.

    Raises:
        ValueError: If two realizations share no trajectory (the rate would be 0/0).
    """
    result: list[Agreement] = []
    for first, second in combinations(sorted(predictions), 2):
        left, right = predictions[first], predictions[second]
        shared = [qid for qid in left if qid in right]
        if not shared:
            raise ValueError(f"realizations {first} and {second} share no trajectory")
        agree = both_missing = 0
        for qid in shared:
            x, y = left[qid], right[qid]
            if x is None and y is None:
                both_missing += 1
            elif x is not None and y is not None and x == y:
                agree += 1
        result.append(
            Agreement(first=first, second=second, n=len(shared), agree=agree, both_missing=both_missing)
        )
    return result


def mean_pairwise_agreement(predictions: Mapping[int, Mapping[str, object]]) -> float:
    """Unweighted mean of the pairwise agreement rates.

    Raises:
        ValueError: With fewer than two realizations, or as `pairwise_agreement`.
    """
    pairs = pairwise_agreement(predictions)
    if not pairs:
        raise ValueError(f"agreement needs at least two realizations, got {len(predictions)}")
    return statistics.fmean(p.rate for p in pairs)


@dataclass(frozen=True)
class Spread:
    """Summary of one score over several realizations.

    Attributes:
        n: Number of realizations.
        mean: Arithmetic mean.
        min: Smallest value.
        max: Largest value.
        sd: Sample standard deviation (ddof=1); 0.0 for a single realization.
    """

    n: int
    mean: float
    min: float
    max: float
    sd: float

    @property
    def range(self) -> float:
        """max - min."""
        return self.max - self.min


def spread(values: Mapping[int, float]) -> Spread:
    """Mean, extremes and sample standard deviation of a score across realizations.

    Args:
        values: realization id -> score.

    Raises:
        ValueError: If ``values`` is empty or holds a non-finite score.
    """
    if not values:
        raise ValueError("spread needs at least one realization, got none")
    xs = [float(v) for v in values.values()]
    for realization, x in values.items():
        if not math.isfinite(x):
            raise ValueError(f"scores must be finite; realization {realization} has {x!r}")
    return Spread(
        n=len(xs),
        mean=statistics.fmean(xs),
        min=min(xs),
        max=max(xs),
        sd=statistics.stdev(xs) if len(xs) > 1 else 0.0,
    )
