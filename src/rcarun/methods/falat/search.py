"""FALAT stages 4 to 6 without the model: backward walk, pruning of carriers, verification search, decision.

The rules that make FALAT a dependency-guided search rather than one judgement, all deterministic
(``docs/methods/falat.md``, stages 4–6); `search_sources` takes the verification call as a function.
"""

from __future__ import annotations

import heapq
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from rcarun.methods.falat.graph import SHOWN_TOKENS, DependencyGraph, ancestors_in, parent_map
from rcarun.methods.falat.schemas import Verdict

__all__ = [
    "Candidate",
    "Decision",
    "DecisionRule",
    "PrunedCandidate",
    "Pruning",
    "SearchResult",
    "decide",
    "is_verified",
    "path_to_failure",
    "prune_carriers",
    "search_sources",
    "walk_back",
]

DecisionRule = Literal["earliest-verified", "highest-confidence", "failure-step"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A step reached from the failure step by walking dependencies backward.

    Attributes:
        step: the candidate step.
        hops: edges between it and the failure step (0 for the failure step itself).
        via: the step one hop closer to the failure through which it was reached (None for the failure step).
    """

    step: int
    hops: int
    via: int | None


def walk_back(graph: DependencyGraph, failure_step: int, max_candidates: int) -> tuple[Candidate, ...]:
    """The failure step and its ancestors, nearest first (fewest hops, then later step);
    at most ``max_candidates`` steps."""
    if not 0 <= failure_step < graph.n_steps:
        raise ValueError(f"failure step {failure_step} is outside the graph")
    parents = parent_map(graph)
    found = [Candidate(failure_step, 0, None)]
    seen = {failure_step}
    layer = [failure_step]
    hops = 0
    while layer and len(found) < max_candidates:
        hops += 1
        reached: dict[int, int] = {}  # parent -> the child it was reached through (the latest child wins)
        for child in layer:
            for parent in parents[child]:
                if parent not in seen and parent not in reached:
                    reached[parent] = child
        layer = sorted(reached, reverse=True)
        seen.update(layer)
        found.extend(Candidate(step, hops, reached[step]) for step in layer[: max_candidates - len(found)])
    return tuple(found)


def path_to_failure(candidates: Mapping[int, Candidate], step: int) -> list[int]:
    """The walk's path from candidate ``step`` to the failure step, both ends included."""
    path = [step]
    via = candidates[step].via
    while via is not None:
        path.append(via)
        via = candidates[via].via
    return path


@dataclass(frozen=True, slots=True)
class PrunedCandidate:
    """A downstream carrier: it reuses the content of candidates it depends on.

    Attributes:
        step: the carrier.
        carries_from: the candidates among its ancestors whose content it reuses, ascending.
        reasons: one short reason per entry of ``carries_from``.
    """

    step: int
    carries_from: tuple[int, ...]
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Pruning:
    """Candidates split into source-most ones (``kept``) and downstream carriers (``pruned``), ascending."""

    kept: tuple[int, ...]
    pruned: tuple[PrunedCandidate, ...]


def prune_carriers(
    graph: DependencyGraph, candidates: Sequence[Candidate], *, min_shared_tokens: int = 1
) -> Pruning:
    """Set aside each candidate that reuses the content of a candidate among its ancestors."""
    parents = parent_map(graph)
    steps = {candidate.step for candidate in candidates}
    kept: list[int] = []
    pruned: list[PrunedCandidate] = []
    for step in sorted(steps):
        carries: list[tuple[int, str]] = []
        for earlier in sorted(ancestors_in(parents, step) & steps):
            reason = _reuse(graph, step, earlier, min_shared_tokens)
            if reason is not None:
                carries.append((earlier, reason))
        if carries:
            pruned.append(PrunedCandidate(step, tuple(s for s, _ in carries), tuple(r for _, r in carries)))
        else:
            kept.append(step)
    return Pruning(tuple(kept), tuple(pruned))


def _reuse(graph: DependencyGraph, step: int, earlier: int, min_shared_tokens: int) -> str | None:
    edge = graph.edge(step, earlier)
    if edge is not None and "tool_result" in edge.kinds:
        return f"tool output of step {earlier}"
    common = sorted(graph.tokens_of(step) & graph.tokens_of(earlier))
    if len(common) >= min_shared_tokens:
        return f"reuses {len(common)} token(s) of step {earlier}: {', '.join(common[:SHOWN_TOKENS])}"
    return None


def is_verified(verdict: Verdict, min_confidence: float) -> bool:
    """A well-formed verdict saying ``is_source`` with at least ``min_confidence``."""
    return (
        verdict.valid
        and verdict.is_source
        and verdict.confidence is not None
        and verdict.confidence >= min_confidence
    )


@dataclass(frozen=True, slots=True)
class SearchResult:
    """The verification search.

    Attributes:
        verdicts: in call order (which is increasing step order).
        reinstated: carriers put back into the queue after everything they carry from was cleared, in order.
        unverified: candidates still queued when the call budget ran out.
        stop: ``"source-found"``, ``"budget"`` (calls exhausted with candidates left) or ``"exhausted"``.
    """

    verdicts: tuple[Verdict, ...]
    reinstated: tuple[int, ...]
    unverified: tuple[int, ...]
    stop: Literal["source-found", "budget", "exhausted"]


async def search_sources(
    pruning: Pruning,
    verify: Callable[[int], Awaitable[Verdict]],
    *,
    max_calls: int,
    min_confidence: float,
    reinstate: bool = False,
) -> SearchResult:
    """Verify source-most candidates earliest first, stopping at the first verified one (docs/methods/falat.md).

    Args:
        pruning: the candidates after `prune_carriers`.
        verify: one verification (one model call) of a step.
        max_calls: the most verifications made.
        min_confidence: the confidence a positive verdict needs.
        reinstate: put a carrier back into the queue once every candidate it carries from was cleared (the
            ``reinstate_carriers`` option, off by default: not in the description, see docs/methods/falat.md).
    """
    queue = list(pruning.kept)
    heapq.heapify(queue)
    queued = set(queue)
    cleared: set[int] = set()
    verdicts: list[Verdict] = []
    reinstated: list[int] = []
    while queue:
        if len(verdicts) >= max_calls:
            return SearchResult(tuple(verdicts), tuple(reinstated), tuple(sorted(queue)), "budget")
        step = heapq.heappop(queue)
        verdict = await verify(step)
        verdicts.append(verdict)
        if is_verified(verdict, min_confidence):
            return SearchResult(tuple(verdicts), tuple(reinstated), (), "source-found")
        cleared.add(step)
        if reinstate:
            for carrier in pruning.pruned:
                if carrier.step not in queued and set(carrier.carries_from) <= cleared:
                    heapq.heappush(queue, carrier.step)
                    queued.add(carrier.step)
                    reinstated.append(carrier.step)
    return SearchResult(tuple(verdicts), tuple(reinstated), (), "exhausted")


@dataclass(frozen=True, slots=True)
class Decision:
    """The chosen step, the rule that chose it, and whether that rule is a fallback."""

    step: int
    rule: DecisionRule
    fallback: bool


def decide(verdicts: Sequence[Verdict], failure_step: int, *, min_confidence: float) -> Decision:
    """The earliest verified source; else the highest-confidence candidate; else the failure step."""
    verified = [verdict.step for verdict in verdicts if is_verified(verdict, min_confidence)]
    if verified:
        return Decision(min(verified), "earliest-verified", False)
    scored = [(verdict.confidence, -verdict.step) for verdict in verdicts if verdict.confidence is not None]
    if scored:
        return Decision(-max(scored)[1], "highest-confidence", True)
    return Decision(failure_step, "failure-step", True)
