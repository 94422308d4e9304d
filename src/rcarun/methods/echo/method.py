"""ECHO: hierarchical context per target, a panel of independent analysts, a confidence-weighted vote.

ECHO (Banerjee et al., 2025) replaces the single judge of the Who&When baselines with three parts, implemented as
described in the baseline notes (``baselines.md``, "ECHO") under the LongRCA protocol (paper Sec. 5.1): every
analyst answers a JSON object whose schema carries the recorded agents as an enum and the step range as integer
bounds; the final answer has an explicit responsible role and a 0-based root step, scored independently; no
ground-truth final answer is shown unless ``include_ground_truth=True``; invalid fields are stored as invalid and
never repaired. Each part is a module tested on its own: `rcarun.methods.echo.context` (the hierarchical context
and the target windows, no LLM), `rcarun.methods.echo.answers` (the answer schema and its strict reading),
`rcarun.methods.echo.vote` (the consensus vote, the decoupled pairing and the fallback). This module draws the
panel, sends the calls and writes the output.

1. **Hierarchical context, per target** (``context="per-target"``, the default). The paper builds the context
   per target step i: L1 = i and i±1 in full, L2 = i±2..3 reduced to a key-decision sentence (≤50 words), L3 =
   i±4..6 reduced to an outcome (≤20 words), L4 = the rest reduced to milestones (≤15 words), by regex cue
   extraction (`rcarun.methods.echo.context`). Here every step of the log is a target exactly once. The log is
   tiled into windows of consecutive targets, and a window's view shows every step at the level of its distance
   to the nearest target of the window: the union of the targets' C_i, so the window and its two neighbours are
   in full. Windows are chosen greedily from step 0, each the longest whose view fits the character cap with
   nothing cut and no line left out; a single target whose view does not fit even so is a window of its own,
   fitted to the cap. So a log that fits the cap whole is ONE window whose view is the whole log in full (every
   step is a target of its own C_i, nothing needs compressing), and ECHO then costs ``analysts`` calls, as
   published. When the greedy tiling would need more than ``max_views`` (8) windows, the log is cut instead into
   ``max_views`` windows of equal target counts, and each view is fitted to the cap.
   Why: the paper's context is per target (C_i); an audit (issue 16, deviation #9) rejected the earlier single
   view, centred on the steps a regex of rcarun's took for errors, because it let rcarun's own design decide
   what every analyst reads. Per-target windows make every step a target exactly once (shown in full unless its
   view must be cut to fit), and leave to the analysts which steps matter.
2. **Analysts.** ``analysts`` independent calls per view (stage ``"analyst"``), each with one of the six personas
   (conservative, liberal, detail-focused, pattern-focused, skeptical, general) and its own temperature. An
   analyst judges the whole run from the view it is given: its mistake_step may be any step of the log.
3. **Consensus voting** (`rcarun.methods.echo.vote.consensus_vote`, the published vote) over every
   (analyst, view) well-formed conclusion: each is one vote, and the votes of all views enter one tally.

``context="focal"`` is rcarun's own earlier design, kept as an option: ONE multi-focal view of the whole log,
every step at the level of its distance to the NEAREST of a few focal steps (``focal``, ``max_focal``; both
apply only to this mode, and setting them with ``context="per-target"`` is refused rather than ignored, as is
``max_views`` with ``context="focal"``). ``focal="errors"`` (its default strategy) = the earliest
``max_focal`` steps whose content carries an error/warning cue, topped up with evenly spaced steps when fewer
match; ``"spread"`` = ``max_focal`` evenly spaced steps; or a list of step indices (``[1]`` reproduces FA4MAS's
example view; indices outside the log are ignored, and ``"spread"`` is used when none remains). FA4MAS itself
sends the raw step list plus that one example view, cut at 12k characters; on LongRCA logs (hundreds of steps,
23k-130k tokens) such a cut would show only the first few dozen steps.

Choices where the notes are silent (each is documented here and, where cheap, an option):

- **The task, whole, beside every view.** Every analyst prompt states the task instruction in full (up to
  `rcarun.methods.context.TASK_CHAR_CAP`, `task_text`): the record's ``question``, or on LongRCA records, which
  have none, the instruction the loader derived from the opening step(s) of the history
  (`rcarun.data.derive_task`). The view is unchanged: the task step stays step 0 at the level its distance gives
  it (an L4 milestone of 15 words in a view whose targets are far from it).
- **What a prompt says of its view.** With one window, that the log is shown whole; with several, which steps
  are the view's targets (in full with their immediate neighbours), that it is view j of W and that the other
  views show the other parts of the log in full (prompt file ``echo_views.txt``).
- **Character cap** (``context_chars=100_000``, about 25k tokens, instead of FA4MAS's 12k, for the reason above),
  the same for every view. A view that must shrink is shrunk in the fixed order of `fit_context`: L1 contents cut
  in the middle to the largest common cap (not below 1,000 characters), then reduced lines left out (L4 without
  a cue first, farthest first); L1 lines are never left out. When the backbone's context window is known and
  the longest analyst prompt would not fit beside ``max_tokens``, the cap is lowered in proportion to the
  overshoot (a little more, to absorb estimate error) and the windows are planned again with it, at most 8
  rounds, not below 2,000 characters; a lower cap means smaller, and so more, windows. What was applied is
  recorded in ``output["context"]``.
- **Panel.** ``personas`` unset: a seeded sample of ``analysts`` of the six (``random.Random(seed).sample``,
  ``seed=2026`` as FA4MAS), so at most 6 analysts; set: exactly ``analysts`` names (repeats allowed).
  ``temperatures`` unset: uniform in ``temperature_range`` (0.3, 0.9) from the same generator after the persona
  draw, rounded to 2 decimals. The panel is drawn once per method instance, so every trajectory and every view
  meets the same analysts (resume-safe and independent of processing order). With the default options it is
  conservative@0.83, detail-focused@0.84, general@0.67.
- **Decoupled mode** (``decoupled=True``): on each view each analyst runs twice with the same persona and
  temperature, once agent-focused and once step-focused, with the same answer schema. Its vote on that view takes
  type and attribution from the agent-focused answer and mistake_step from the step-focused answer, with weight
  min(agent_conf, step_conf); when either half is malformed the analyst casts no vote on that view.
- **Calls are sent one after another**, window by window, in panel order inside a window (agent-focused before
  step-focused): they are independent (no analyst sees another's answer), the order is deterministic, and the
  runner's concurrency is across trajectories. A call that raises (fatal call error, spent budget) fails the item
  as the runner decides.
- **Malformed answers** are recorded with their problems and cast no vote (`rcarun.methods.echo.answers`); their
  valid agent evaluations still count for the fallback. The evaluations of every call, in every view, pool into
  the fallback.
- **Vote** and **fallback** as published (`rcarun.methods.echo.vote`): conclusions below ``min_confidence``
  (0.3) dropped, the heaviest type wins, summed confidences rank agents and steps; ties: types to single_agent,
  agents by recorded order, steps earliest. The final answer is the first attributed agent and the chosen step.
  Fallback when no vote survives: the agent with the highest mean error likelihood, and its most likely step.
- ``max_tokens=8000`` per call (the attribution budget of the other baselines; the answer is longer than theirs).

Unreadable answers and fallbacks (``Attribution.error`` / ``fallback``), keeping the output's own ``fallback``
record as it is:

- ``error``: no analyst answer could be used at all (every call malformed: not a JSON object, or a conclusion
  that breaks the schema) and no valid agent evaluation either, so the method abstains on no answer of the
  model. It counts the malformed calls and gives the first one's parse error or problems. Some calls being
  malformed is not an error: the other votes decide.
- ``fallback``: a rule of the design, not the analysts' votes, decided the answer: the mean-likelihood
  fallback (no vote survived; the text says how many of the possible votes were lost to malformed answers and
  how many fell below ``min_confidence``); an abstention because every well-formed vote fell below
  ``min_confidence`` and no evaluation was valid; or a tie rule that decided the final answer (tied conclusion
  types go to single_agent, tied top agents to recorded order, tied top steps to the earliest).

Output (``Attribution.output``): ``panel``; ``context`` (the mode, the cap, and per-target the tiling and every
window: targets first/last, characters, whether it fits, the L1 cap applied, the number of steps left out;
``focal``: the focal steps and what was cut); ``calls`` (one per call: window, persona, temperature, focus, the
parsed answer or the raw text with its parse error, problems, skipped evaluations); ``vote_table`` (every vote
with its window and kept flag, the (analyst, window) pairs that cast no vote, type sums, the winning type, ranked
agent and step scores); ``consensus`` (type, attribution, mistake_step, confidence and a reasoning synthesised
from the winning votes without a model call; None when no vote was kept); ``agent_mean_likelihood``; up to 5
``alternative_hypotheses`` by confidence (reported, never voted); ``disagreement``; ``fallback``;
``n_analysts``, ``n_views`` and ``n_calls``.

Cost: ``analysts × windows`` calls per trajectory (3 × windows by default), ``× 2`` in decoupled mode; exactly
``analysts`` (``2 × analysts``) whenever the log fits ``context_chars``, and at most ``analysts × max_views``
(× 2). With ``context="focal"``: ``analysts`` (× 2). No per-step calls.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from string import Template
from typing import Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, Discriminator, Field, PositiveInt, Tag, model_validator

from rcarun.data import Trajectory
from rcarun.methods._options import MethodOptions, ReasoningOption, TupleOf, as_tuple, parse_options
from rcarun.methods.base import Attribution, Method, role_is_valid, step_is_valid
from rcarun.methods.context import task_text
from rcarun.methods.echo.answers import AnswerReading, Evaluation, answer_schema, is_unit, read_answer
from rcarun.methods.echo.context import (
    ContextLine,
    ContextType,
    ContextView,
    StepLevels,
    choose_focal_steps,
    context_lines,
    fit_context,
    target_windows,
)
from rcarun.methods.echo.vote import Vote, VoteOutcome, consensus_vote, pair_conclusion, score_key
from rcarun.methods.llm import LLM, Message
from rcarun.methods.registry import method

__all__ = ["PERSONAS", "STAGES", "AnalystSpec", "Echo", "EchoOptions", "PanelView", "analyst_panel"]

_Persona = Literal["conservative", "liberal", "detail-focused", "pattern-focused", "skeptical", "general"]
PERSONAS: tuple[str, ...] = get_args(_Persona)
STAGES: tuple[str, ...] = ("analyst",)

_MIN_CONTEXT_CHARS = 2000
_MAX_ALTERNATIVES = 5
_CONTEXT_MARGIN_TOKENS = 512  # chat-template overhead and estimate error, besides the output budget
_CAP_ROUNDS = 8
_TARGET_TAG = "target"
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
    """ECHO's options (rules and defaults in the module docstring).

    Attributes:
        analysts: the panel's size; at most 6 without an explicit ``personas`` list.
        personas: the analysts' personas, one per analyst (repeats allowed); unset: a seeded sample of the six.
        temperatures: one per analyst, in [0, 2]; unset: drawn uniformly from ``temperature_range``.
        temperature_range: [low, high] of the drawn temperatures, 0 <= low <= high <= 2.
        seed: the seed of the panel draw.
        decoupled: each analyst answers twice per view, agent-focused then step-focused.
        min_confidence: votes below it are dropped; in a multi_agent consensus, the score an agent needs.
        context_type: the cue set that reduces distant steps.
        context: "per-target" (the paper's context per target step, tiled into windows) or "focal" (one
            multi-focal view, rcarun's own design).
        max_views: per-target only: the most windows; a longer tiling becomes this many equal windows.
        focal: focal only: "errors", "spread" or a list of step indices.
        max_focal: focal only: how many focal steps the strategies pick.
        context_chars: the character cap of a view (lowered to fit a known context window).
        max_tokens: the output budget of each call.
        reasoning: the reasoning effort asked of the backbone (unset: the backbone's own).
        include_task: show the task instruction in every prompt.
        include_ground_truth: show the correct final answer of the task.
    """

    analysts: PositiveInt = 3
    personas: TupleOf[_Persona] | None = None
    temperatures: TupleOf[_Temperature] | None = None
    temperature_range: Annotated[tuple[_Temperature, _Temperature], BeforeValidator(as_tuple)] = (0.3, 0.9)
    seed: int = 2026
    decoupled: bool = False
    min_confidence: _Unit = 0.3
    context_type: ContextType = "decision-quality"
    context: Literal["per-target", "focal"] = "per-target"
    max_views: PositiveInt = 8
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
        if self.context == "per-target" and given & {"focal", "max_focal"}:
            raise ValueError("focal and max_focal apply only to context='focal'")
        if self.context == "focal" and "max_views" in given:
            raise ValueError("max_views applies only to context='per-target'")
        return self

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> EchoOptions:
        return parse_options("echo", cls, options)


@dataclass(frozen=True, slots=True)
class AnalystSpec:
    """One member of the panel."""

    persona: str
    temperature: float


@dataclass(frozen=True, slots=True)
class PanelView:
    """One view every analyst answers on.

    Attributes:
        index: the view's place, from 0 (the ``window`` of calls and votes).
        targets: the steps it is built around: the window's targets, or the focal steps.
        view: the rendered view and what was done to fit it.
        explanation: what the prompt says of the view.
        record: what ``output["context"]`` records of it.
    """

    index: int
    targets: tuple[int, ...]
    view: ContextView
    explanation: str
    record: Mapping[str, Any]


_ViewBuilder = Callable[[int], tuple[tuple[PanelView, ...], dict[str, Any]]]
"""The views for a character cap, and what ``output["context"]`` records of them."""


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
            + [v for v in ("whole", "part", "focal") if v not in self._views]
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
            log=view.view.text,
            focus=self._focus[focus],
            schema=json.dumps(answer_schema(trajectory), ensure_ascii=False),
        )

    def build_views(self, trajectory: Trajectory, llm: LLM) -> tuple[tuple[PanelView, ...], dict[str, Any]]:
        """The views the panel answers on, fitted to ``context_chars`` and to ``llm``'s context window when known,
        with what ``output["context"]`` records of them."""
        if self.options.context == "per-target":
            build = self._per_target_builder(trajectory)
        else:
            build = self._focal_builder(trajectory)
        cap = self.options.context_chars
        views, info = build(cap)
        window = llm.context_window
        if window is not None:
            system = max((self.system_prompt(spec) for spec in self.panel), key=len)
            focus = max(self.focuses, key=lambda name: len(self._focus[name]))
            allowed = window - self.options.max_tokens - _CONTEXT_MARGIN_TOKENS - llm.estimate_tokens(system)
            # Each round shrinks the cap in proportion to the largest overshoot, a little more to absorb estimate
            # error, and builds the views again (per target: planned again, so a lower cap gives more windows).
            for _ in range(_CAP_ROUNDS):
                needed = max(llm.estimate_tokens(self.user_prompt(trajectory, view, focus)) for view in views)
                if needed <= allowed or cap <= _MIN_CONTEXT_CHARS:
                    break
                cap = max(_MIN_CONTEXT_CHARS, min(cap - 1, int(cap * max(allowed, 0) / needed * 0.95)))
                views, info = build(cap)
            info["context_window"] = window
        return views, info

    def _per_target_builder(self, trajectory: Trajectory) -> _ViewBuilder:
        """Builds the target windows' views for a cap; the steps are reduced once, whatever the cap."""
        levels = StepLevels(trajectory, self.options.context_type, target_tag=_TARGET_TAG)

        def build(cap: int) -> tuple[tuple[PanelView, ...], dict[str, Any]]:
            plan, windows = target_windows(levels, cap, self.options.max_views)
            views = []
            for index, window in enumerate(windows):
                if len(windows) == 1:
                    explanation = self._views["whole"].substitute(n_steps=trajectory.n_steps)
                else:
                    explanation = self._views["part"].substitute(
                        n_steps=trajectory.n_steps,
                        n_views=len(windows),
                        view=index + 1,
                        first=window.first,
                        last=window.last,
                    )
                record = {
                    "window": index,
                    "first": window.first,
                    "last": window.last,
                    "chars": len(window.view.text),
                    "fits": window.view.fits,
                    "whole": window.view.whole,
                    "full_char_cap": window.view.full_char_cap,
                    "omitted_steps": len(window.view.omitted),
                    "levels": {str(level): count for level, count in window.levels.items()},
                    "cue_fallbacks": window.cue_fallbacks,
                }
                views.append(PanelView(index, tuple(window.targets), window.view, explanation, record))
            info: dict[str, Any] = {
                "mode": "per-target",
                "context_type": self.options.context_type,
                "char_cap": cap,
                "max_views": self.options.max_views,
                "tiling": plan.tiling,
                "windows": [view.record for view in views],
            }
            return tuple(views), info

        return build

    def _focal_builder(self, trajectory: Trajectory) -> _ViewBuilder:
        """Builds the single multi-focal view for a cap."""
        focal = choose_focal_steps(trajectory, self.options.focal, self.options.max_focal)
        lines: tuple[ContextLine, ...] = context_lines(trajectory, focal, self.options.context_type)
        explanation = self._views["focal"].substitute(
            n_steps=trajectory.n_steps, focal=", ".join(str(index) for index in focal)
        )

        def build(cap: int) -> tuple[tuple[PanelView, ...], dict[str, Any]]:
            view = fit_context(lines, cap)
            info = {
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
            return (PanelView(0, focal, view, explanation, info),), info

        return build

    async def attribute(self, trajectory: Trajectory, llm: LLM) -> Attribution:
        if trajectory.n_steps == 0:
            return Attribution(
                None, None, False, False, abstained=True, output={"abstain_reason": "empty log"}
            )
        views, context_info = self.build_views(trajectory, llm)
        schema = answer_schema(trajectory)
        calls: list[dict[str, Any]] = []
        votes: list[Vote] = []
        evaluations: list[Evaluation] = []
        alternatives: list[tuple[int, int, Mapping[str, Any]]] = []
        # Window by window, in panel order inside a window, agent-focused before step-focused.
        for view in views:
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
                    alternatives.extend((analyst, view.index, a) for a in reading.alternatives)
                    record: dict[str, Any] = {
                        "window": view.index,
                        "analyst": analyst,
                        "persona": spec.persona,
                        "temperature": spec.temperature,
                        "focus": focus,
                        "answer": reply.parsed if isinstance(reply.parsed, dict) else None,
                        "finish_reason": reply.finish_reason,
                        "well_formed": reading.conclusion is not None,
                        "problems": list(reading.problems),
                        "skipped_evaluations": list(reading.skipped),
                    }
                    if not isinstance(reply.parsed, dict):
                        record["parse_error"] = reply.parse_error or "the answer is not a JSON object"
                        record["raw_text"] = reply.text[:2000]
                    calls.append(record)
                first, last = readings[0].conclusion, readings[-1].conclusion
                if first is not None and last is not None:
                    # Decoupled: the agent-focused call came first, the step-focused one last.
                    conclusion = first if len(readings) == 1 else pair_conclusion(first, last)
                    votes.append(Vote(analyst, conclusion, view.index))

        outcome = consensus_vote(
            votes,
            evaluations,
            agents=trajectory.agents,
            n_steps=trajectory.n_steps,
            min_confidence=self.options.min_confidence,
        )
        possible = len(self.panel) * len(views)
        output = self._output(context_info, len(views), calls, votes, outcome, alternatives)
        role, step = outcome.role, outcome.mistake_step
        return Attribution(
            pred_role=role,
            pred_step=step,
            role_valid=role_is_valid(role, trajectory),
            step_valid=step_is_valid(step, trajectory),
            abstained=role is None and step is None,
            output=output,
            error=_unusable(calls, evaluations),
            fallback=self._rules_that_decided(outcome, len(votes), possible, trajectory.n_steps),
        )

    def _rules_that_decided(
        self, outcome: VoteOutcome, n_votes: int, possible: int, n_steps: int
    ) -> str | None:
        """The design's rules that decided the answer instead of the votes (module docstring), or None.

        ``possible`` is the number of votes the panel could cast (analysts × views).
        """
        malformed = possible - n_votes
        low, floor = len(outcome.dropped), self.options.min_confidence
        if outcome.fallback_used:
            return (
                f"echo: no vote kept ({malformed} of {possible} votes lost to malformed answers, {low} below "
                f"min_confidence {floor}); agent with the highest mean error likelihood and its most likely "
                "step chosen (published fallback)"
            )
        if outcome.winning_type is None:
            if low:
                return (
                    f"echo: all {low} well-formed votes below min_confidence {floor} and no valid agent "
                    "evaluation: abstains (published rule)"
                )
            return None
        ties = []
        sums = [score_key(value) for value in outcome.type_sums.values()]
        if len(sums) > 1 and sums.count(max(sums)) > 1:
            ties.append("conclusion types tied, single_agent taken")
        scores = [score_key(score) for _, score in outcome.agent_scores]
        if len(scores) > 1 and scores[0] == scores[1]:
            ties.append("top agents tied, first in recorded order taken")
        steps = [score_key(score) for step, score in outcome.step_scores if 0 <= step < n_steps]
        if len(steps) > 1 and steps[0] == steps[1]:
            ties.append("top steps tied, earliest taken")
        return f"echo: {'; '.join(ties)} (published tie rules)" if ties else None

    def _output(
        self,
        context_info: Mapping[str, Any],
        n_views: int,
        calls: Sequence[Mapping[str, Any]],
        votes: Sequence[Vote],
        outcome: VoteOutcome,
        alternatives: Sequence[tuple[int, int, Mapping[str, Any]]],
    ) -> dict[str, Any]:
        personas = {analyst: spec.persona for analyst, spec in enumerate(self.panel)}
        kept = set(outcome.kept)
        consensus: dict[str, Any] | None = None
        if outcome.winning_type is not None:
            winners = [
                vote
                for at, vote in enumerate(votes)
                if at in kept and vote.conclusion.type == outcome.winning_type
            ]
            consensus = {
                "type": outcome.winning_type,
                "attribution": list(outcome.attribution),
                "mistake_step": outcome.mistake_step,
                "confidence": outcome.confidence,
                "reasoning": _synthesis(outcome, winners, personas, len(self.panel) * n_views, n_views),
            }
        ranked_alternatives = sorted(
            alternatives,
            key=lambda item: -(float(item[2]["confidence"]) if is_unit(item[2].get("confidence")) else 0.0),
        )
        voted = {(vote.analyst, vote.window) for vote in votes}
        return {
            "n_analysts": len(self.panel),
            "n_views": n_views,
            "n_calls": len(calls),
            "decoupled": self.options.decoupled,
            "panel": [{"persona": s.persona, "temperature": s.temperature} for s in self.panel],
            "context": dict(context_info),
            "calls": list(calls),
            "vote_table": {
                "min_confidence": self.options.min_confidence,
                "votes": [
                    {
                        "window": v.window,
                        "analyst": v.analyst,
                        "persona": personas[v.analyst],
                        "type": v.conclusion.type,
                        "attribution": list(v.conclusion.attribution),
                        "mistake_step": v.conclusion.mistake_step,
                        "confidence": v.conclusion.confidence,
                        "kept": at in kept,
                    }
                    for at, v in enumerate(votes)
                ],
                "no_vote": [
                    {"window": window, "analyst": analyst}
                    for window in range(n_views)
                    for analyst in range(len(self.panel))
                    if (analyst, window) not in voted
                ],
                "type_sums": dict(outcome.type_sums),
                "winning_type": outcome.winning_type,
                "agent_scores": [{"agent": a, "score": s} for a, s in outcome.agent_scores],
                "step_scores": [{"step": st, "score": s} for st, s in outcome.step_scores],
            },
            "consensus": consensus,
            "agent_mean_likelihood": dict(outcome.agent_mean_likelihood),
            "alternative_hypotheses": [
                {"analyst": analyst, "window": window, **dict(hypothesis)}
                for analyst, window, hypothesis in ranked_alternatives[:_MAX_ALTERNATIVES]
            ],
            "disagreement": {
                "requires_review": outcome.requires_review,
                "reasons": list(outcome.review_reasons),
                "confidence_spread": outcome.confidence_spread,
            },
            "fallback": {
                "used": outcome.fallback_used,
                "agent": outcome.role if outcome.fallback_used else None,
                "step": outcome.mistake_step if outcome.fallback_used else None,
            },
        }


def _unusable(calls: Sequence[Mapping[str, Any]], evaluations: Sequence[Evaluation]) -> str | None:
    """Why no analyst answer could be used, when none could (module docstring), else None."""
    if not calls or evaluations or any(call["well_formed"] for call in calls):
        return None
    first = calls[0]
    reason = first.get("parse_error") or "; ".join(first["problems"][:3]) or "malformed answer"
    return f"no analyst answer could be used ({len(calls)} of {len(calls)} calls malformed); first: {reason}"


def _synthesis(
    outcome: VoteOutcome, winners: Sequence[Vote], personas: Mapping[int, str], possible: int, n_views: int
) -> str:
    """A deterministic account of the consensus, built from the winning votes (no LLM call)."""

    def voter(vote: Vote) -> str:
        return personas[vote.analyst] if n_views == 1 else f"{personas[vote.analyst]} on window {vote.window}"

    names = ", ".join(voter(v) for v in winners)
    agents = ", ".join(f"{agent} ({score:.2f})" for agent, score in outcome.agent_scores)
    steps = ", ".join(f"{step} ({score:.2f})" for step, score in outcome.step_scores)
    lines = [
        f"{outcome.winning_type} conclusion backed by {len(winners)} of {possible} votes ({names}); "
        f"agent scores: {agents}; step scores: {steps}."
    ]
    lines.extend(f"[{voter(v)}] {v.conclusion.reasoning}" for v in winners)
    return "\n".join(lines)


@method("echo")
def _create_echo(label: str, options: Mapping[str, Any]) -> Echo:
    return Echo(label, EchoOptions.from_mapping(options))
