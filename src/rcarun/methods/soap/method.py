"""SOAP as a method of a sweep (``[[methods]] name = "soap"``): splits, reference and selection owned by the run.

It reads a frozen model (``reads_model``), so it runs on a ``provider = "local"`` backbone; `SoapMethod.prepare`
splits each source, fits and selects, and returns only the test ids as items. The steps:
``docs/methods/soap.md``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from rcarun.data import Trajectory
from rcarun.errors import ConfigError
from rcarun.methods._options import MethodOptions, TupleOf
from rcarun.methods.base import Attribution, Method, ModelFor, Preparation, TrajectorySet
from rcarun.methods.forward import ForwardModel
from rcarun.methods.llm import LLM
from rcarun.methods.registry import method
from rcarun.methods.soap.config import BaseScore, Rescoring, SoapConfig
from rcarun.methods.soap.dependency import AttentionBand, DependentsNorm, attention_band
from rcarun.methods.soap.features import TrajectoryFeatures, extract_features
from rcarun.methods.soap.inputs import Oversize, Sharing
from rcarun.methods.soap.scorer import SoapScorer, fit_soap_reference
from rcarun.methods.soap.selection import (
    DEFAULT_GAMMAS,
    DEFAULT_WINDOWS,
    LabelledFeatures,
    SelectionGrid,
    SoapSplit,
    default_grid,
    select_hyperparameters,
    split_trajectories,
)
from rcarun.methods.soap.spectral import Band, ScoreForm

__all__ = ["REFERENCE_STAGE", "VALIDATION_STAGE", "SoapMethod", "SoapOptions"]

REFERENCE_STAGE = "forward/reference"
VALIDATION_STAGE = "forward/validation"
STAGES = ("forward", REFERENCE_STAGE, VALIDATION_STAGE)

Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


class SoapOptions(MethodOptions):
    """SOAP's options table.

    Attributes:
        seed: split seed of realization 0; realization ``r`` splits with ``seed + r``.
        train_fraction: share of each source's trajectories in the training split (the paper's 30%).
        validation_fraction: share in the labelled validation split (ours: 20%); the rest is the test split.
        reference_fraction: share of the training split whose steps build the reference (1/3 suffices, §4.3).
        context_tokens: the most tokens one pass holds (App. A.2: 8,192), lowered to the model's own if smaller.
        sharing: how passes are shared between target steps (grouped, prefix, none).
        oversize: a segment that cannot fit beside the task: cut in the middle, or error.
        base: the base score: SOAP's spectral, or an alternative of Table 3.
        rescoring: SOAP's attention rescoring, or an alternative of Table 4.
        earliest_k: the k of earliest-of-top-k.
        temporal_strength: the penalty of the temporal rescoring at the last step.
        top: most massive predecessors kept within the window (None: all).
        dependents_norm: how a step's incoming correction is normalised.
        center: centre representations by the reference mean.
        normalize: L2-normalise representations before centring.
        score_form: complement (1 - energy) or reciprocal (1 / energy).
        layer: a fixed representation layer (hidden_states index), skipping its selection.
        band: a fixed spectral band [lo, hi), skipping its selection.
        attention: a fixed attention band (early, middle, late, all), skipping its selection.
        window: a fixed window w (a number of nearest predecessors, or "all"), skipping its selection.
        gamma: a fixed propagation weight γ, skipping its selection.
        layers: the representation layers selection tries (None: every layer, last first).
        top_k: steps kept in a prediction's ranked list.
    """

    method_name = "soap"

    seed: int = 0
    train_fraction: Fraction = 0.3
    validation_fraction: Fraction = 0.2
    reference_fraction: Fraction = 1.0
    context_tokens: PositiveInt = 8192
    sharing: Sharing = "grouped"
    oversize: Oversize = "cut"
    base: BaseScore = "spectral"
    rescoring: Rescoring = "attention"
    earliest_k: PositiveInt = 5
    temporal_strength: Annotated[float, Field(ge=0.0)] = 0.1
    top: PositiveInt | None = None
    dependents_norm: DependentsNorm = "capped"
    center: bool = True
    normalize: bool = False
    score_form: ScoreForm = "complement"
    layer: NonNegativeInt | None = None
    band: TupleOf[NonNegativeInt] | None = None
    attention: AttentionBand | None = None
    window: PositiveInt | Literal["all"] | None = None
    gamma: Annotated[float, Field(ge=0.0)] | None = None
    layers: TupleOf[NonNegativeInt] | None = None
    top_k: PositiveInt = 5

    @model_validator(mode="after")
    def _consistent(self) -> SoapOptions:
        if self.train_fraction + self.validation_fraction > 1.0 + 1e-9:
            raise ValueError(
                f"train_fraction + validation_fraction exceed 1: {self.train_fraction} + {self.validation_fraction}"
            )
        if self.band is not None and (len(self.band) != 2 or self.band[0] >= self.band[1]):
            raise ValueError(f"band must be [lo, hi] with lo < hi, got {list(self.band)}")
        if self.layer is not None and self.layers is not None:
            raise ValueError("give layer (fixed) or layers (tried by selection), not both")
        if self.layers is not None and not self.layers:
            raise ValueError("layers must name at least one layer")
        return self


@dataclass(frozen=True, slots=True)
class _SourcePlan:
    """One source's part of a preparation: its split, the grid that selection searches, and the template."""

    source: str
    split: SoapSplit
    grid: SelectionGrid
    template: SoapConfig
    selects: bool


class SoapMethod(Method):
    """SOAP: spectral scoring with attention-guided propagation over a frozen local model's internals (paper 004).

    Runs on a local backbone only; see docs/methods/soap.md for what a realization's preparation does.
    """

    reads_model = True

    def __init__(self, label: str, options: SoapOptions) -> None:
        self.label = label
        self.options = options

    async def attribute(self, trajectory: Trajectory, llm: LLM) -> Attribution:
        raise ConfigError(
            f"method {self.label!r} reads a model's internals; run it on a backbone with provider = 'local'"
        )

    async def prepare(
        self, trajectories: TrajectorySet, model_for: ModelFor, realization: int
    ) -> Preparation:
        """Split, read, select and fit per source (docs/methods/soap.md); the items are the test splits."""
        options = self.options
        by_source: dict[str, list[str]] = defaultdict(list)
        for qid, source in zip(trajectories.ids, trajectories.sources, strict=True):
            by_source[source].append(qid)
        probe = model_for(trajectories.ids[0], REFERENCE_STAGE)
        plans = {
            source: self._plan(source, ids, realization, probe.n_layers) for source, ids in by_source.items()
        }
        role = {}
        for plan in plans.values():
            role.update(dict.fromkeys(plan.split.reference, REFERENCE_STAGE))
            role.update(dict.fromkeys(plan.split.validation, VALIDATION_STAGE))
        reference: dict[str, list[TrajectoryFeatures]] = defaultdict(list)
        validation: dict[str, list[LabelledFeatures]] = defaultdict(list)
        unlabelled: dict[str, int] = defaultdict(int)
        problems: dict[str, str] = {}
        for record in trajectories.load(role):
            trajectory = record.trajectory
            plan = plans[trajectory.source]
            if plan.source in problems:
                continue
            stage = role[trajectory.qid]
            if stage == VALIDATION_STAGE and not plan.selects:
                continue  # nothing to choose: the validation split is not read
            if stage == VALIDATION_STAGE and (record.reference is None or record.reference.step is None):
                unlabelled[plan.source] += 1
                continue
            try:
                features = await extract_features(
                    model_for(trajectory.qid, stage),
                    trajectory,
                    context_tokens=options.context_tokens,
                    sharing=options.sharing,
                    oversize=options.oversize,
                    layers=plan.grid.layers,
                )
            except ValueError as error:  # a DataError (oversize="error") too: the source cannot be prepared
                problems[plan.source] = f"{trajectory.qid}: {error}"
                continue
            if stage == REFERENCE_STAGE:
                reference[plan.source].append(features)
            else:
                assert record.reference is not None and record.reference.step is not None
                validation[plan.source].append(LabelledFeatures(features, record.reference.step))
        scorers, details = self._fit_sources(plans, reference, validation, unlabelled, problems)

        async def attribute(trajectory: Trajectory, model: ForwardModel) -> Attribution:
            scorer = scorers.get(trajectory.source)
            if not isinstance(scorer, SoapScorer):
                # The options cannot work on this source's trajectories (too few to split, nothing to choose with).
                raise ConfigError(
                    scorer or f"{trajectory.qid}: source {trajectory.source!r} was not prepared"
                )
            return await scorer.attribute(trajectory, model)

        items = tuple(qid for qid in trajectories.ids if role.get(qid) is None and qid not in _unused(plans))
        return Preparation(
            items=items,
            detail={"model": probe.name, "seed": options.seed + realization, "sources": details},
            attribute=attribute,
        )

    def _fit_sources(
        self,
        plans: Mapping[str, _SourcePlan],
        reference: Mapping[str, list[TrajectoryFeatures]],
        validation: Mapping[str, list[LabelledFeatures]],
        unlabelled: Mapping[str, int],
        problems: Mapping[str, str],
    ) -> tuple[dict[str, SoapScorer | str], dict[str, Any]]:
        """Each source's scorer, or why it could not be prepared, and the detail stored with the run."""
        scorers: dict[str, SoapScorer | str] = {}
        details: dict[str, Any] = {}
        for source, plan in plans.items():
            detail: dict[str, Any] = {
                "split": plan.split.as_output(),
                "reference_steps": sum(f.n_steps for f in reference[source]),
                "validation_unlabelled": unlabelled[source],
            }
            try:
                if source in problems:
                    raise ValueError(problems[source])
                scorers[source] = self._fit(plan, reference[source], validation[source], detail)
            except ValueError as error:
                reason = f"SOAP could not be prepared for source {source!r}: {' '.join(str(error).split())}"
                scorers[source] = reason
                detail["failed"] = reason
            details[source] = detail
        return scorers, details

    def _plan(self, source: str, ids: Sequence[str], realization: int, n_layers: int) -> _SourcePlan:
        options = self.options
        split = split_trajectories(
            ids,
            seed=options.seed + realization,
            train_fraction=options.train_fraction,
            validation_fraction=options.validation_fraction,
            reference_fraction=options.reference_fraction,
        )
        full = default_grid(n_layers)
        layers = (options.layer,) if options.layer is not None else (options.layers or full.layers)
        for layer in layers:
            if layer > n_layers:
                raise ValueError(f"layer {layer} is outside the model's 0..{n_layers}")
        bands = (Band(options.band[0], options.band[1]),) if options.band is not None else full.bands
        attention = (
            (attention_band(n_layers, options.attention),)
            if options.attention is not None
            else full.attention_layers
        )
        windows: tuple[int | None, ...] = (
            DEFAULT_WINDOWS
            if options.window is None
            else (None if options.window == "all" else options.window,)
        )
        gammas = DEFAULT_GAMMAS if options.gamma is None else (options.gamma,)
        grid = SelectionGrid(
            layers=layers, bands=bands, attention_layers=attention, windows=windows, gammas=gammas
        )
        template = SoapConfig(
            layer=layers[0],
            band=bands[0],
            attention_layers=attention[0],
            window=windows[0],
            top=options.top,
            gamma=gammas[0],
            dependents_norm=options.dependents_norm,
            center=options.center,
            normalize=options.normalize,
            score_form=options.score_form,
            base=options.base,
            rescoring=options.rescoring,
            earliest_k=options.earliest_k,
            temporal_strength=options.temporal_strength,
            top_k=options.top_k,
        )
        stage_two = options.rescoring == "attention" and len(attention) * len(windows) * len(gammas) > 1
        selects = len(layers) * len(bands) > 1 or stage_two
        return _SourcePlan(source, split, grid, template, selects)

    def _fit(
        self,
        plan: _SourcePlan,
        reference: Sequence[TrajectoryFeatures],
        validation: Sequence[LabelledFeatures],
        detail: dict[str, Any],
    ) -> SoapScorer:
        options = self.options
        if plan.selects:
            result = select_hyperparameters(reference, validation, plan.grid, template=plan.template)
            config, fitted = result.config, result.reference
            detail["selection"] = {
                "validation": len(validation),
                "stage1_accuracy": result.stage1_accuracy,
                "stage2_accuracy": result.stage2_accuracy,
                "skipped_bands": result.skipped_bands,
                "stage1": [[r.layer, [r.band.lo, r.band.hi], r.correct] for r in result.stage1],
                "stage2": [[list(r.attention_layers), r.window, r.gamma, r.correct] for r in result.stage2],
            }
        else:
            config = plan.template
            fitted = fit_soap_reference(reference, config)
            if fitted.rank < config.band.hi and config.base in ("spectral", "leading", "tail"):
                raise ValueError(f"band {config.band} reaches past the reference's rank {fitted.rank}")
            detail["selection"] = None
        detail["config"] = config.as_output()
        detail["reference_rank"] = fitted.rank
        return SoapScorer(
            fitted,
            config,
            context_tokens=options.context_tokens,
            sharing=options.sharing,
            oversize=options.oversize,
        )


def _unused(plans: Mapping[str, _SourcePlan]) -> frozenset[str]:
    return frozenset(qid for plan in plans.values() for qid in plan.split.unused)


@method("soap")
def _create_soap(label: str, options: Mapping[str, Any]) -> SoapMethod:
    return SoapMethod(label, SoapOptions.from_mapping(options))
