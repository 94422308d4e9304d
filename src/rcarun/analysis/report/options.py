"""What a report is computed with (`ReportOptions`) and the constants the report's parts share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..protocol import MethodKind
from ..scoring import METRICS
from ..sensitivity import ANNOTATION_SEED
from ..stats import DEFAULT_SEED, BootstrapInterval, ProportionInterval

METRIC_NAMES = tuple(m.name for m in METRICS)
# Step-id lists a method may store under output["diagnostics"], in pipeline order.
RECALL_SETS = ("base_candidate_ids", "excerpt_ids", "evidence_ids")
MIN_READABLE_SHARE = 0.5
"""The share of a cell's expected trajectories that readable predictions must cover for its number to be shown,
marked best and compared (docs/analysis.md)."""

DEFAULT_DRAWS = 10_000  # App. A's calibration draws per size and App. K.1's label draws
CALIBRATION_SEED = 20260820  # App. A, "Sampling protocol": the calibration's master seed
# Why a cell's number would rest on nothing: the outcome count and the word shown for it (equal counts: "n/a").
_CAUSES = (
    ("failed", "failed"),
    ("skipped_budget", "skipped"),
    ("interrupted", "interrupted"),
    ("not_run", "not run"),
    ("invalid", "unreadable"),
)


@dataclass(frozen=True, slots=True)
class ReportOptions:
    """How the report is computed (docs/analysis.md). None leaves a choice to the protocol.

    Attributes:
        reference_method: the method the others are compared with.
        protocol: ``"auto"``, ``"main"`` or ``"ablation"`` (`rcarun.analysis.protocol`).
        aggregate: ``"macro"``, ``"pooled"``, or None / ``"auto"`` for the protocol's.
        resamples: bootstrap resamples (None: 20,000 main, 10,000 ablation).
        seed: bootstrap seed.
        confidence: interval level.
        holm_family: ``"paper"``, ``"metric"`` or ``"all"`` (None: ``"paper"``).
        holm_backbones: the backbones of App. B's family (empty: the run's API backbones, self-hosted ones left
            out as App. B leaves out Qwen; `rcarun.analysis.protocol.app_b_backbones`).
        compare_backbones: backbones compared per method, the first against each other.
        populations: post-stratification sizes per source.
        length_groups: groups of the shared length partition.
        keep_handoff: keep handoff suffixes in role matching (None: the protocol's rule).
        abstentions: ``"fields"`` or ``"error"`` (None: the protocol's rule).
        paired_metrics: the metrics compared (None: the protocol's).
        calibrate_against: a Full run to set this (Mini) run's scores beside (App. A); read from ``full_store``
            given to `build_report`, or this run's database.
        calibration_sizes: sample sizes for App. A's sample-size calibration over this run (empty: none).
        calibration_seed: its master seed.
        annotations: observed human root steps per qid, for App. K.1's label sensitivity (None: none).
        annotation_seed: its seed.
        draws: draws of the calibration and of the label sensitivity.
    """

    reference_method: str | None = None
    protocol: str = "auto"
    aggregate: str | None = None
    resamples: int | None = None
    seed: int = DEFAULT_SEED
    confidence: float = 0.95
    holm_family: str | None = None
    holm_backbones: tuple[str, ...] = ()
    compare_backbones: tuple[str, ...] = ()
    populations: Mapping[str, int] | None = None
    length_groups: int = 5
    keep_handoff: bool | None = None
    abstentions: str | None = None
    paired_metrics: tuple[str, ...] | None = None
    calibrate_against: str | None = None
    calibration_sizes: tuple[int, ...] = ()
    calibration_seed: int = CALIBRATION_SEED
    annotations: Mapping[str, Sequence[int]] | None = None
    annotation_seed: int = ANNOTATION_SEED
    draws: int = DEFAULT_DRAWS


@dataclass(frozen=True, slots=True)
class _Study:
    """The run's RCTA component study: full RCTA's label and its component conditions' labels."""

    full: str
    conditions: tuple[str, ...]


def _study(kinds: Mapping[str, MethodKind], reference: str | None) -> _Study | None:
    full = sorted(label for label, kind in kinds.items() if kind.full_rcta)
    conditions = sorted(
        (label for label, kind in kinds.items() if kind.component_condition),
        key=lambda label: (kinds[label].ablation or "", label),
    )
    if not full or not conditions:
        return None
    chosen = reference if reference in full else ("rcta" if "rcta" in full else full[0])
    return _Study(full=chosen, conditions=tuple(conditions))


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _bounds(interval: ProportionInterval) -> list[float]:
    return [interval.low, interval.high]


def _interval_json(interval: BootstrapInterval) -> dict[str, float]:
    return {"delta": interval.delta, "ci_low": interval.low, "ci_high": interval.high}
