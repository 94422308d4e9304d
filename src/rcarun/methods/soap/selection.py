"""SOAP's data splits and two-stage hyperparameter selection (paper 004, §4.1, §4.3, App. A.3, B.4).

Splits are a pure function of (ids, seed, fractions), so a run can store and redo them; selection works on
precomputed `TrajectoryFeatures`, so the model runs once per trajectory. The rules: ``docs/methods/soap.md``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from rcarun.methods.soap.alternatives import base_scores, rank_order, rank_with
from rcarun.methods.soap.config import SoapConfig
from rcarun.methods.soap.dependency import AttentionBand, attention_band
from rcarun.methods.soap.features import TrajectoryFeatures
from rcarun.methods.soap.scorer import fit_soap_reference
from rcarun.methods.soap.spectral import Band, SpectralReference

__all__ = [
    "DEFAULT_GAMMAS",
    "DEFAULT_WINDOWS",
    "LabelledFeatures",
    "SelectionGrid",
    "SelectionResult",
    "SoapSplit",
    "Stage1Row",
    "Stage2Row",
    "default_grid",
    "select_hyperparameters",
    "split_trajectories",
]

DEFAULT_WINDOWS: tuple[int | None, ...] = (1, 2, 3, 5, None)
DEFAULT_GAMMAS: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(11))
_BAND_STARTS = (0, 1, 2, 4, 8, 16, 32)
_BAND_WIDTHS = (1, 2, 4, 8, 16, 32, 64)
_ATTENTION_BANDS: tuple[AttentionBand, ...] = ("early", "middle", "late", "all")


@dataclass(frozen=True, slots=True)
class SoapSplit:
    """Trajectory ids per role, each tuple sorted.

    Attributes:
        seed, train_fraction, validation_fraction, reference_fraction: what the split was made from.
        reference: training ids whose steps build the spectral reference (labels unused).
        unused: training ids left out of the reference by ``reference_fraction``.
        validation: ids whose labels choose the hyperparameters.
        test: ids the result is reported on.
    """

    seed: int
    train_fraction: float
    validation_fraction: float
    reference_fraction: float
    reference: tuple[str, ...]
    unused: tuple[str, ...]
    validation: tuple[str, ...]
    test: tuple[str, ...]

    def as_output(self) -> dict[str, Any]:
        """The split as plain JSON values, to store with a run."""
        return {
            "seed": self.seed,
            "train_fraction": self.train_fraction,
            "validation_fraction": self.validation_fraction,
            "reference_fraction": self.reference_fraction,
            "reference": list(self.reference),
            "unused": list(self.unused),
            "validation": list(self.validation),
            "test": list(self.test),
        }


def _round_half_up(value: float) -> int:
    # 1e-9 absorbs binary error such as 0.3 * 5 = 1.4999999999999998.
    return math.floor(value + 0.5 + 1e-9)


def split_trajectories(
    ids: Sequence[str],
    *,
    seed: int,
    train_fraction: float = 0.3,
    validation_fraction: float = 0.2,
    reference_fraction: float = 1.0,
) -> SoapSplit:
    """The seeded trajectory-level split (rules in docs/methods/soap.md).

    Raises:
        ValueError: duplicate ids, or fractions outside ``[0, 1]`` or summing past 1.
    """
    if len(set(ids)) != len(ids):
        raise ValueError("trajectory ids must be distinct")
    for name, fraction in (
        ("train_fraction", train_fraction),
        ("validation_fraction", validation_fraction),
        ("reference_fraction", reference_fraction),
    ):
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {fraction}")
    if train_fraction + validation_fraction > 1.0 + 1e-9:
        raise ValueError(
            f"train_fraction + validation_fraction exceed 1: {train_fraction} + {validation_fraction}"
        )
    ordered = sorted(ids, key=lambda qid: (hashlib.sha256(f"{seed}:{qid}".encode()).hexdigest(), qid))
    n = len(ordered)
    n_train = min(_round_half_up(train_fraction * n), n)
    n_validation = min(_round_half_up(validation_fraction * n), n - n_train)
    n_reference = _round_half_up(reference_fraction * n_train)
    if n_train and reference_fraction > 0:
        n_reference = max(n_reference, 1)
    train = ordered[:n_train]
    return SoapSplit(
        seed=seed,
        train_fraction=train_fraction,
        validation_fraction=validation_fraction,
        reference_fraction=reference_fraction,
        reference=tuple(sorted(train[:n_reference])),
        unused=tuple(sorted(train[n_reference:])),
        validation=tuple(sorted(ordered[n_train : n_train + n_validation])),
        test=tuple(sorted(ordered[n_train + n_validation :])),
    )


@dataclass(frozen=True, slots=True)
class LabelledFeatures:
    """A validation trajectory's features and its gold decisive step (0-based)."""

    features: TrajectoryFeatures
    step: int


@dataclass(frozen=True, slots=True)
class SelectionGrid:
    """The configurations each stage tries, in tie-breaking order (first wins)."""

    layers: tuple[int, ...]
    bands: tuple[Band, ...]
    attention_layers: tuple[tuple[int, ...], ...]
    windows: tuple[int | None, ...] = DEFAULT_WINDOWS
    gammas: tuple[float, ...] = DEFAULT_GAMMAS

    def __post_init__(self) -> None:
        for name in ("layers", "bands", "attention_layers", "windows", "gammas"):
            if not getattr(self, name):
                raise ValueError(f"a selection grid needs at least one of {name}")


def default_grid(n_layers: int) -> SelectionGrid:
    """The grid used when a run names none (ordering in docs/methods/soap.md)."""
    bands = tuple(Band(lo, lo + width) for lo in _BAND_STARTS for width in _BAND_WIDTHS)
    attention: list[tuple[int, ...]] = []
    for name in _ATTENTION_BANDS:
        try:
            layers = attention_band(n_layers, name)
        except ValueError:
            continue  # a model too shallow for thirds
        if layers not in attention:
            attention.append(layers)
    return SelectionGrid(
        layers=tuple(range(n_layers, -1, -1)),
        bands=bands,
        attention_layers=tuple(attention),
    )


@dataclass(frozen=True, slots=True)
class Stage1Row:
    """One stage-1 configuration and its base-score step accuracy on the validation split."""

    layer: int
    band: Band
    correct: int
    accuracy: float


@dataclass(frozen=True, slots=True)
class Stage2Row:
    """One stage-2 configuration and its rescored step accuracy on the validation split."""

    attention_layers: tuple[int, ...]
    window: int | None
    gamma: float
    correct: int
    accuracy: float


@dataclass(frozen=True, slots=True, eq=False)
class SelectionResult:
    """The chosen configuration, the reference fitted at its layer, and every configuration tried.

    Attributes:
        skipped_bands: stage-1 (layer, band) pairs not tried: the band reaches past the reference's rank.
    """

    config: SoapConfig
    reference: SpectralReference
    stage1: tuple[Stage1Row, ...]
    stage2: tuple[Stage2Row, ...]
    skipped_bands: int = 0

    @property
    def stage1_accuracy(self) -> float:
        return max(row.accuracy for row in self.stage1)

    @property
    def stage2_accuracy(self) -> float | None:
        return max((row.accuracy for row in self.stage2), default=None)


def _hit(order: Sequence[int], gold: int) -> bool:
    """The top-ranked step is the gold one (a trajectory without steps is a miss)."""
    return bool(order) and order[0] == gold


def select_hyperparameters(
    reference: Sequence[TrajectoryFeatures],
    validation: Sequence[LabelledFeatures],
    grid: SelectionGrid,
    *,
    template: SoapConfig | None = None,
) -> SelectionResult:
    """Two-stage selection (docs/methods/soap.md).

    Args:
        reference: features of the reference trajectories (they must keep every layer of ``grid.layers``).
        validation: features and gold steps of the validation trajectories.
        grid: the configurations to try.
        template: the fields neither stage chooses (window ``top``, normalisations, score form, base score and
            rescoring); None = `SoapConfig`'s defaults.

    Raises:
        ValueError: no validation trajectory, no reference step, or no band fits any layer's reference.
    """
    if not validation:
        raise ValueError("hyperparameter selection needs at least one validation trajectory")
    n = len(validation)
    start = template or SoapConfig(
        layer=grid.layers[0], band=grid.bands[0], attention_layers=grid.attention_layers[0]
    )

    stage1: list[Stage1Row] = []
    skipped = 0
    best1: tuple[int, SoapConfig, SpectralReference] | None = None
    for layer in grid.layers:
        fitted = fit_soap_reference(reference, replace(start, layer=layer))
        for band in grid.bands:
            if band.hi > fitted.rank:
                skipped += 1
                continue
            config = replace(start, layer=layer, band=band)
            correct = sum(
                _hit(rank_order(base_scores(item.features, fitted, config)), item.step) for item in validation
            )
            stage1.append(Stage1Row(layer, band, correct, correct / n))
            if best1 is None or correct > best1[0]:
                best1 = (correct, config, fitted)
    if best1 is None:
        raise ValueError("no band of the grid fits inside any layer's reference; use narrower bands")
    _, chosen, fitted = best1

    stage2: list[Stage2Row] = []
    if chosen.rescoring == "attention":
        bases = [base_scores(item.features, fitted, chosen) for item in validation]
        best2 = (-1, chosen)
        for layers in grid.attention_layers:
            for window in grid.windows:
                for gamma in grid.gammas:
                    config = replace(chosen, attention_layers=layers, window=window, gamma=gamma)
                    correct = sum(
                        _hit(rank_with(item.features, base, config).order, item.step)
                        for item, base in zip(validation, bases, strict=True)
                    )
                    stage2.append(Stage2Row(layers, window, gamma, correct, correct / n))
                    if correct > best2[0]:
                        best2 = (correct, config)
        chosen = best2[1]
    return SelectionResult(chosen, fitted, tuple(stage1), tuple(stage2), skipped)
