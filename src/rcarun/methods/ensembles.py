"""Self-consistency and the heterogeneous judge panel: several independent answers, one majority vote.

Both run an unchanged base method several times (samples on one backbone, or one judge per backbone) and vote
each field with `rcarun.methods.voting`; paper 003 compares Continual Search against them. Failures, errors and
fallbacks: ``docs/methods/ensembles.md``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import Field, PositiveFloat, model_validator

from rcarun.data import Trajectory
from rcarun.errors import FatalCallError
from rcarun.methods._options import MethodOptions, TupleOf, check_base_method, parse_options
from rcarun.methods.base import Attribution, Method
from rcarun.methods.llm import LLM
from rcarun.methods.proxies import ResampledLLM
from rcarun.methods.registry import create_method, method
from rcarun.methods.voting import TieBreak, Vote, vote

__all__ = ["JudgePanel", "JudgePanelOptions", "SelfConsistency", "SelfConsistencyOptions"]


class SelfConsistencyOptions(MethodOptions):
    """Self-consistency's options table (docs/methods/ensembles.md).

    Attributes:
        base: the single-judge method each draw runs (All-at-once by default).
        base_options: the base method's own options table.
        samples: how many draws vote (at least 2; the paper's 4).
        temperature: the temperature every call of every draw is sent with (above 0: identical draws vote
            nothing).
        tie_break: the rule that decides a tied field (`rcarun.methods.voting`).
    """

    base: str = "all-at-once"
    base_options: dict[str, Any] = Field(default_factory=dict)
    samples: Annotated[int, Field(ge=2)] = 4
    temperature: PositiveFloat = 0.7
    tie_break: TieBreak = "first-voter"

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> SelfConsistencyOptions:
        parsed = parse_options("self-consistency", cls, options)
        _check_base("self-consistency", parsed.base, parsed.base_options)
        return parsed


class JudgePanelOptions(MethodOptions):
    """The judge panel's options table (docs/methods/ensembles.md).

    Attributes:
        judges: the sweep's backbones that each run the base method once, in vote order (at least two, all
            different); the item is stored under the first.
        base: the single-judge method each judge runs (All-at-once by default).
        base_options: the base method's own options table.
        tie_break: the rule that decides a tied field (`rcarun.methods.voting`).
    """

    judges: TupleOf[Annotated[str, Field(min_length=1)]] = ()
    base: str = "all-at-once"
    base_options: dict[str, Any] = Field(default_factory=dict)
    tie_break: TieBreak = "first-voter"

    @model_validator(mode="after")
    def _two_different_judges(self) -> JudgePanelOptions:
        if len(self.judges) < 2 or len(set(self.judges)) != len(self.judges):
            raise ValueError("judges must name at least two different backbones")
        return self

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> JudgePanelOptions:
        parsed = parse_options("judge-panel", cls, options)
        _check_base("judge-panel", parsed.base, parsed.base_options)
        return parsed


def _check_base(name: str, base: str, base_options: Mapping[str, Any]) -> None:
    check_base_method(
        name, base, base_options, excluded=("self-consistency", "judge-panel"), kind="a single-judge method"
    )


async def _run_voters(
    base: Method, trajectory: Trajectory, llms: Sequence[LLM]
) -> list[Attribution | FatalCallError]:
    """The base method on every LLM at once; a voter's fatal call error is its result, anything else raises."""

    async def one(llm: LLM) -> Attribution | FatalCallError:
        try:
            return await base.attribute(trajectory, llm)
        except FatalCallError as error:
            return error

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(llm)) for llm in llms]
    return [task.result() for task in tasks]


def _voter_record(index_name: str, index: int | str, result: Attribution | FatalCallError) -> dict[str, Any]:
    if isinstance(result, FatalCallError):
        return {index_name: index, "error": f"{type(result).__name__}: {result}"[:1000]}
    return {
        index_name: index,
        "pred_role": result.pred_role,
        "pred_step": result.pred_step,
        "role_valid": result.role_valid,
        "step_valid": result.step_valid,
        "abstained": result.abstained,
        "answer_error": result.error,
        "fallback": result.fallback,
        "output": dict(result.output),
    }


def _voted(
    trajectory: Trajectory,
    results: Sequence[Attribution | FatalCallError],
    tie_break: TieBreak,
    output: dict[str, Any],
    voter: str,
) -> Attribution:
    answers = [r for r in results if isinstance(r, Attribution)]
    if not answers:
        first = results[0]
        assert isinstance(first, FatalCallError)
        raise first
    ballot = vote(
        trajectory, [r if isinstance(r, Attribution) else None for r in results], tie_break=tie_break
    )
    output["vote"] = ballot.as_output()
    output["tie_break"] = tie_break
    chosen = ballot.attribution
    return Attribution(
        pred_role=chosen.pred_role,
        pred_step=chosen.pred_step,
        role_valid=chosen.role_valid,
        step_valid=chosen.step_valid,
        abstained=chosen.abstained,
        output=output,
        error=_unreadable(answers, voter),
        fallback=_rules(answers, ballot, tie_break, voter),
    )


def _unreadable(answers: Sequence[Attribution], voter: str) -> str | None:
    """Why the vote rests on no readable answer (every answering voter's answer unreadable), or None."""
    if not answers or any(answer.error is None for answer in answers):
        return None
    n = len(answers)
    return f"no {voter} answer could be read ({n} of {n}); first: {answers[0].error}"


def _rules(answers: Sequence[Attribution], ballot: Vote, tie_break: TieBreak, voter: str) -> str | None:
    """The tie rules that decided a field and the voters decided by a fallback of their own, or None."""
    rules = []
    ties = []
    if ballot.role_tied:
        ties.append(f"role tie broken by first {voter}")
    if ballot.step_tied:
        ties.append(
            f"step tie broken by {'earliest step' if tie_break == 'earliest-step' else f'first {voter}'}"
        )
    if ties:
        rules.append(f"vote: {', '.join(ties)} (tie rule {tie_break!r})")
    decided = [answer.fallback for answer in answers if answer.fallback is not None]
    if decided:
        rules.append(
            f"{len(decided)} of {len(answers)} {voter}s decided in part by a rule, first: {decided[0]}"
        )
    return "; ".join(rules) or None


class SelfConsistency(Method):
    """``samples`` independent draws of the base method on one backbone, majority vote per field."""

    def __init__(self, label: str, options: SelfConsistencyOptions) -> None:
        self.label = label
        self.options = options
        self._base = create_method(options.base, options=options.base_options)

    async def attribute(self, trajectory: Trajectory, llm: LLM) -> Attribution:
        options = self.options
        draws = [ResampledLLM(llm, sample=i, temperature=options.temperature) for i in range(options.samples)]
        results = await _run_voters(self._base, trajectory, draws)
        output: dict[str, Any] = {
            "base": options.base,
            "temperature": options.temperature,
            "samples": [_voter_record("sample", i, r) for i, r in enumerate(results)],
        }
        return _voted(trajectory, results, options.tie_break, output, "sample")


class JudgePanel(Method):
    """The base method once on each judge backbone, majority vote per field in the judges' order."""

    def __init__(self, label: str, options: JudgePanelOptions) -> None:
        self.label = label
        self.options = options
        # The runner reads this: run once per trajectory and realization, under the first judge.
        self.backbones: tuple[str, ...] = options.judges
        self._base = create_method(options.base, options=options.base_options)

    async def attribute(self, trajectory: Trajectory, llm: LLM) -> Attribution:
        options = self.options
        results = await _run_voters(self._base, trajectory, [llm.for_backbone(j) for j in options.judges])
        output: dict[str, Any] = {
            "base": options.base,
            "judges": [_voter_record("judge", j, r) for j, r in zip(options.judges, results, strict=True)],
        }
        return _voted(trajectory, results, options.tie_break, output, "judge")


@method("self-consistency")
def _create_self_consistency(label: str, options: Mapping[str, Any]) -> SelfConsistency:
    return SelfConsistency(label, SelfConsistencyOptions.from_mapping(options))


@method("judge-panel")
def _create_judge_panel(label: str, options: Mapping[str, Any]) -> JudgePanel:
    return JudgePanel(label, JudgePanelOptions.from_mapping(options))
