"""SOAP's dependency-aware rescoring (paper 004, §3.2, A.3, B.1): attention routes late evidence upstream.

A decisive error contaminates the steps after it, and those later steps often look more anomalous than the
error itself. The frozen model's attention says which earlier steps a step reads from; SOAP turns that into
soft dependencies and adds to each step the base scores of the steps that depend on it, so an early step whose
dependents are anomalous rises above them.

Rules, with the paper's section and our choice where it is open:

1. Attention mass (§3.2, A.3): the attention from step ``i`` to step ``j`` averaged over the selected decoder
   layers (`average_attention`; layers without softmax attention, NaN from the model side, are left out);
   heads are averaged by the model side (`rcarun.methods.forward`). The attention
   bands offered for selection are the earliest, middle and latest thirds of the layers and all of them
   (`attention_band`; the paper's Table 4 found the earliest band best).
2. Eligible predecessors (§3.2, B.1): steps ``j < i`` retained in ``i``'s own pass (the task segment never
   counts), within the ``window`` nearest positions ``i - window … i - 1`` (``None`` = all; the paper's
   ``w``). Of those, the ``top`` with the largest mass are kept (A.3 "retains top-mass predecessors"; ``None``
   keeps all); equal masses prefer the nearer predecessor.
3. Dependency weights (§3.2): a step's masses to its kept predecessors divided by their sum, so each step's
   outgoing weights sum to 1 (0 for a step with no eligible predecessor or no mass to any).
4. Rescoring (§3.2): ``rescored[j] = base[j] + γ · incoming[j] / norm[j]`` with ``incoming[j] = Σ_i W[i, j] ·
   base[i]`` over the dependents ``i`` of ``j`` (one hop: the base scores of direct dependents, not their
   rescored values). ``norm`` (the paper only says it prevents many dependents from inflating the correction):
   ``"capped"`` (default) ``max(1, Σ_i W[i, j])``: weak dependencies give small corrections, and beyond a
   total weight of one the correction is the weighted mean of the dependents' base scores, so it never exceeds
   the largest of them however many dependents ``j`` has; ``"weight"`` ``Σ_i W[i, j]``, always the weighted
   mean; ``"count"`` the number of dependents with a positive weight; ``"none"`` 1 (no normalisation, to show
   the inflation). No dependents: no correction. γ = 0.6 by default, the paper's best (§4.3).
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
