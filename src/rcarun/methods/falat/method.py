"""FALAT's options and the method that runs its six stages in order: 1 + at most k model calls per trajectory.

Wires the stages, keeps the compact output record, says which recorded fallback shaped a prediction and
registers ``"falat"``. What each option does: ``docs/methods/falat.md``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import Field, NonNegativeInt, PositiveInt

from rcarun.data import Trajectory, parse_step
from rcarun.methods._options import JudgeOptions
from rcarun.methods.base import Attribution, Method, role_is_valid, step_is_valid
from rcarun.methods.context import (
    Truncation,
    TruncationPolicy,
    ground_truth_line,
    task_text,
    truncation_summary,
)
from rcarun.methods.falat import prompts
from rcarun.methods.falat.graph import DependencyGraph, link_steps
from rcarun.methods.falat.schemas import (
    RAW_CHARS,
    FailurePoint,
    Verdict,
    locate_schema,
    parse_failure_point,
    parse_verdict,
    verify_schema,
)
from rcarun.methods.falat.search import (
    Candidate,
    Decision,
    Pruning,
    SearchResult,
    decide,
    prune_carriers,
    search_sources,
    walk_back,
)
from rcarun.methods.falat.step_types import STEP_TYPES, TypedStep, type_steps
from rcarun.methods.llm import LLM, Message, Reply
from rcarun.methods.registry import method

__all__ = ["Falat", "FalatOptions"]

_METHOD = "falat"


class FalatOptions(JudgeOptions):
    """FALAT's options table (a sweep's ``options`` for the method); docs/methods/falat.md says what each
    rule does with them.

    Attributes:
        max_tokens: the output budget of each call, locate and verify.
        temperature: the sampling temperature of each call; None leaves it to the backbone.
        reasoning: the reasoning effort asked of the backbone; None leaves it to the backbone.
        include_task: show the task instruction in every call.
        include_ground_truth: add a ``Correct final answer: ...`` line after the task (off: the protocol).
        truncation: the shared context policy, ``"cap-steps"`` or ``"none"`` (`rcarun.methods.context`).
        max_candidates: the most steps the backward walk keeps, the failure step included (stage 4).
        max_verify_calls: the most verify calls per trajectory (stage 6); 0 verifies nothing.
        link_window: how many steps back instruction and reference links may reach (stage 2).
        min_shared_tokens: the salient tokens a step must take from one earlier step to be linked to it by
            reference (stage 2) and to carry its content (stage 5).
        boilerplate_share: a token found in at least 3 steps and in more than this share of them links
            nothing, in (0, 1] (stage 2).
        max_context_parents: the most direct dependencies a verify prompt shows, nearest first.
        verify_context_chars: the characters of step text a verify prompt shows in all (the candidate may
            take twice the share of each other step).
        min_confidence: the confidence, in [0, 1], a positive verdict needs to count as verified.
        reinstate_carriers: put a carrier back into the queue once every candidate it carries from was
            cleared; not part of FALAT as described and tuned on gold labels, so off (ablations only).
        locate_stage: the stage name the locate call is recorded under.
        verify_stage: the stage name the verify calls are recorded under.
    """

    method_name = _METHOD

    max_tokens: PositiveInt = 8000
    truncation: TruncationPolicy = "cap-steps"
    max_candidates: PositiveInt = 8
    max_verify_calls: NonNegativeInt = 8
    link_window: PositiveInt = 20
    min_shared_tokens: PositiveInt = 1
    boilerplate_share: Annotated[float, Field(gt=0, le=1)] = 0.5
    max_context_parents: NonNegativeInt = 4
    verify_context_chars: PositiveInt = 16_000
    min_confidence: Annotated[float, Field(ge=0, le=1)] = 0.5
    reinstate_carriers: bool = False
    locate_stage: Annotated[str, Field(min_length=1)] = "locate"
    verify_stage: Annotated[str, Field(min_length=1)] = "verify"


class Falat(Method):
    """FALAT reconstructed: typing, linking, locate (LLM), backward walk, pruning, verify (LLM), decision."""

    def __init__(self, label: str, options: FalatOptions) -> None:
        self.label = label
        self.options = options
        self._templates = prompts.Templates.load()

    def _task(self, trajectory: Trajectory) -> str:
        return task_text(trajectory, include=self.options.include_task)

    def locate_messages(
        self, trajectory: Trajectory, types: Sequence[TypedStep], llm: LLM
    ) -> tuple[list[Message], Truncation]:
        """The locate prompt over the whole typed log, fitted to ``llm``'s context window."""
        return prompts.locate_messages(
            trajectory,
            types,
            llm,
            templates=self._templates,
            task=self._task(trajectory),
            ground_truth=ground_truth_line(trajectory, self.options.include_ground_truth),
            max_tokens=self.options.max_tokens,
            policy=self.options.truncation,
        )

    def verify_messages(
        self,
        trajectory: Trajectory,
        types: Sequence[TypedStep],
        graph: DependencyGraph,
        failure_point: FailurePoint,
        candidates: Mapping[int, Candidate],
        step: int,
        llm: LLM,
    ) -> tuple[list[Message], Truncation]:
        """The verify prompt for candidate ``step`` (`rcarun.methods.falat.prompts.verify_messages` with this
        method's options)."""
        options = self.options
        return prompts.verify_messages(
            trajectory,
            types,
            graph,
            failure_point,
            candidates,
            step,
            llm,
            templates=self._templates,
            task=self._task(trajectory),
            ground_truth=ground_truth_line(trajectory, options.include_ground_truth),
            max_parents=options.max_context_parents,
            max_chars=options.verify_context_chars,
            max_tokens=options.max_tokens,
            policy=options.truncation,
        )

    async def attribute(self, trajectory: Trajectory, llm: LLM) -> Attribution:
        options = self.options
        if trajectory.n_steps == 0:
            return Attribution(None, None, False, False, abstained=True, output={"abstained": "no steps"})
        types = type_steps(trajectory)
        graph = link_steps(
            trajectory,
            types,
            window=options.link_window,
            min_shared_tokens=options.min_shared_tokens,
            boilerplate_share=options.boilerplate_share,
        )

        messages, locate_truncation = self.locate_messages(trajectory, types, llm)
        locate_reply = await llm.chat(
            messages,
            stage=options.locate_stage,
            max_tokens=options.max_tokens,
            schema=locate_schema(trajectory.n_steps),
            temperature=options.temperature,
            reasoning=options.reasoning,
        )
        failure = parse_failure_point(locate_reply, trajectory.n_steps)

        walk = walk_back(graph, failure.step, options.max_candidates)
        pruning = prune_carriers(graph, walk, min_shared_tokens=options.min_shared_tokens)
        by_step = {candidate.step: candidate for candidate in walk}
        truncations: list[Truncation] = []

        async def verify(step: int) -> Verdict:
            verify_messages, truncation = self.verify_messages(
                trajectory, types, graph, failure, by_step, step, llm
            )
            truncations.append(truncation)
            reply = await llm.chat(
                verify_messages,
                stage=options.verify_stage,
                max_tokens=options.max_tokens,
                schema=verify_schema(),
                temperature=options.temperature,
                reasoning=options.reasoning,
            )
            return parse_verdict(step, reply)

        search = await search_sources(
            pruning,
            verify,
            max_calls=options.max_verify_calls,
            min_confidence=options.min_confidence,
            reinstate=options.reinstate_carriers,
        )
        decision = decide(search.verdicts, failure.step, min_confidence=options.min_confidence)
        role = trajectory.steps[decision.step].agent
        output = _output(
            types, graph, failure, locate_reply, locate_truncation, walk, pruning, search, decision
        )
        output["verify_truncation"] = truncation_summary(options.truncation, truncations)
        output["decision"]["role"] = role
        return Attribution(
            pred_role=role,
            pred_step=decision.step,
            role_valid=role_is_valid(role, trajectory),
            step_valid=step_is_valid(decision.step, trajectory),
            abstained=False,
            output=output,
            error=_unusable(failure, search.verdicts),
            fallback=_fallbacks(failure, search.verdicts, decision),
        )


def _locate_unreadable(failure: FailurePoint) -> bool:
    """The locate answer was not read (not a JSON object, or no integer ``failure_step``), as opposed to a
    step that was read but lies outside the log."""
    return failure.fallback and (
        failure.answer is None or parse_step(failure.answer.get("failure_step")) is None
    )


def _unusable(failure: FailurePoint, verdicts: Sequence[Verdict]) -> str | None:
    """Why the prediction rests on no answer of the model (docs/methods/falat.md), or None."""
    if not _locate_unreadable(failure) or any(verdict.valid for verdict in verdicts):
        return None
    reason = f"locate answer unreadable: {failure.error}"
    if verdicts:
        reason += (
            f"; no verification readable ({len(verdicts)} of {len(verdicts)}, first: {verdicts[0].error})"
        )
    return reason


def _fallbacks(failure: FailurePoint, verdicts: Sequence[Verdict], decision: Decision) -> str | None:
    """The recorded fallbacks that shaped the prediction, named with how often they fired, or None."""
    rules = []
    if failure.fallback:
        rules.append(f"locate answer unusable ({failure.error}), walk started at the last step")
    if decision.fallback:
        malformed = sum(1 for verdict in verdicts if not verdict.valid)
        rule = (
            "highest-confidence candidate chosen"
            if decision.rule == "highest-confidence"
            else ("failure step chosen")
        )
        rules.append(f"no verified source ({malformed} of {len(verdicts)} verdicts malformed), {rule}")
    return f"falat: {'; '.join(rules)} (the method's documented fallback)" if rules else None


def _output(
    types: Sequence[TypedStep],
    graph: DependencyGraph,
    failure: FailurePoint,
    locate_reply: Reply,
    locate_truncation: Truncation,
    walk: Sequence[Candidate],
    pruning: Pruning,
    search: SearchResult,
    decision: Decision,
) -> dict[str, Any]:
    """The compact record kept as ``output_json`` (no prompts)."""
    type_counts = Counter(typed.type for typed in types)
    failure_record: dict[str, Any] = {
        "step": failure.step,
        "fallback": failure.fallback,
        "reason": failure.reason,
        "finish_reason": locate_reply.finish_reason,
        "truncation": locate_truncation.as_output(),
    }
    if failure.fallback:
        failure_record["error"] = failure.error
        failure_record["answer"] = failure.answer
        if failure.answer is None:
            failure_record["raw_text"] = locate_reply.text[:RAW_CHARS]
    reinstated = set(search.reinstated)
    verifications = []
    for verdict in search.verdicts:
        record: dict[str, Any] = {
            "step": verdict.step,
            "valid": verdict.valid,
            "is_source": verdict.is_source,
            "confidence": verdict.confidence,
            "reason": verdict.reason,
            "reinstated": verdict.step in reinstated,
            "finish_reason": verdict.finish_reason,
        }
        if not verdict.valid:
            record["error"] = verdict.error
            if verdict.raw_text is not None:
                record["raw_text"] = verdict.raw_text
        verifications.append(record)
    return {
        "types": {step_type: type_counts.get(step_type, 0) for step_type in STEP_TYPES},
        "graph": {"nodes": graph.n_steps, "edges": len(graph.edges), "edge_kinds": graph.kind_counts()},
        "failure": failure_record,
        "candidates": {
            "walk": [{"step": c.step, "hops": c.hops} for c in walk],
            "kept": list(pruning.kept),
            "pruned": [
                {"step": p.step, "carries_from": list(p.carries_from), "reasons": list(p.reasons)}
                for p in pruning.pruned
            ],
        },
        "verifications": verifications,
        "search": {
            "stop": search.stop,
            "reinstated": list(search.reinstated),
            "unverified": list(search.unverified),
        },
        "decision": {"step": decision.step, "rule": decision.rule, "fallback": decision.fallback},
    }


@method("falat")
def _create_falat(label: str, options: Mapping[str, Any]) -> Falat:
    return Falat(label, FalatOptions.from_mapping(options))
