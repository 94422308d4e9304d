"""SOAP, spectral scoring with attention-guided propagation (paper 004): a frozen open-weight model's hidden
states and attentions locate the decisive step of a failed trajectory, with no prompting and no step labels.

Each part is a module of its own so that it can be tested alone, numpy only: the input plan (`inputs`,
App. A.2), the features a trajectory's passes leave (`features`, A.3), the spectral reference and base score
(`spectral`, §3.1), the dependency-aware rescoring (`dependency`, §3.2, B.1), the ablation alternatives
(`alternatives`, Tables 3–4), one configuration (`config`), splits and two-stage hyperparameter selection
(`selection`, A.3), and the scorer that answers one trajectory (`scorer`). The model side is
`rcarun.methods.forward.ForwardModel`. docs/methods/soap.md maps every rule to its paper section and code.
"""

from rcarun.methods.soap.alternatives import Ranking, base_scores, rank_order, rank_with
from rcarun.methods.soap.config import BASE_SCORES, RESCORINGS, BaseScore, Rescoring, SoapConfig
from rcarun.methods.soap.dependency import (
    ATTENTION_BANDS,
    DEPENDENTS_NORMS,
    AttentionBand,
    DependentsNorm,
    attention_band,
    average_attention,
    dependency_weights,
    propagate,
)
from rcarun.methods.soap.features import (
    DEFAULT_CONTEXT_TOKENS,
    TrajectoryFeatures,
    extract_features,
    plan_for,
)
from rcarun.methods.soap.inputs import (
    OVERSIZE_POLICIES,
    SHARING_MODES,
    InputPlan,
    Oversize,
    PlannedPass,
    Segments,
    Sharing,
    plan_passes,
    prepare_segments,
    step_segment,
    task_segment,
    window_starts,
)
from rcarun.methods.soap.scorer import SoapScorer, fit_soap_reference, rank_steps
from rcarun.methods.soap.selection import (
    DEFAULT_GAMMAS,
    DEFAULT_WINDOWS,
    LabelledFeatures,
    SelectionGrid,
    SelectionResult,
    SoapSplit,
    Stage1Row,
    Stage2Row,
    default_grid,
    select_hyperparameters,
    split_trajectories,
)
from rcarun.methods.soap.spectral import (
    SCORE_FORMS,
    Band,
    ScoreForm,
    SpectralReference,
    band_energy,
    fit_reference,
    leading_band,
    spectral_scores,
    tail_band,
)

__all__ = [
    "ATTENTION_BANDS",
    "BASE_SCORES",
    "DEFAULT_CONTEXT_TOKENS",
    "DEFAULT_GAMMAS",
    "DEFAULT_WINDOWS",
    "DEPENDENTS_NORMS",
    "OVERSIZE_POLICIES",
    "RESCORINGS",
    "SCORE_FORMS",
    "SHARING_MODES",
    "AttentionBand",
    "Band",
    "BaseScore",
    "DependentsNorm",
    "InputPlan",
    "LabelledFeatures",
    "Oversize",
    "PlannedPass",
    "Ranking",
    "Rescoring",
    "ScoreForm",
    "Segments",
    "SelectionGrid",
    "SelectionResult",
    "Sharing",
    "SoapConfig",
    "SoapScorer",
    "SoapSplit",
    "SpectralReference",
    "Stage1Row",
    "Stage2Row",
    "TrajectoryFeatures",
    "attention_band",
    "average_attention",
    "band_energy",
    "base_scores",
    "default_grid",
    "dependency_weights",
    "extract_features",
    "fit_reference",
    "fit_soap_reference",
    "leading_band",
    "plan_for",
    "plan_passes",
    "prepare_segments",
    "propagate",
    "rank_order",
    "rank_steps",
    "rank_with",
    "select_hyperparameters",
    "spectral_scores",
    "split_trajectories",
    "step_segment",
    "tail_band",
    "task_segment",
    "window_starts",
]
