"""What results.db means: LongRCA scoring, paired statistics, repeatability, cost and reports.

Reads the store (read side) and the data layer; never calls a model and never writes results. The modules:
`scoring` (the benchmark's metrics and aggregates), `stats` (McNemar, Holm, paired bootstrap, agreement),
`submission` (the leaderboard's file formats), `results` (a run as scoring inputs), `cost` (the calls table
summed), `protocol` (the paper's main and ablation protocols, resolved per report), `fidelity` (LongRCA-Mini
against Full, App. A), `sensitivity` (root-step label sensitivity, App. K.1), `report` (all of it as one dict)
and `render` (that dict as text or one HTML page).
"""

from __future__ import annotations

from rcarun.data import parse_step

from .cost import ChargedCost, CostRow, charged_costs, cost_rows, nearest_rank
from .fidelity import CALIBRATION_SIZES, mini_fidelity, sample_size_calibration
from .protocol import MethodKind, Protocol, method_kinds, resolve_protocol, scoring_rule
from .render import render_html, render_text
from .report import METRIC_NAMES, MIN_READABLE_SHARE, ReportOptions, build_report, cell_status, metrics_json
from .results import Cell, Outcome, RunScores, load_run_scores, resolve_run
from .scoring import (
    ABSTENTION_RULES,
    LONGRCA_FULL_POPULATIONS,
    STEP_TOLERANCE,
    AbstentionRule,
    Expected,
    ItemScore,
    LengthGroup,
    LengthPartition,
    Metrics,
    Prediction,
    Summary,
    by_length_group,
    by_source,
    length_groups,
    macro,
    pooled,
    post_stratified,
    score_items,
    summarize,
)
from .sensitivity import label_sensitivity, load_annotations
from .stats import (
    BootstrapInterval,
    Complementarity,
    LeftOut,
    PairedComparison,
    ProportionInterval,
    adjust_family,
    cluster_paired_bootstrap,
    complementarity,
    holm,
    leave_one_source_out,
    mcnemar_exact,
    newcombe_difference,
    paired_comparison,
    pairwise_agreement,
    spread,
    stratified_paired_bootstrap,
    wilson_interval,
)
from .submission import (
    LeaderboardEntry,
    PredictionsFile,
    SubmissionScore,
    leaderboard_entry,
    load_labels,
    load_predictions_jsonl,
    references_from_dataset,
    score_submission,
    write_predictions_jsonl,
)
from .timing import CallTiming, call_timing

__all__ = [
    "ABSTENTION_RULES",
    "CALIBRATION_SIZES",
    "LONGRCA_FULL_POPULATIONS",
    "METRIC_NAMES",
    "MIN_READABLE_SHARE",
    "STEP_TOLERANCE",
    "AbstentionRule",
    "BootstrapInterval",
    "CallTiming",
    "Cell",
    "ChargedCost",
    "Complementarity",
    "CostRow",
    "Expected",
    "ItemScore",
    "LeaderboardEntry",
    "LeftOut",
    "LengthGroup",
    "LengthPartition",
    "MethodKind",
    "Metrics",
    "Outcome",
    "PairedComparison",
    "Prediction",
    "PredictionsFile",
    "ProportionInterval",
    "Protocol",
    "ReportOptions",
    "RunScores",
    "SubmissionScore",
    "Summary",
    "adjust_family",
    "build_report",
    "by_length_group",
    "by_source",
    "call_timing",
    "cell_status",
    "charged_costs",
    "cluster_paired_bootstrap",
    "complementarity",
    "cost_rows",
    "holm",
    "label_sensitivity",
    "leaderboard_entry",
    "leave_one_source_out",
    "length_groups",
    "load_annotations",
    "load_labels",
    "load_predictions_jsonl",
    "load_run_scores",
    "macro",
    "mcnemar_exact",
    "method_kinds",
    "metrics_json",
    "mini_fidelity",
    "nearest_rank",
    "newcombe_difference",
    "paired_comparison",
    "pairwise_agreement",
    "parse_step",
    "pooled",
    "post_stratified",
    "references_from_dataset",
    "render_html",
    "render_text",
    "resolve_protocol",
    "resolve_run",
    "sample_size_calibration",
    "score_items",
    "score_submission",
    "scoring_rule",
    "spread",
    "stratified_paired_bootstrap",
    "summarize",
    "wilson_interval",
    "write_predictions_jsonl",
]
