"""SOAP applied to one trajectory: plan the passes, run them, rank the steps, answer as every method answers.

`SoapScorer` is what a run holds once the reference is fitted and the hyperparameters chosen; it is not a
registered `Method` (it needs a `ForwardModel`, and its splits belong to the run). Its output:
``docs/methods/soap.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rcarun.data import Trajectory
from rcarun.methods.base import Attribution, abstention, speaker_attribution
from rcarun.methods.forward import ForwardModel
from rcarun.methods.soap.alternatives import Ranking, base_scores, rank_with
from rcarun.methods.soap.config import SoapConfig
from rcarun.methods.soap.features import DEFAULT_CONTEXT_TOKENS, TrajectoryFeatures, extract_features
from rcarun.methods.soap.inputs import Oversize, Sharing
from rcarun.methods.soap.spectral import SpectralReference, fit_reference

__all__ = ["SoapScorer", "fit_soap_reference", "rank_steps"]

# Base scores that need no reference: a scorer configured with one of them may be built without it.
_REFERENCE_FREE = frozenset({"perplexity", "norm", "length"})


def fit_soap_reference(features: Sequence[TrajectoryFeatures], config: SoapConfig) -> SpectralReference:
    """The spectral reference from every step of the reference trajectories, at ``config.layer``.

    Raises:
        ValueError: no reference trajectory has a step.
    """
    rows = [f.representation(config.layer) for f in features if f.n_steps]
    if not rows:
        raise ValueError("the reference trajectories hold no step")
    return fit_reference(
        np.concatenate(rows), center=config.center, normalize=config.normalize, layer=config.layer
    )


def rank_steps(
    features: TrajectoryFeatures, reference: SpectralReference | None, config: SoapConfig
) -> Ranking:
    """The steps of one trajectory ranked by ``config`` (base score, then rescoring)."""
    return rank_with(features, base_scores(features, reference, config), config)


class SoapScorer:
    """A fitted SOAP: reference + configuration + input options, applied one trajectory at a time.

    Args:
        reference: the spectral reference (`fit_soap_reference`); None only for a reference-free base score.
        config: the hyperparameters.
        context_tokens: the per-pass limit (App. A.2: 8,192), lowered to the model's own when that is smaller;
            None = the model's.
        sharing: how passes are shared between target steps (`rcarun.methods.soap.inputs`).
        oversize: ``"cut"`` or ``"error"`` for a segment that cannot fit beside the task.
    """

    def __init__(
        self,
        reference: SpectralReference | None,
        config: SoapConfig,
        *,
        context_tokens: int | None = DEFAULT_CONTEXT_TOKENS,
        sharing: Sharing = "grouped",
        oversize: Oversize = "cut",
    ) -> None:
        if reference is None and config.base not in _REFERENCE_FREE:
            raise ValueError(f"the {config.base!r} base score needs a fitted reference")
        if reference is not None and reference.layer is not None and reference.layer != config.layer:
            raise ValueError(
                f"the reference was fitted at layer {reference.layer}, the configuration uses {config.layer}"
            )
        self.reference = reference
        self.config = config
        self.context_tokens = context_tokens
        self.sharing: Sharing = sharing
        self.oversize: Oversize = oversize

    async def features(self, trajectory: Trajectory, model: ForwardModel) -> TrajectoryFeatures:
        """The trajectory's features, keeping only the representation layer this scorer uses."""
        if (
            self.config.layer > model.n_layers
            or max(self.config.attention_layers, default=0) >= model.n_layers
        ):
            raise ValueError(
                f"the configuration reads layer {self.config.layer} and attention layers "
                f"{self.config.attention_layers}, but {model.name} has {model.n_layers} decoder layers"
            )
        return await extract_features(
            model,
            trajectory,
            context_tokens=self.context_tokens,
            sharing=self.sharing,
            oversize=self.oversize,
            layers=(self.config.layer,),
        )

    async def attribute(self, trajectory: Trajectory, model: ForwardModel) -> Attribution:
        """Run ``model`` over ``trajectory`` and answer with its top-ranked step (docs/methods/soap.md); the
        arguments are in `rcarun.methods.base.Method.attribute`'s order."""
        if trajectory.n_steps == 0:
            return abstention({"reason": "the trajectory has no steps", "model": model.name, "passes": 0})
        features = await self.features(trajectory, model)
        ranking = rank_steps(features, self.reference, self.config)
        output = self._output(model, trajectory, features, ranking)
        return speaker_attribution(trajectory, ranking.prediction, output)

    def _output(
        self, model: ForwardModel, trajectory: Trajectory, features: TrajectoryFeatures, ranking: Ranking
    ) -> dict[str, Any]:
        ranked = ranking.top(self.config.top_k)
        for entry in ranked:
            entry["agent"] = trajectory.steps[entry["step"]].agent
        return {
            "ranked": ranked,
            "passes": features.passes,
            "tokens": features.tokens,
            "windowed": features.windowed,
            "cut": {"task": features.task_cut, "steps": list(features.steps_cut)},
            "model": model.name,
            "config": self.config.as_output(),
        }
