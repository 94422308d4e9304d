"""The prompts of FALAT's two LLM stages: locate (stage 3) over the typed log, verify (stage 6) per candidate.

Steps show as ``[step k] (type) agent: content``; the locate prompt is fitted by the shared cap-steps policy,
a verify prompt by `weighted_caps` (the candidate may take twice each other step's share). Texts:
``prompts/falat_*.txt``; rules: ``docs/methods/falat.md``, stages 3 and 6.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rcarun.data import Step, Trajectory
from rcarun.methods.context import Truncation, TruncationPolicy, cut_middle, fit_prompt
from rcarun.methods.falat.graph import SHOWN_TOKENS, DependencyGraph, Edge
from rcarun.methods.falat.schemas import FailurePoint, locate_schema, verify_schema
from rcarun.methods.falat.search import Candidate, path_to_failure
from rcarun.methods.falat.step_types import StepType, TypedStep
from rcarun.methods.llm import LLM, Message
from rcarun.methods.prompt_files import PromptTemplate, load_prompt

__all__ = ["Templates", "locate_messages", "render_step", "verify_messages", "weighted_caps"]


@dataclass(frozen=True, slots=True)
class Templates:
    """FALAT's prompt texts: the system prompt shared by both stages and the two user prompts."""

    system: str
    locate: PromptTemplate
    verify: PromptTemplate

    @classmethod
    def load(cls) -> Templates:
        """The texts from ``rcarun/methods/prompts``."""
        return cls(
            system=load_prompt("falat_system.txt").template.strip(),
            locate=load_prompt("falat_locate_user.txt"),
            verify=load_prompt("falat_verify_user.txt"),
        )


def _speaker(step: Step) -> str:
    """The agent as shown in prompts, with the handoff target when its role has one and its name does not."""
    handoff = step.handoff
    if handoff is None or step.agent != handoff.sender:
        return step.agent
    return f"{step.agent} (-> {handoff.recipient})"


def render_step(step: Step, step_type: StepType, cap: int | None) -> str:
    """``[step k] (type) agent: content``, the content cut in the middle to ``cap`` characters when longer."""
    content = step.content
    if cap is not None and len(content) > cap:
        content = cut_middle(content, cap)
    return f"[step {step.index}] ({step_type}) {_speaker(step)}: {content}"


def weighted_caps(lengths: Sequence[int], weights: Sequence[int], total: int) -> list[int | None]:
    """Per-step caps ``weight * c``, for the largest ``c`` whose capped lengths sum to at most ``total``.

    A step no longer than its cap gets None (not cut); when the lengths already fit, every step gets None.
    """
    if sum(lengths) <= total:
        return [None] * len(lengths)
    low, high = 0, max(lengths, default=0)
    while low < high:
        mid = (low + high + 1) // 2
        if sum(min(length, weight * mid) for length, weight in zip(lengths, weights, strict=True)) <= total:
            low = mid
        else:
            high = mid - 1
    return [
        weight * low if length > weight * low else None
        for length, weight in zip(lengths, weights, strict=True)
    ]


def _min_cap(first: int | None, second: int | None) -> int | None:
    if first is None:
        return second
    return first if second is None else min(first, second)


def locate_messages(
    trajectory: Trajectory,
    types: Sequence[TypedStep],
    llm: LLM,
    *,
    templates: Templates,
    task: str,
    ground_truth: str,
    max_tokens: int,
    policy: TruncationPolicy,
) -> tuple[list[Message], Truncation]:
    """The locate prompt over the whole typed log, fitted to ``llm``'s context window under ``policy``, with room
    for ``max_tokens``; ``task`` and ``ground_truth`` as `task_text` and `ground_truth_line` give them."""
    schema_text = json.dumps(locate_schema(trajectory.n_steps), ensure_ascii=False)

    def render(cap: int | None) -> str:
        note = (
            "\nSome long steps were cut in the middle to fit the model's context; "
            "their step numbers are kept.\n"
            if cap is not None
            else ""
        )
        log = "\n".join(render_step(step, types[step.index].type, cap) for step in trajectory.steps)
        return templates.locate.substitute(
            task=task,
            ground_truth=ground_truth,
            agents=", ".join(trajectory.agents),
            n_steps=trajectory.n_steps,
            log=log,
            truncation_note=note,
            schema=schema_text,
        )

    fitted = fit_prompt(
        render,
        [len(step.content) for step in trajectory.steps],
        llm=llm,
        max_tokens=max_tokens,
        system=templates.system,
        policy=policy,
    )
    return [Message("system", templates.system), Message("user", fitted.text)], fitted.truncation


def verify_messages(
    trajectory: Trajectory,
    types: Sequence[TypedStep],
    graph: DependencyGraph,
    failure_point: FailurePoint,
    candidates: Mapping[int, Candidate],
    step: int,
    llm: LLM,
    *,
    templates: Templates,
    task: str,
    ground_truth: str,
    max_parents: int,
    max_chars: int,
    max_tokens: int,
    policy: TruncationPolicy,
) -> tuple[list[Message], Truncation]:
    """The verify prompt for candidate ``step``: its nearest dependencies, itself and the failure step.

    ``candidates`` are the walk's, by step (the dependency path to the failure is read from them);
    ``max_parents`` (``max_context_parents``) dependencies are shown, nearest first, within ``max_chars``
    (``verify_context_chars``) characters of step text. The rest as in `locate_messages`.
    """
    steps = trajectory.steps
    parent_edges = graph.parents(step)[:max_parents]
    parent_edges = tuple(sorted(parent_edges, key=lambda edge: edge.depends_on))
    failure = failure_point.step
    shown = [edge.depends_on for edge in parent_edges] + [step] + ([failure] if failure != step else [])
    weights = [1] * len(parent_edges) + [2] + ([1] if failure != step else [])
    allocated = weighted_caps([len(steps[s].content) for s in shown], weights, max_chars)
    alloc = dict(zip(shown, allocated, strict=True))

    def render(cap: int | None) -> str:
        def line(index: int) -> str:
            return render_step(steps[index], types[index].type, _min_cap(alloc[index], cap))

        parents = "\n".join(f"{_link_note(edge, step)}\n{line(edge.depends_on)}" for edge in parent_edges)
        cut = cap is not None or any(a is not None and len(steps[s].content) > a for s, a in alloc.items())
        note = "\nSome long steps were cut in the middle; their step numbers are kept.\n" if cut else ""
        path = " -> ".join(str(s) for s in path_to_failure(candidates, step))
        return templates.verify.substitute(
            task=task,
            ground_truth=ground_truth,
            n_steps=trajectory.n_steps,
            failure_note=_failure_note(failure_point),
            candidate=step,
            candidate_type=types[step].type,
            candidate_agent=_speaker(steps[step]),
            path=path,
            parents=parents or "(none: the candidate depends on no earlier step)",
            candidate_step=line(step),
            failure_step=line(failure) if failure != step else "(the candidate itself)",
            truncation_note=note,
            schema=json.dumps(verify_schema(), ensure_ascii=False),
        )

    fitted = fit_prompt(
        render,
        [len(steps[s].content) if a is None else a for s, a in alloc.items()],
        llm=llm,
        max_tokens=max_tokens,
        system=templates.system,
        policy=policy,
    )
    return [Message("system", templates.system), Message("user", fitted.text)], fitted.truncation


def _link_note(edge: Edge, step: int) -> str:
    """How the candidate ``step`` depends on a parent shown above it: the link kinds and shared tokens."""
    note = f"-- step {step} depends on it by: {', '.join(edge.kinds)}"
    if edge.shared:
        note += f" (shared: {', '.join(edge.shared[:SHOWN_TOKENS])})"
    return note


def _failure_note(failure_point: FailurePoint) -> str:
    """Where the failure is visible, as the locate stage found it or as its fallback took it."""
    if failure_point.fallback:
        return f"The failure is taken to be visible at the last step, step {failure_point.step}."
    return f"The failure first becomes visible at step {failure_point.step}: {failure_point.reason}"
