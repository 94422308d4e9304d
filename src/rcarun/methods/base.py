"""What every method returns, and the rules for judging a model's answer valid.

The protocol scores role and step independently from explicit fields, so a method reports both, whether each is
valid, and the raw answer; it never repairs a field. Validity is strict: a role is one of the recorded agents, a
step is an integer (or digit string, read by `rcarun.data.parse_step`) inside ``[0, n_steps)``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol, TypeGuard, runtime_checkable

from rcarun.data import Record, Trajectory
from rcarun.methods.context import TokenCounter
from rcarun.methods.forward import ForwardModel
from rcarun.methods.llm import LLM

__all__ = [
    "Attribution",
    "CostBound",
    "Method",
    "ModelFor",
    "ModelReadingMethod",
    "Preparation",
    "TrajectorySet",
    "abstention",
    "home_backbone",
    "is_int",
    "role_is_valid",
    "speaker_attribution",
    "step_is_valid",
]


@dataclass(frozen=True, slots=True)
class Attribution:
    """A method's verdict on one trajectory.

    Attributes:
        pred_role: the responsible role as answered (None when the answer had no usable role field).
        pred_step: the 0-based root step as answered, when it was an integer.
        role_valid: ``pred_role`` is one of the recorded agents.
        step_valid: ``pred_step`` is inside the trajectory.
        abstained: the method declined to answer (no prediction at all).
        output: method-specific details kept as ``output_json`` (raw answer, reasons, truncation, ...).
        error: why the model's answer could not be used as an answer, None when it was read: the parse
            error of the decisive reply (``"not JSON: ..."``), ``"the answer is not a JSON object"``, a schema
            violation (a field missing or of the wrong type), a spent tool-call cap. An answer that was read
            but names an out-of-range step or an unknown role is not an error (that is ``role_valid`` /
            ``step_valid``). Stored as ``predictions.error``; the report counts such predictions as invalid.
        fallback: set when a rule of the method's published design, not the model, decided (part of) the
            prediction: a short text naming the rule and how often it fired, e.g. ``"binary search: unclear
            verdict at 3 of 4 halvings, half chosen at random (published rule)"``; None when the model
            decided. Stored as ``predictions.fallback``; docs/methods/<method>.md says what counts.
    """

    pred_role: str | None
    pred_step: int | None
    role_valid: bool
    step_valid: bool
    abstained: bool = False
    output: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    fallback: str | None = None


class CostBound(NamedTuple):
    """The most a method can spend on one trajectory: calls and prompt tokens."""

    calls: int
    prompt_tokens: int


class Method(Protocol):
    """A root-cause attribution method: pure orchestration over the `LLM` it is given.

    Besides ``label`` and ``attribute``, the runner reads four traits. They are declared here with the values a
    method that needs none of them has, so a method class subclasses `Method` and overrides only what it uses:

    - ``shareable_stages``: stages whose requests are identical across the method's conditions (RCTA's summary
      and outline under every ablation). The runner pays for such a request once per trajectory and realization
      and serves the other conditions the same answer, recorded as cached.
    - ``stage_budgets``: the output budget the method's own design gives a stage (RCTA's presets). It wins over a
      sweep's ``[stages.X] max_tokens``, which the runner reports instead of applying.
    - ``backbones``: the backbones a method asks itself (a judge panel). The runner then runs it once per
      trajectory and realization, as an item of the first of them (its home, where its prediction is stored),
      and it reaches the others through ``llm.for_backbone``; each call is recorded and priced under the
      backbone it went to.
    - ``worst_case(trajectory, counter)``: for a method whose answers decide how many calls it makes, the most
      it can spend on that trajectory, which `rcarun estimate` reports as the maximum (dry runs with synthetic
      answers only see typical walks); None when the dry runs' largest walk is the bound.
    - ``reads_model``: the method reads a model's internals through forward passes (`ForwardModel`) instead of
      chatting with it (SOAP). Such a method runs only on a local backbone (``provider = "local"``) and a chat
      method only on the others; it also implements `ModelReadingMethod`, whose ``prepare`` the runner calls
      once per backbone and realization before that realization's items.
    """

    label: str
    shareable_stages: frozenset[str] = frozenset()
    stage_budgets: Mapping[str, int] = MappingProxyType({})
    backbones: tuple[str, ...] = ()
    reads_model: bool = False

    async def attribute(self, trajectory: Trajectory, llm: LLM) -> Attribution: ...

    def worst_case(self, trajectory: Trajectory, counter: TokenCounter) -> CostBound | None:
        return None


ModelFor = Callable[[str, str], ForwardModel]
"""``model_for(qid, stage)``: the model, recording each pass under that trajectory and stage."""


@dataclass(frozen=True, slots=True)
class TrajectorySet:
    """The trajectories of a sweep, as a method that reads a model prepares on them (splits, a reference).

    Attributes:
        ids: every usable trajectory id of the sweep, in the dataset's order.
        sources: the source (subset) of each id, in the same order.
        load: streams the records of the given ids, in the dataset's order (one walk of the dataset per call),
            so a preparation holds only what it keeps of them.
    """

    ids: tuple[str, ...]
    sources: tuple[str, ...]
    load: Callable[[Collection[str]], Iterator[Record]]


@dataclass(frozen=True, slots=True, eq=False)
class Preparation:
    """What a model-reading method made of the sweep's trajectories for one realization.

    Attributes:
        items: the ids this realization answers (SOAP: its test split); the runner makes items of these only,
            so a trajectory the preparation learnt from is never predicted.
        detail: what to store with the run (a ``method_prepared`` event): splits, choices, sizes; plain JSON.
        attribute: answers one trajectory with the model.
    """

    items: tuple[str, ...]
    detail: Mapping[str, Any]
    attribute: Callable[[Trajectory, ForwardModel], Awaitable[Attribution]]


@runtime_checkable
class ModelReadingMethod(Protocol):
    """The side of a method with ``reads_model`` that the runner drives (see `Method`)."""

    label: str
    reads_model: bool

    async def prepare(
        self, trajectories: TrajectorySet, model_for: ModelFor, realization: int
    ) -> Preparation: ...


def role_is_valid(role: object, trajectory: Trajectory) -> bool:
    return isinstance(role, str) and role in trajectory.agents


def is_int(value: object) -> TypeGuard[int]:
    """An integer as JSON means one: ``True`` and ``1.0`` are not step numbers, counts or budgets."""
    return isinstance(value, int) and not isinstance(value, bool)


def step_is_valid(step: object, trajectory: Trajectory) -> bool:
    return is_int(step) and 0 <= step < trajectory.n_steps


def abstention(
    output: Mapping[str, Any], *, error: str | None = None, fallback: str | None = None
) -> Attribution:
    """No prediction: both fields missing, scored as errors for both targets."""
    return Attribution(
        pred_role=None,
        pred_step=None,
        role_valid=False,
        step_valid=False,
        abstained=True,
        output=output,
        error=error,
        fallback=fallback,
    )


def speaker_attribution(
    trajectory: Trajectory,
    step: int,
    output: Mapping[str, Any],
    *,
    error: str | None = None,
    fallback: str | None = None,
) -> Attribution:
    """A chosen step with its speaker as the explicit role, for methods that locate a step but never ask for a
    role (step-by-step, binary search: as the Who&When originals do)."""
    role = trajectory.steps[step].agent
    return Attribution(
        pred_role=role,
        pred_step=step,
        role_valid=role_is_valid(role, trajectory),
        step_valid=step_is_valid(step, trajectory),
        output=output,
        error=error,
        fallback=fallback,
    )


def home_backbone(method: Method) -> str | None:
    """The backbone a method that names its own backbones runs under (the first it names), else None."""
    return method.backbones[0] if method.backbones else None
