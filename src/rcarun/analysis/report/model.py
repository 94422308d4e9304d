"""The typed report: what `build_report` returns and the renderers read; JSON only at the CLI's edge.

The top level and the run are typed; each section keeps the rows its builder makes (JSON-shaped mappings, schema
in docs/analysis.md), so `Report.to_json` is exactly the document ``rcarun report --json`` prints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Rows = Sequence[Mapping[str, Any]]
"""A section's rows, each a JSON object."""

Part = Mapping[str, Any] | None
"""A section that is one JSON object, or None when the run cannot have it."""


@dataclass(frozen=True, slots=True)
class RunInfo:
    """The run a report is of."""

    name: str
    run_id: int
    status: str
    created_at: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "run_id": self.run_id,
            "status": self.status,
            "created_at": self.created_at,
        }


@dataclass(frozen=True, slots=True)
class Report:
    """One run's report. A field left at its default is a part the report does not have (a hand-built one)."""

    run: RunInfo | None = None
    db: str | None = None
    simulated: bool = False
    aggregate: str | None = None
    reference_method: str | None = None
    expected: int | None = None
    unlabelled: int | None = None
    protocol: Part = None
    outcomes: Rows = ()
    excluded: Rows = ()
    metrics: Rows = ()
    paired: Rows = ()
    paired_backbones: Rows = ()
    paired_across: Rows = ()
    complementarity: Rows = ()
    components: Part = None
    repeatability: Rows = ()
    recall: Rows = ()
    turns: Rows = ()
    task_clusters: Part = None
    leave_one_source_out: Part = None
    length_groups: Rows = ()
    length_contrasts: Rows = ()
    fidelity: Part = None
    calibration: Part = None
    label_sensitivity: Part = None
    cost: Rows = ()
    served_by: Rows = ()  # what served each managed backbone (vLLM version, command lines) and its GPU charge
    call_timing: Rows = ()  # streamed or not, time to first token, decode rate, cut generations per backbone

    def to_json(self) -> dict[str, Any]:
        """The report as ``rcarun report --json`` prints it (key order included)."""
        return {
            "run": None if self.run is None else self.run.to_json(),
            "db": self.db,
            "simulated": self.simulated,
            "aggregate": self.aggregate,
            "reference_method": self.reference_method,
            "expected": self.expected,
            "unlabelled": self.unlabelled,
            "protocol": _part(self.protocol),
            "outcomes": _rows(self.outcomes),
            "excluded": _rows(self.excluded),
            "metrics": _rows(self.metrics),
            "paired": _rows(self.paired),
            "paired_backbones": _rows(self.paired_backbones),
            "paired_across": _rows(self.paired_across),
            "complementarity": _rows(self.complementarity),
            "components": _part(self.components),
            "repeatability": _rows(self.repeatability),
            "recall": _rows(self.recall),
            "turns": _rows(self.turns),
            "task_clusters": _part(self.task_clusters),
            "leave_one_source_out": _part(self.leave_one_source_out),
            "length_groups": _rows(self.length_groups),
            "length_contrasts": _rows(self.length_contrasts),
            "fidelity": _part(self.fidelity),
            "calibration": _part(self.calibration),
            "label_sensitivity": _part(self.label_sensitivity),
            "cost": _rows(self.cost),
            "served_by": _rows(self.served_by),
            "call_timing": _rows(self.call_timing),
        }


def report_json(report: Report) -> dict[str, Any]:
    """The report as ``rcarun report --json`` prints it."""
    return report.to_json()


def _rows(rows: Rows) -> list[dict[str, Any]]:
    return [dict(row) for row in rows]


def _part(part: Part) -> dict[str, Any] | None:
    return None if part is None else dict(part)
