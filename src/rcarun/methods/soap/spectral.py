"""SOAP's spectral reference and base score (paper 004, §3.1).

A step that puts little of its energy into the band of directions that describe ordinary steps is unusual.
Preprocessing, energy and score forms are parameters: ``docs/methods/soap.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = [
    "SCORE_FORMS",
    "Band",
    "ScoreForm",
    "SpectralReference",
    "band_energy",
    "fit_reference",
    "leading_band",
    "spectral_scores",
    "tail_band",
]

ScoreForm = Literal["complement", "reciprocal"]
SCORE_FORMS: tuple[str, ...] = ("complement", "reciprocal")

# Energy floor of the reciprocal form: a step with no energy in the band scores 1e12, not infinity.
_ENERGY_FLOOR = 1e-12

Matrix = npt.NDArray[np.floating]


@dataclass(frozen=True, slots=True)
class Band:
    """The right singular vectors ``lo … hi - 1`` (0 = the direction of the largest singular value)."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        if not 0 <= self.lo < self.hi:
            raise ValueError(f"a band needs 0 <= lo < hi, got [{self.lo}, {self.hi})")

    @property
    def width(self) -> int:
        return self.hi - self.lo

    def __str__(self) -> str:
        return f"[{self.lo}, {self.hi})"


def leading_band(width: int) -> Band:
    """The ``width`` leading directions."""
    return Band(0, width)


def tail_band(width: int, rank: int) -> Band:
    """The ``width`` last directions of a reference of rank ``rank``."""
    return Band(max(rank - width, 0), rank)


@dataclass(frozen=True, slots=True, eq=False)
class SpectralReference:
    """A fitted reference space.

    Attributes:
        mean: ``[hidden]`` the mean of the preprocessed reference rows (subtracted only when ``center``).
        components: ``[rank, hidden]`` right singular vectors as rows, by descending singular value.
        singular_values: ``[rank]`` descending.
        center: rows are centred by ``mean`` before projection.
        normalize: rows are L2-normalised before centring.
        n_rows: reference rows (steps) fitted.
        layer: the ``hidden_states`` index the rows came from, when the caller recorded it.
    """

    mean: npt.NDArray[np.float64]
    components: npt.NDArray[np.float64]
    singular_values: npt.NDArray[np.float64]
    center: bool = True
    normalize: bool = False
    n_rows: int = 0
    layer: int | None = None

    @property
    def rank(self) -> int:
        return int(self.components.shape[0])

    @property
    def hidden(self) -> int:
        return int(self.components.shape[1])

    def prepare(self, rows: Matrix) -> npt.NDArray[np.float64]:
        """``rows`` preprocessed as the reference rows were: normalised if set, then centred if set."""
        prepared = _as_rows(rows)
        if prepared.shape[1] != self.hidden:
            raise ValueError(f"rows have {prepared.shape[1]} dimensions, the reference {self.hidden}")
        if self.normalize:
            prepared = _unit_rows(prepared)
        if self.center:
            prepared = prepared - self.mean
        return prepared


def _as_rows(rows: Matrix) -> npt.NDArray[np.float64]:
    array = np.asarray(rows, dtype=np.float64)
    return array.reshape(1, -1) if array.ndim == 1 else array


def _unit_rows(rows: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    unit: npt.NDArray[np.float64] = np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0)
    return unit


def fit_reference(
    matrix: Matrix, *, center: bool = True, normalize: bool = False, layer: int | None = None
) -> SpectralReference:
    """SVD of the reference step representations (``[rows, hidden]``), preprocessed per docs/methods/soap.md.

    Raises:
        ValueError: the matrix is empty or not two-dimensional.
    """
    rows = np.asarray(matrix, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[0] == 0 or rows.shape[1] == 0:
        raise ValueError(f"a reference needs a non-empty [rows, hidden] matrix, got shape {rows.shape}")
    if normalize:
        rows = _unit_rows(rows)
    mean = rows.mean(axis=0)
    centred = rows - mean if center else rows
    _, singular_values, components = np.linalg.svd(centred, full_matrices=False)
    return SpectralReference(
        mean=mean,
        components=components,
        singular_values=singular_values,
        center=center,
        normalize=normalize,
        n_rows=int(rows.shape[0]),
        layer=layer,
    )


def band_energy(reference: SpectralReference, rows: Matrix, band: Band) -> npt.NDArray[np.float64]:
    """``[n]`` relative projection energy of each row onto ``band``, in ``[0, 1]`` (1 for a row at the mean).

    Raises:
        ValueError: the band reaches past the reference's rank.
    """
    if band.hi > reference.rank:
        raise ValueError(f"band {band} reaches past the reference's rank {reference.rank}")
    prepared = reference.prepare(rows)
    projected = prepared @ reference.components[band.lo : band.hi].T
    inside = np.einsum("ij,ij->i", projected, projected)
    total = np.einsum("ij,ij->i", prepared, prepared)
    energy = np.divide(inside, total, out=np.ones_like(total), where=total > 0)
    # Rounding can put a row whose energy is all in the band a hair above 1.
    clipped: npt.NDArray[np.float64] = np.clip(energy, 0.0, 1.0)
    return clipped


def spectral_scores(
    reference: SpectralReference, rows: Matrix, band: Band, form: ScoreForm = "complement"
) -> npt.NDArray[np.float64]:
    """``[n]`` base scores, larger = less energy in the band = more likely failure-related."""
    energy = band_energy(reference, rows, band)
    if form == "complement":
        return 1.0 - energy
    if form == "reciprocal":
        return 1.0 / np.maximum(energy, _ENERGY_FLOOR)
    raise ValueError(f"unknown score form {form!r}; expected one of {SCORE_FORMS}")
