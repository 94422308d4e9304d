"""The typed report: what `build_report` returns and the renderers read; JSON only at the CLI's edge.

The top level, the run, the excluded cells, the cost rows, what served the backbones and the call timing are typed; each other section keeps the
rows its builder makes (JSON-shaped mappings, schema in docs/analysis.md). `Report.to_json` is exactly the
document ``rcarun report --json`` prints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from ..cost import CostRow, ServedBy
from ..timing import CallTiming

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
class Excluded:
    """A realization-0 cell left out of the paired comparisons and complementarity: its number is not shown."""

    backbone: str
    method: str
    status: str

    def to_json(self) -> dict[str, Any]:
        return {"backbone": self.backbone, "method": self.method, "status": self.status}


@dataclass(frozen=True, slots=True)
class Report:
    """One run's report. A field left at its default is a part the report does not have (a hand-built one).

    The fields' order is the JSON's key order (`to_json`): add a field where its key belongs.
    """

    run: RunInfo | None = None
    db: str | None = None
    simulated: bool = False
    aggregate: str | None = None
    reference_method: str | None = None
    expected: int | None = None
    unlabelled: int | None = None
    protocol: Part = None
    outcomes: Rows = ()
    excluded: Sequence[Excluded] = ()
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
    cost: Sequence[CostRow] = ()
    served_by: Sequence[
        ServedBy
    ] = ()  # what served each managed backbone (vLLM, command lines), its GPU charge
    call_timing: Sequence[
        CallTiming
    ] = ()  # per backbone: streamed or not, time to first token, decode rate, cuts

    def to_json(self) -> dict[str, Any]:
        """The report as ``rcarun report --json`` prints it: the fields in order, each as JSON."""
        return {field.name: _json(getattr(self, field.name)) for field in fields(self)}


def _json(value: object) -> object:
    if isinstance(value, RunInfo):
        return value.to_json()
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, list | tuple):
        return [
            row.to_json() if isinstance(row, Excluded | CostRow | CallTiming | ServedBy) else dict(row)
            for row in value
        ]
    return value
