"""The shared length partition (LongRCA App. K): trajectories in contiguous groups of near-equal size.

Only lengths enter here, never an outcome, so one partition serves every method and run it is applied to
(`scoring.by_length_group`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["LengthGroup", "LengthPartition", "length_groups"]


@dataclass(frozen=True, slots=True)
class LengthGroup:
    """One group of a length partition: every trajectory with ``low <= n_steps <= high``.

    Attributes:
        low: the smallest length in the group (inclusive).
        high: the largest length in the group (inclusive).
        qids: the group's trajectories, sorted.
    """

    low: int
    high: int
    qids: tuple[str, ...]

    @property
    def size(self) -> int:
        """The number of trajectories in the group."""
        return len(self.qids)


@dataclass(frozen=True, slots=True)
class LengthPartition:
    """Trajectories split into contiguous length groups (`length_groups`).

    Attributes:
        groups: the groups in increasing length order.
        boundaries: the inclusive upper length of every group but the last (the paper's "63, 129, 172, 220").
        k: the number of groups asked for (``len(groups)`` is smaller when there are fewer distinct lengths).
    """

    groups: tuple[LengthGroup, ...]
    boundaries: tuple[int, ...]
    k: int

    def group_index(self, qid: str) -> int:
        """The index of the group holding ``qid``.

        Raises:
            KeyError: ``qid`` is not in the partition.
        """
        for index, group in enumerate(self.groups):
            if qid in group.qids:
                return index
        raise KeyError(qid)


def length_groups(lengths: Mapping[str, int], k: int = 5) -> LengthPartition:
    """Split trajectories into ``k`` contiguous length groups of sizes as equal as equal lengths allow.

    The paper's shared length partition (App. K): dynamic programming over the distinct observed lengths
    chooses ``k − 1`` cuts, each between two consecutive distinct lengths, minimising ``Σ_g (size_g − N/k)²``.
    Trajectories of equal length always share a group. The objective is computed exactly in integers as
    ``Σ_g (k·size_g − N)²`` (the same minimiser), so ties are real ties; among optimal partitions the one with
    the lexicographically smallest boundary tuple wins (cuts as early as possible, first cut first).

    Boundaries are the inclusive upper lengths of every group but the last: group g holds the lengths in
    ``(boundary_{g−1}, boundary_g]``. That reading matches the paper: its boundary 63 closes a group holding
    the 145 trajectories of exactly 63 steps, and its 4-group partition starts with 290 = 145 + 145 trajectories
    while its 6-group one starts with the 145 below 63.

    With fewer than ``k`` distinct lengths, each distinct length is a group of its own (fewer than ``k`` groups).

    Args:
        lengths: one length per unique trajectory, keyed by qid; no prediction outcome may enter here.
        k: the number of groups.

    Raises:
        ValueError: ``k < 1``, ``lengths`` is empty, or a length is not an integer.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if not lengths:
        raise ValueError("no lengths to partition")
    by_length: dict[int, list[str]] = {}
    for qid, length in lengths.items():
        if isinstance(length, bool) or not isinstance(length, int):
            raise ValueError(f"length of {qid!r} must be an integer, got {length!r}")
        by_length.setdefault(length, []).append(qid)
    distinct = sorted(by_length)
    counts = [len(by_length[length]) for length in distinct]
    ends = _optimal_group_ends(counts, k, total=len(lengths))
    groups: list[LengthGroup] = []
    start = 0
    for end in ends:  # each group spans distinct[start:end]
        qids = sorted(qid for length in distinct[start:end] for qid in by_length[length])
        groups.append(LengthGroup(low=distinct[start], high=distinct[end - 1], qids=tuple(qids)))
        start = end
    return LengthPartition(groups=tuple(groups), boundaries=tuple(group.high for group in groups[:-1]), k=k)


def _optimal_group_ends(counts: Sequence[int], k: int, *, total: int) -> list[int]:
    """Exclusive end indices (into ``counts``) of the optimal groups, the last being ``len(counts)``."""
    m = len(counts)
    groups = min(k, m)
    prefix = [0]
    for count in counts:
        prefix.append(prefix[-1] + count)

    def cost(start: int, end: int) -> int:
        return (k * (prefix[end] - prefix[start]) - total) ** 2

    # best[j][i]: least cost of splitting counts[i:] into exactly j non-empty groups (None: impossible).
    # A suffix table lets the forward walk take the earliest optimal cut at each step, which yields the
    # lexicographically smallest boundary tuple among all optimal partitions.
    best: list[list[int | None]] = [[None] * (m + 1) for _ in range(groups + 1)]
    best[0][m] = 0
    for j in range(1, groups + 1):
        for i in range(m - j, -1, -1):
            options = [
                cost(i, end) + rest
                for end in range(i + 1, m - j + 2)
                if (rest := best[j - 1][end]) is not None
            ]
            best[j][i] = min(options) if options else None
    ends: list[int] = []
    start = 0
    for j in range(groups, 0, -1):
        target = best[j][start]
        for end in range(start + 1, m - j + 2):
            rest = best[j - 1][end]
            if rest is not None and cost(start, end) + rest == target:
                ends.append(end)
                start = end
                break
    return ends
