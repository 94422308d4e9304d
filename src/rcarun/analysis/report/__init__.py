"""One run's report as typed data: accuracy, outcomes, paired comparisons, studies and cost.

`rcarun report` prints it (text), dumps it (``--json``, `Report.to_json`) or renders it (``--html``) from the one
`Report` built here, so the page, the terminal and a script see identical numbers; accuracies are fractions. The
rules each part follows (protocols, Holm families, component study, Mini calibration, label sensitivity, outcomes) and the
JSON schema are in docs/analysis.md.
"""

from __future__ import annotations

from .build import build_report
from .cells import cell_status, metrics_json
from .model import Excluded, Report, RunInfo
from .options import (
    CALIBRATION_SEED,
    DEFAULT_DRAWS,
    METRIC_NAMES,
    MIN_READABLE_SHARE,
    RECALL_SETS,
    ReportOptions,
)

__all__ = [
    "CALIBRATION_SEED",
    "DEFAULT_DRAWS",
    "METRIC_NAMES",
    "MIN_READABLE_SHARE",
    "RECALL_SETS",
    "Excluded",
    "Report",
    "ReportOptions",
    "RunInfo",
    "build_report",
    "cell_status",
    "metrics_json",
]
