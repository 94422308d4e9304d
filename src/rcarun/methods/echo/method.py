"""ECHO: hierarchical context per target, a panel of independent analysts, a confidence-weighted vote.

ECHO (Banerjee et al., 2025) as ``baselines.md`` describes it, under the LongRCA protocol. This module holds the
options, draws the panel, builds the view and sends ``analysts`` calls per trajectory (twice that when
decoupled), whatever the log's length. The specification: ``docs/methods/echo.md``.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from string import Template
from typing import Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, Discriminator, Field, PositiveInt, Tag, model_validator

from rcarun.data import Trajectory
from rcarun.methods._options import MethodOptions, ReasoningOption, TupleOf, as_tuple
from rcarun.methods.base import Attribution, Method, role_is_valid, step_is_valid
from rcarun.methods.context import task_text
from rcarun.methods.echo.answers import AnswerReading, Evaluation, answer_schema, read_answer
from rcarun.methods.echo.context import (
    ContextLine,
    ContextType,
    choose_focal_steps,
    context_lines,
    fit_context,
)
from rcarun.methods.echo.record import call_record, output_record, rules_that_decided, unusable
from rcarun.methods.echo.targets import NeighbourTargets, target_context
from rcarun.methods.echo.vote import Vote, consensus_vote, pair_conclusion
from rcarun.methods.llm import LLM, Message
from rcarun.methods.registry import method

__all__ = ["PERSONAS", "STAGES", "AnalystSpec", "Echo", "EchoOptions", "PanelView", "analyst_panel"]

_Persona = Literal["conservative", "liberal", "detail-focused", "pattern-focused", "skeptical", "general"]
PERSONAS: tuple[str, ...] = get_args(_Persona)
STAGES: tuple[str, ...] = ("analyst",)

_MIN_CONTEXT_CHARS = 2000
_CONTEXT_MARGIN_TOKENS = 512  # chat-template overhead and estimate error, besides the output budget
_CAP_ROUNDS = 8
_SECTION = re.compile(r"\[([a-z-]+)\]")  # a section header of a prompt file: "[name]" alone on its line

_Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
_Unit = Annotated[float, Field(ge=0.0, le=1.0)]


def _focal_kind(value: object) -> str:
    return "strategy" if isinstance(value, str) else "steps"


# ``focal`` is a strategy name or a list of steps: the discriminator picks the branch by the input's type, so an
# error names one branch (``focal.strategy`` or ``focal.steps``), not both.
_FocalOption = Annotated[
    Annotated[Literal["errors", "spread"], Tag("strategy")]
    | Annotated[tuple[int, ...], BeforeValidator(as_tuple), Field(min_length=1), Tag("steps")],
    Discriminator(_focal_kind),
]


class EchoOptions(MethodOptions):
    """ECHO's options (rules and defaults in ``docs/methods/echo.md``).

    Attributes:
        analysts: the panel's size; at most 6 without an explicit ``personas`` list.
        personas: the analysts' personas, one per analyst (repeats allowed); unset: a seeded sample of the six.
        temperatures: one per analyst, in [0, 2]; unset: drawn uniformly from ``temperature_range``.
        temperature_range: [low, high] of the drawn temperatures, 0 <= low <= high <= 2.
        seed: the seed of the panel draw.
        decoupled: each analyst answers twice, agent-focused then step-focused.
        min_confidence: votes below it are dropped; in a multi_agent consensus, the score an agent needs.
        context_type: the cue set that reduces distant steps.
        context: "per-target" (the paper's C_i around each target step, the default), "whole-log" (every step
            in full) or "focal" (one multi-focal view, rcarun's earlier design).
        neighbour_targets: per-target only: a neighbour that is itself a target is repeated in full ("in-full",
            the literal C_i) or named ("referenced", fewer tokens when targets are adjacent).
        focal: focal only: "errors", "spread" or a list of step indices.
        max_focal: focal only: how many focal steps the strategies pick.
        context_chars: the character cap of what the analysts read (lowered to fit a known context window).
        max_tokens: the output budget of each call.
        reasoning: the reasoning effort asked of the backbone (unset: the backbone's own).
        include_task: show the task instruction in every prompt.
        include_ground_truth: show the correct final answer of the task.
    """

    method_name = "echo"

    analysts: PositiveInt = 3
    personas: TupleOf[_Persona] | None = None
    temperatures: TupleOf[_Temperature] | None = None
    temperature_range: Annotated[tuple[_Temperature, _Temperature], BeforeValidator(as_tuple)] = (0.3, 0.9)
    seed: int = 2026
    decoupled: bool = False
    min_confidence: _Unit = 0.3
    context_type: ContextType = "decision-quality"
    context: Literal["per-target", "whole-log", "focal"] = "per-target"
    neighbour_targets: NeighbourTargets = "in-full"
    focal: _FocalOption = "errors"
    max_focal: PositiveInt = 5
    context_chars: Annotated[int, Field(ge=_MIN_CONTEXT_CHARS)] = 100_000
    max_tokens: PositiveInt = 8000
    reasoning: ReasoningOption = None
    include_task: bool = True
    include_ground_truth: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> EchoOptions:
        """Rules across options; an option the chosen context would ignore is refused, like an unknown key."""
        n = self.analysts
        if self.personas is None and n > len(PERSONAS):
            raise ValueError(
                f"analysts > {len(PERSONAS)} needs an explicit personas list (a sample has no repeats)"
            )
        if self.personas is not None and len(self.personas) != n:
            raise ValueError(f"personas lists {len(self.personas)} names for {n} analysts")
        if self.temperatures is not None and len(self.temperatures) != n:
            raise ValueError(f"temperatures lists {len(self.temperatures)} values for {n} analysts")
        low, high = self.temperature_range
        if low > high:
            raise ValueError(f"temperature_range [{low}, {high}] must be [low, high] with low <= high")
        given = self.model_fields_set
        if self.context != "focal" and given & {"focal", "max_focal"}:
            raise ValueError("focal and max_focal apply only to context='focal'")
        if self.context != "per-target" and "neighbour_targets" in given:
            raise ValueError("neighbour_targets applies only to context='per-target'")
        return self


@dataclass(frozen=True, slots=True)
class AnalystSpec:
    """One member of the panel."""

    persona: str
    temperature: float


@dataclass(frozen=True, slots=True)
class PanelView:
    """What every analyst of the panel reads.

    Attributes:
        text: the context, shown between the prompt's log markers.
        explanation: what the prompt says of it.
        record: what ``output["context"]`` records of it.
    """

    text: str
    explanation: str
    record: dict[str, Any]


_ViewBuilder = Callable[[int], PanelView]
"""The panel's view for a character cap."""


def analyst_panel(options: EchoOptions) -> tuple[AnalystSpec, ...]:
    """The analysts' personas and temperatures: configured, or drawn from ``random.Random(options.seed)``."""
    rng = random.Random(options.seed)
    personas = (
        list(options.personas) if options.personas is not None else rng.sample(PERSONAS, options.analysts)
    )
    if options.temperatures is not None:
        temperatures = [float(t) for t in options.temperatures]
    else:
        low, high = options.temperature_range
        temperatures = [round(rng.uniform(low, high), 2) for _ in personas]
    return tuple(AnalystSpec(p, t) for p, t in zip(personas, temperatures, strict=True))


def _prompt_text(name: str) -> str:
    return resources.files("rcarun.methods").joinpath("prompts", name).read_text(encoding="utf-8")


def _named_lines(name: str) -> dict[str, str]:
    """``name: text`` lines of a prompt file (blank lines and ``#`` comments skipped)."""
    entries = {}
    for line in _prompt_text(name).splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, text = line.partition(":")
            entries[key.strip()] = text.strip()
    return entries


def _sections(name: str) -> dict[str, str]:
    """The sections of a prompt file, each under a ``[name]`` line (``#`` comment lines skipped), stripped."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in _prompt_text(name).splitlines():
        if line.startswith("#"):
            continue
        header = _SECTION.fullmatch(line.rstrip())
        if header:
            current = sections.setdefault(header.group(1), [])
        elif current is not None:
            current.append(line)
    return {key: "\n".join(lines).strip() for key, lines in sections.items()}


class Echo(Method):
    """Hierarchical context per target → k (or 2k) analyst calls per view → a confidence-weighted vote."""

    def __init__(self, label: str, options: EchoOptions) -> None:
        self.label = label
        self.options = options
        self.panel = analyst_panel(options)
        self._system = Template(_prompt_text("echo_system.txt").strip())
        self._user = Template(_prompt_text("echo_user.txt"))
        self._personas = _named_lines("echo_personas.txt")
        self._focus = _named_lines("echo_focus.txt")
        self._views = {key: Template(text) for key, text in _sections("echo_views.txt").items()}
        missing = (
            [p for p in PERSONAS if p not in self._personas]
            + [f for f in ("joint", "agent", "step") if f not in self._focus]
            + [v for v in ("per-target", "whole-log", "focal") if v not in self._views]
        )
        if missing:
            raise RuntimeError(f"echo prompt files lack {missing}")

    @property
    def focuses(self) -> tuple[str, ...]:
        """The calls each analyst makes on each view, in order."""
        return ("agent", "step") if self.options.decoupled else ("joint",)

    def system_prompt(self, spec: AnalystSpec) -> str:
        return self._system.substitute(persona=self._personas[spec.persona])

    def user_prompt(self, trajectory: Trajectory, view: PanelView, focus: str) -> str:
        ground_truth = ""
        if self.options.include_ground_truth:
            ground_truth = (
                f"\nThe correct final answer to the task: {trajectory.ground_truth or '(not recorded)'}\n"
            )
        return self._user.substitute(
            task=task_text(trajectory, include=self.options.include_task),
            ground_truth=ground_truth,
            agents=", ".join(trajectory.agents),
            view=view.explanation,
            log=view.text,
            focus=self._focus[focus],
            schema=json.dumps(answer_schema(trajectory), ensure_ascii=False),
        )

    def build_view(self, trajectory: Trajectory, llm: LLM) -> PanelView:
        """What the analysts read, fitted to ``context_chars`` and to ``llm``'s context window when known."""
        builders = {
            "per-target": self._per_target_builder,
            "whole-log": self._whole_log_builder,
            "focal": self._focal_builder,
        }
        build = builders[self.options.context](trajectory)
        cap = self.options.context_chars
        view = build(cap)
        window = llm.context_window
        if window is not None:
            system = max((self.system_prompt(spec) for spec in self.panel), key=len)
            focus = max(self.focuses, key=lambda name: len(self._focus[name]))
            allowed = window - self.options.max_tokens - _CONTEXT_MARGIN_TOKENS - llm.estimate_tokens(system)
            # Each round shrinks the cap in proportion to the overshoot, a little more to absorb estimate error.
            for _ in range(_CAP_ROUNDS):
                needed = llm.estimate_tokens(self.user_prompt(trajectory, view, focus))
                if needed <= allowed or cap <= _MIN_CONTEXT_CHARS:
                    break
                cap = max(_MIN_CONTEXT_CHARS, min(cap - 1, int(cap * max(allowed, 0) / needed * 0.95)))
                view = build(cap)
            view.record["context_window"] = window
        return view

    def _per_target_builder(self, trajectory: Trajectory) -> _ViewBuilder:
        def build(cap: int) -> PanelView:
            context = target_context(
                trajectory, self.options.context_type, cap, neighbour_targets=self.options.neighbour_targets
            )
            if context.every_step:
                targets = "every step is a target"
            else:
                listed = ", ".join(str(step) for step in context.targets)
                targets = f"{len(context.targets)} evenly spaced target steps: {listed}"
            explanation = self._views["per-target"].substitute(n_steps=trajectory.n_steps, targets=targets)
            record = {
                "mode": "per-target",
                "context_type": self.options.context_type,
                "neighbour_targets": self.options.neighbour_targets,
                "char_cap": cap,
                "targets": list(context.targets),
                "every_step_a_target": context.every_step,
                "chars": len(context.text),
                "fits": context.fits,
                "full_char_cap": context.full_char_cap,
                "omitted_steps": len(context.omitted),
                "cue_fallbacks": context.cue_fallbacks,
            }
            return PanelView(context.text, explanation, record)

        return build

    def _whole_log_builder(self, trajectory: Trajectory) -> _ViewBuilder:
        every = tuple(range(trajectory.n_steps))
        lines = context_lines(trajectory, every, self.options.context_type)  # every step at level 1
        explanation = self._views["whole-log"].substitute(n_steps=trajectory.n_steps)

        def build(cap: int) -> PanelView:
            view = fit_context(lines, cap, target_tag=None)
            record = {
                "mode": "whole-log",
                "char_cap": cap,
                "chars": len(view.text),
                "fits": view.fits,
                "full_char_cap": view.full_char_cap,
            }
            return PanelView(view.text, explanation, record)

        return build

    def _focal_builder(self, trajectory: Trajectory) -> _ViewBuilder:
        focal = choose_focal_steps(trajectory, self.options.focal, self.options.max_focal)
        lines: tuple[ContextLine, ...] = context_lines(trajectory, focal, self.options.context_type)
        explanation = self._views["focal"].substitute(
            n_steps=trajectory.n_steps, focal=", ".join(str(index) for index in focal)
        )

        def build(cap: int) -> PanelView:
            view = fit_context(lines, cap)
            record = {
                "mode": "focal",
                "context_type": self.options.context_type,
                "focal_steps": list(focal),
                "char_cap": cap,
                "chars": len(view.text),
                "fits": view.fits,
                "full_char_cap": view.full_char_cap,
                "omitted_steps": len(view.omitted),
                "levels": {
                    str(level): sum(1 for line in lines if line.level == level) for level in (1, 2, 3, 4)
                },
                "cue_fallbacks": sum(1 for line in lines if not line.cue_matched),
            }
            return PanelView(view.text, explanation, record)

        return build

    async def attribute(self, trajectory: Trajectory, llm: LLM) -> Attribution:
        if trajectory.n_steps == 0:
            return Attribution(
                None, None, False, False, abstained=True, output={"abstain_reason": "empty log"}
            )
        view = self.build_view(trajectory, llm)
        schema = answer_schema(trajectory)
        calls: list[dict[str, Any]] = []
        votes: list[Vote] = []
        evaluations: list[Evaluation] = []
        alternatives: list[tuple[int, Mapping[str, Any]]] = []
        # In panel order, agent-focused before step-focused.
        for analyst, spec in enumerate(self.panel):
            readings: list[AnswerReading] = []
            for focus in self.focuses:
                messages = [
                    Message("system", self.system_prompt(spec)),
                    Message("user", self.user_prompt(trajectory, view, focus)),
                ]
                reply = await llm.chat(
                    messages,
                    stage="analyst",
                    max_tokens=self.options.max_tokens,
                    schema=schema,
                    temperature=spec.temperature,
                    reasoning=self.options.reasoning,
                )
                reading = read_answer(reply.parsed, trajectory.agents, trajectory.n_steps)
                readings.append(reading)
                evaluations.extend(reading.evaluations)
                alternatives.extend((analyst, a) for a in reading.alternatives)
                calls.append(call_record(analyst, spec, focus, reply, reading))
            first, last = readings[0].conclusion, readings[-1].conclusion
            if first is not None and last is not None:
                # Decoupled: the agent-focused call came first, the step-focused one last.
                conclusion = first if len(readings) == 1 else pair_conclusion(first, last)
                votes.append(Vote(analyst, conclusion))

        outcome = consensus_vote(
            votes,
            evaluations,
            agents=trajectory.agents,
            n_steps=trajectory.n_steps,
            min_confidence=self.options.min_confidence,
        )
        output = output_record(
            self.panel,
            decoupled=self.options.decoupled,
            min_confidence=self.options.min_confidence,
            context_info=view.record,
            calls=calls,
            votes=votes,
            outcome=outcome,
            alternatives=alternatives,
        )
        role, step = outcome.role, outcome.mistake_step
        return Attribution(
            pred_role=role,
            pred_step=step,
            role_valid=role_is_valid(role, trajectory),
            step_valid=step_is_valid(step, trajectory),
            abstained=role is None and step is None,
            output=output,
            error=unusable(calls, evaluations),
            fallback=rules_that_decided(
                outcome,
                len(votes),
                len(self.panel),
                trajectory.n_steps,
                min_confidence=self.options.min_confidence,
            ),
        )


@method("echo")
def _create_echo(label: str, options: Mapping[str, Any]) -> Echo:
    return Echo(label, EchoOptions.from_mapping(options))
