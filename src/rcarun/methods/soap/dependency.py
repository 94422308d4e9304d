"""SOAP's dependency-aware rescoring (paper 004, §3.2, A.3, B.1): attention routes late evidence upstream.

Later steps contaminated by a decisive error often look more anomalous than the error itself; adding to each
step the base scores of the steps that attend to it lifts the early cause. The rules and our choices where the
paper is open: ``docs/methods/soap.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = [
    "ATTENTION_BANDS",
    "DEPENDENTS_NORMS",
    "AttentionBand",
    "DependentsNorm",
    "attention_band",
    "average_attention",
    "dependency_weights",
    "propagate",
]

AttentionBand = Literal["early", "middle", "late", "all"]
ATTENTION_BANDS: tuple[str, ...] = ("early", "middle", "late", "all")
DependentsNorm = Literal["capped", "weight", "count", "none"]
DEPENDENTS_NORMS: tuple[str, ...] = ("capped", "weight", "count", "none")


def attention_band(n_layers: int, band: AttentionBand) -> tuple[int, ...]:
    """The decoder layers of a band: ``early``/``middle``/``late`` are contiguous thirds of ``0 … n_layers-1``
    (sizes differing by at most one, the earlier thirds larger), ``all`` every layer."""
    if n_layers <= 0:
        raise ValueError(f"a model needs at least one layer, got {n_layers}")
    if band == "all":
        return tuple(range(n_layers))
    if band not in ATTENTION_BANDS:
        raise ValueError(f"unknown attention band {band!r}; expected one of {ATTENTION_BANDS}")
    thirds = np.array_split(np.arange(n_layers), 3)
    chosen = thirds[("early", "middle", "late").index(band)]
    if chosen.size == 0:
        raise ValueError(f"a model of {n_layers} layers has no {band} third")
    return tuple(int(layer) for layer in chosen)


def average_attention(attention: npt.NDArray[np.floating], layers: Sequence[int]) -> npt.NDArray[np.float64]:
    """``[n, n]`` the mean over ``layers`` of ``attention`` (``[n_layers, n, n]``), per entry over the layers
    that have a value there: a layer without softmax attention (the linear-attention layers of a hybrid model
    such as Qwen3.5) comes back as NaN and is left out; an entry no selected layer has is 0."""
    if not layers:
        raise ValueError("no attention layers selected")
    selected = np.asarray(attention, dtype=np.float64)[list(layers)]
    present = np.isfinite(selected)
    total = np.where(present, selected, 0.0).sum(axis=0)
    count = present.sum(axis=0)
    mean: npt.NDArray[np.float64] = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
    return mean


def dependency_weights(
    mass: npt.NDArray[np.floating],
    retained: npt.NDArray[np.bool_],
    *,
    window: int | None = None,
    top: int | None = None,
) -> npt.NDArray[np.float64]:
    """``[n, n]`` relative dependency weights ``W[i, j]`` of step ``i`` on its predecessor ``j`` (rules 2–3).

    Args:
        mass: ``[n, n]`` attention from row step to column step (layer-averaged).
        retained: ``[n, n]`` column step is in the row step's window; only ``j < i`` is ever read.
        window: the nearest predecessors considered, None = all.
        top: of those, the most massive kept, None = all.
    """
    if window is not None and window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    if top is not None and top < 1:
        raise ValueError(f"top must be at least 1, got {top}")
    masses = np.asarray(mass, dtype=np.float64)
    n = masses.shape[0]
    rows, cols = np.indices((n, n))
    eligible = (cols < rows) & np.asarray(retained, dtype=bool)
    if window is not None:
        eligible &= rows - cols <= window
    weights = np.where(eligible, masses, 0.0)
    if top is not None:
        for i in range(n):
            candidates = np.flatnonzero(eligible[i])
            if candidates.size <= top:
                continue
            # Larger mass first; equal masses: the nearer (larger) index first.
            order = np.lexsort((-candidates, -masses[i, candidates]))
            weights[i, candidates[order[top:]]] = 0.0
    totals = weights.sum(axis=1, keepdims=True)
    normalised: npt.NDArray[np.float64] = np.divide(
        weights, totals, out=np.zeros_like(weights), where=totals > 0
    )
    return normalised


def propagate(
    base: npt.NDArray[np.floating],
    weights: npt.NDArray[np.floating],
    *,
    gamma: float = 0.6,
    norm: DependentsNorm = "capped",
) -> npt.NDArray[np.float64]:
    """``[n]`` rescored steps: each base plus γ times the normalised dependency-weighted base of its
    dependents (rule 4)."""
    scores = np.asarray(base, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    incoming = w.T @ scores
    total = w.sum(axis=0)
    if norm == "capped":
        divisor = np.maximum(total, 1.0)
    elif norm == "weight":
        divisor = total
    elif norm == "count":
        divisor = (w > 0).sum(axis=0).astype(np.float64)
    elif norm == "none":
        divisor = np.ones_like(total)
    else:
        raise ValueError(f"unknown dependents normalisation {norm!r}; expected one of {DEPENDENTS_NORMS}")
    correction = np.divide(incoming, divisor, out=np.zeros_like(incoming), where=divisor > 0)
    rescored: npt.NDArray[np.float64] = scores + gamma * correction
    return rescored
