"""One SOAP configuration: every choice that turns a trajectory's features into a ranking, in one value.

Hyperparameter selection (`rcarun.methods.soap.selection`) produces one, a scorer
(`rcarun.methods.soap.scorer`) applies one, and a run can store it (`SoapConfig.as_output`) beside its
predictions, so a result always names the layer, band, attention layers, window and γ it came from. The
meaning of each field is documented in the module that applies it (named per field below).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from rcarun.methods.soap.dependency import DEPENDENTS_NORMS, DependentsNorm
from rcarun.methods.soap.spectral import SCORE_FORMS, Band, ScoreForm

__all__ = ["BASE_SCORES", "RESCORINGS", "BaseScore", "Rescoring", "SoapConfig"]

BaseScore = Literal["spectral", "leading", "tail", "perplexity", "norm", "unit-norm", "length"]
BASE_SCORES: tuple[str, ...] = ("spectral", "leading", "tail", "perplexity", "norm", "unit-norm", "length")
Rescoring = Literal["attention", "none", "earliest-of-top-k", "temporal"]
RESCORINGS: tuple[str, ...] = ("attention", "none", "earliest-of-top-k", "temporal")


@dataclass(frozen=True, slots=True)
class SoapConfig:
    """SOAP's hyperparameters.

    Attributes:
        layer: ``hidden_states`` index of the step representation (0 = embeddings; `features`).
        band: the spectral band of the base score (`spectral`).
        attention_layers: decoder layers whose attention is averaged (`dependency`, rule 1).
        window: nearest predecessors considered, None = all (`dependency`, rule 2; the paper's w).
        top: most massive predecessors kept within the window, None = all (`dependency`, rule 2).
        gamma: the propagation weight γ (`dependency`, rule 4).
        dependents_norm: how a step's incoming correction is normalised (`dependency`, rule 4).
        center: centre representations by the reference mean (`spectral`).
        normalize: L2-normalise representations before centring (`spectral`).
        score_form: ``complement`` (1 - energy) or ``reciprocal`` (1 / energy) (`spectral`).
        base: the base score, SOAP's ``spectral`` or an alternative of Table 3 (`alternatives`).
        rescoring: SOAP's ``attention`` or an alternative of Table 4 (`alternatives`).
        earliest_k: the k of ``earliest-of-top-k`` (the paper's 5).
        temporal_strength: the penalty of ``temporal`` at the last step (`alternatives`).
        top_k: steps kept in the ranked list of a prediction.
    """

    layer: int
    band: Band
    attention_layers: tuple[int, ...]
    window: int | None = 2
    top: int | None = None
    gamma: float = 0.6
    dependents_norm: DependentsNorm = "capped"
    center: bool = True
    normalize: bool = False
    score_form: ScoreForm = "complement"
    base: BaseScore = "spectral"
    rescoring: Rescoring = "attention"
    earliest_k: int = 5
    temporal_strength: float = 0.1
    top_k: int = 5

    def __post_init__(self) -> None:
        problems = []
        if self.layer < 0:
            problems.append(f"layer must be >= 0, got {self.layer}")
        if self.rescoring == "attention" and not self.attention_layers:
            problems.append("attention rescoring needs at least one attention layer")
        if any(layer < 0 for layer in self.attention_layers):
            problems.append(f"attention layers must be >= 0, got {self.attention_layers}")
        if self.window is not None and self.window < 1:
            problems.append(f"window must be >= 1 or None, got {self.window}")
        if self.top is not None and self.top < 1:
            problems.append(f"top must be >= 1 or None, got {self.top}")
        if self.gamma < 0:
            problems.append(f"gamma must be >= 0, got {self.gamma}")
        if self.dependents_norm not in DEPENDENTS_NORMS:
            problems.append(
                f"dependents_norm must be one of {DEPENDENTS_NORMS}, got {self.dependents_norm!r}"
            )
        if self.score_form not in SCORE_FORMS:
            problems.append(f"score_form must be one of {SCORE_FORMS}, got {self.score_form!r}")
        if self.base not in BASE_SCORES:
            problems.append(f"base must be one of {BASE_SCORES}, got {self.base!r}")
        if self.rescoring not in RESCORINGS:
            problems.append(f"rescoring must be one of {RESCORINGS}, got {self.rescoring!r}")
        if self.earliest_k < 1:
            problems.append(f"earliest_k must be >= 1, got {self.earliest_k}")
        if self.temporal_strength < 0:
            problems.append(f"temporal_strength must be >= 0, got {self.temporal_strength}")
        if self.top_k < 1:
            problems.append(f"top_k must be >= 1, got {self.top_k}")
        if problems:
            raise ValueError("invalid SOAP configuration: " + "; ".join(problems))

    def as_output(self) -> dict[str, Any]:
        """The configuration as plain JSON values, for a prediction's output or a run's record."""
        return {
            "layer": self.layer,
            "band": [self.band.lo, self.band.hi],
            "attention_layers": list(self.attention_layers),
            "window": self.window,
            "top": self.top,
            "gamma": self.gamma,
            "dependents_norm": self.dependents_norm,
            "center": self.center,
            "normalize": self.normalize,
            "score_form": self.score_form,
            "base": self.base,
            "rescoring": self.rescoring,
            "earliest_k": self.earliest_k,
            "temporal_strength": self.temporal_strength,
            "top_k": self.top_k,
        }
