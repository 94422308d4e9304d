"""What results.db means: LongRCA scoring, paired statistics, repeatability, cost and reports.

Reads the store (read side) and the data layer; never calls a model and never writes results. The modules:
`scoring` (the benchmark's metrics and aggregates), `stats` (McNemar, Holm, paired bootstrap, agreement),
`submission` (the leaderboard's file formats), `results` (a run as scoring inputs), `cost` (the calls table
summed), `report` (all of it as one dict) and `render` (that dict as text or one HTML page).
"""

from __future__ import annotations

from .cost import ChargedCost, CostRow, charged_costs, cost_rows, nearest_rank
from .render import render_html, render_text
from .report import METRIC_NAMES, ReportOptions, build_report, metrics_json
from .results import Cell, RunScores, load_run_scores, resolve_run
from .scoring import (
    LONGRCA_FULL_POPULATIONS,
    STEP_TOLERANCE,
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
    parse_step,
    pooled,
    post_stratified,
    score_items,
    summarize,
)
from .stats import (
    BootstrapInterval,
    Complementarity,
    PairedComparison,
    adjust_family,
    complementarity,
    holm,
    mcnemar_exact,
    paired_comparison,
    pairwise_agreement,
    spread,
    stratified_paired_bootstrap,
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

__all__ = [
    "LONGRCA_FULL_POPULATIONS",
    "METRIC_NAMES",
    "STEP_TOLERANCE",
    "BootstrapInterval",
    "Cell",
    "ChargedCost",
    "Complementarity",
    "CostRow",
    "Expected",
    "ItemScore",
    "LeaderboardEntry",
    "LengthGroup",
    "LengthPartition",
    "Metrics",
    "PairedComparison",
    "Prediction",
    "PredictionsFile",
    "ReportOptions",
    "RunScores",
    "SubmissionScore",
    "Summary",
    "adjust_family",
    "build_report",
    "by_length_group",
    "by_source",
    "charged_costs",
    "complementarity",
    "cost_rows",
    "holm",
    "leaderboard_entry",
    "length_groups",
    "load_labels",
    "load_predictions_jsonl",
    "load_run_scores",
    "macro",
    "mcnemar_exact",
    "metrics_json",
    "nearest_rank",
    "paired_comparison",
    "pairwise_agreement",
    "parse_step",
    "pooled",
    "post_stratified",
    "references_from_dataset",
    "render_html",
    "render_text",
    "resolve_run",
    "score_items",
    "score_submission",
    "spread",
    "stratified_paired_bootstrap",
    "summarize",
    "write_predictions_jsonl",
]
