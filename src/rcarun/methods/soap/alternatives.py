"""SOAP's score and rescoring by name: the method itself and the cheap alternatives of its ablations.

Selected by `SoapConfig.base` and `SoapConfig.rescoring`, so an ablation (Tables 3–4) is a configuration, not
new code; every score is "larger = more likely the decisive error". The list: ``docs/methods/soap.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rcarun.methods.soap.config import SoapConfig
from rcarun.methods.soap.dependency import average_attention, dependency_weights, propagate
from rcarun.methods.soap.features import TrajectoryFeatures
from rcarun.methods.soap.spectral import Band, SpectralReference, spectral_scores, tail_band

__all__ = ["Ranking", "base_scores", "rank_order", "rank_with"]


@dataclass(frozen=True, slots=True, eq=False)
class Ranking:
    """The steps of one trajectory in the order a configuration ranks them.

    Attributes:
        order: step indices, most likely decisive first.
        scores: ``[n_steps]`` the final score of each step (the base score where a rescoring only reorders).
        base: ``[n_steps]`` the base score of each step.
    """

    order: tuple[int, ...]
    scores: npt.NDArray[np.float64]
    base: npt.NDArray[np.float64]

    @property
    def prediction(self) -> int:
        """The top-ranked step."""
        return self.order[0]

    def top(self, k: int) -> list[dict[str, Any]]:
        """The first ``k`` steps as ``{"step", "score", "base"}`` records."""
        return [
            {"step": step, "score": float(self.scores[step]), "base": float(self.base[step])}
            for step in self.order[:k]
        ]


def rank_order(scores: npt.NDArray[np.floating]) -> tuple[int, ...]:
    """Step indices by descending score, equal scores earliest first, non-numbers last."""
    values = np.asarray(scores, dtype=np.float64)
    values = np.where(np.isnan(values), -np.inf, values)
    order = np.lexsort((np.arange(values.size), -values))
    return tuple(int(step) for step in order)


def _spectral(
    features: TrajectoryFeatures, reference: SpectralReference | None, config: SoapConfig, band: Band
) -> npt.NDArray[np.float64]:
    if reference is None:
        raise ValueError(f"the {config.base!r} base score needs a fitted reference")
    return spectral_scores(reference, features.representation(config.layer), band, config.score_form)


def base_scores(
    features: TrajectoryFeatures, reference: SpectralReference | None, config: SoapConfig
) -> npt.NDArray[np.float64]:
    """``[n_steps]`` the configured base score of every step (docs/methods/soap.md).

    Raises:
        ValueError: a score that needs the reference has none, or the reference was fitted at another layer.
    """
    if reference is not None and reference.layer is not None and reference.layer != config.layer:
        raise ValueError(
            f"the reference was fitted at layer {reference.layer}, the configuration uses {config.layer}"
        )
    name = config.base
    if name == "spectral":
        return _spectral(features, reference, config, config.band)
    if name == "leading":
        return _spectral(features, reference, config, Band(0, config.band.width))
    if name == "tail":
        rank = reference.rank if reference is not None else 0
        return _spectral(features, reference, config, tail_band(config.band.width, rank))
    if name == "perplexity":
        return np.asarray(features.nll, dtype=np.float64)
    if name == "length":
        return np.asarray(features.n_tokens, dtype=np.float64)
    rows = np.asarray(features.representation(config.layer), dtype=np.float64)
    if name == "norm":
        return np.asarray(np.linalg.norm(rows, axis=1), dtype=np.float64)
    if name == "unit-norm":
        if reference is None:
            raise ValueError("the 'unit-norm' base score needs a fitted reference")
        return _unit_distance(rows, reference.mean)
    raise ValueError(f"unknown base score {name!r}")


def _unit(vectors: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    unit: npt.NDArray[np.float64] = np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)
    return unit


def _unit_distance(rows: npt.NDArray[np.float64], mean: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return np.asarray(np.linalg.norm(_unit(rows) - _unit(mean), axis=1), dtype=np.float64)


def rank_with(features: TrajectoryFeatures, base: npt.NDArray[np.floating], config: SoapConfig) -> Ranking:
    """The configured rescoring of ``base`` (docs/methods/soap.md) as a ranking."""
    scores = np.asarray(base, dtype=np.float64)
    n = scores.size
    name = config.rescoring
    if name == "none" or n == 0:
        return Ranking(rank_order(scores), scores, scores)
    if name == "attention":
        mass = average_attention(features.attention, config.attention_layers)
        weights = dependency_weights(mass, features.retained, window=config.window, top=config.top)
        rescored = propagate(scores, weights, gamma=config.gamma, norm=config.dependents_norm)
        return Ranking(rank_order(rescored), rescored, scores)
    if name == "temporal":
        position = np.arange(n, dtype=np.float64) / max(n - 1, 1)
        biased = scores - config.temporal_strength * position
        return Ranking(rank_order(biased), biased, scores)
    if name == "earliest-of-top-k":
        by_base = rank_order(scores)
        leaders = sorted(by_base[: config.earliest_k])
        rest = by_base[config.earliest_k :]
        return Ranking((*leaders, *rest), scores, scores)
    raise ValueError(f"unknown rescoring {name!r}")
