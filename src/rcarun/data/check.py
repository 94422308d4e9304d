"""`rcarun data check`: every problem of a dataset, by file, record and field, and what the dataset holds.

Before paying for a sweep a researcher wants the whole list at once, plus the facts that decide cost and
difficulty; no label is changed. Severities and the summary: docs/reliability.md ("rcarun data check").
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rcarun.errors import DataError, data_location

from .loaders import iter_dataset
from .manifest import Manifest, ManifestRecord
from .roles import normalize_role
from .trajectory import Record

__all__ = ["CheckReport", "Problem", "SourceSummary", "check_dataset", "check_records"]

Severity = Literal["error", "warning"]


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding (``"error"`` or ``"warning"``, a stable ``kind``), located as precisely as the data allows."""

    severity: Severity
    kind: str
    message: str
    path: str = ""
    record: str = ""
    field: str = ""

    def __str__(self) -> str:
        where = data_location(self.path, self.record, self.field)
        return f"{self.severity}: {where}: {self.message}" if where else f"{self.severity}: {self.message}"


@dataclass(slots=True)
class SourceSummary:
    """What one source's loaded records hold; ``root_to_end`` is ``n_steps - 1 - reference step`` per label."""

    source: str
    trajectories: int = 0
    labelled: int = 0
    steps: int = 0
    history_chars: int = 0
    root_to_end: list[int] = field(default_factory=list)
    task_sources: Counter[str] = field(default_factory=Counter)

    @property
    def median_root_to_end(self) -> float | None:
        return float(statistics.median(self.root_to_end)) if self.root_to_end else None


@dataclass(slots=True)
class CheckReport:
    """The outcome of a check: problems in the order found, and one summary per source (sorted by name)."""

    path: str
    problems: list[Problem] = field(default_factory=list)
    sources: dict[str, SourceSummary] = field(default_factory=dict)
    manifest_records: int | None = None
    manifest_verified: int = 0
    manifest_unlisted: int = 0

    @property
    def errors(self) -> list[Problem]:
        return [problem for problem in self.problems if problem.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [problem for problem in self.problems if problem.severity == "warning"]

    @property
    def ok(self) -> bool:
        """True when no record is unusable and the manifest, if any, matched file by file."""
        return not self.errors

    @property
    def loaded(self) -> int:
        return sum(summary.trajectories for summary in self.sources.values())


def check_dataset(path: str | Path, *, manifest: Manifest | None = None) -> CheckReport:
    """Check every record under ``path`` (any layout `iter_dataset` reads), and the manifest if one is given."""
    report = CheckReport(path=str(path))

    def on_problem(problem: DataError) -> None:
        report.problems.append(
            Problem("error", "unusable", problem.message, problem.path, problem.record, problem.field)
        )

    check_records(iter_dataset(path, strict=False, on_problem=on_problem), report, manifest=manifest)
    return report


def check_records(
    records: Iterable[Record], report: CheckReport, *, manifest: Manifest | None = None
) -> None:
    """Add the findings and summaries of loaded ``records`` to ``report`` (manifest checks included)."""
    expected = manifest.by_qid() if manifest is not None else None
    seen: set[str] = set()
    for record in records:
        trajectory = record.trajectory
        seen.add(trajectory.qid)
        summary = report.sources.setdefault(trajectory.source, SourceSummary(trajectory.source))
        summary.trajectories += 1
        summary.steps += trajectory.n_steps
        summary.history_chars += sum(len(step.content) for step in trajectory.steps)
        summary.task_sources[trajectory.task_source] += 1
        _check_record(record, report, summary)
        if expected is not None:
            _check_against_manifest(record, expected, report)
    if manifest is not None:
        report.manifest_records = len(manifest.records)
        for listed in manifest.records:
            if listed.qid not in seen:
                report.problems.append(
                    Problem(
                        "error",
                        "manifest_missing",
                        f"listed in the manifest ({listed.source}) but not loaded from the dataset",
                        path=listed.path or "",
                        record=listed.qid,
                    )
                )
    report.sources = dict(sorted(report.sources.items()))


def _check_record(record: Record, report: CheckReport, summary: SourceSummary) -> None:
    trajectory, reference = record.trajectory, record.reference

    def warn(kind: str, message: str, field: str = "", path: str = record.origin) -> None:
        report.problems.append(Problem("warning", kind, message, path, trajectory.qid, field))

    repaired = record.repaired_fields
    if repaired:
        shown = ", ".join(repaired[:10]) + (f" and {len(repaired) - 10} more" if len(repaired) > 10 else "")
        warn("repaired_text", f"unpaired UTF-16 surrogates replaced by U+FFFD in {shown}")
    if not trajectory.task:
        warn(
            "no_task",
            "no task: no question and nothing in the opening step of the history "
            "(every method will show 'Task: (not recorded)')",
            "history[0].content",
        )
    empty = [step.index for step in trajectory.steps if not step.content.strip()]
    if empty:
        shown = ", ".join(str(index) for index in empty[:10]) + (" ..." if len(empty) > 10 else "")
        warn("empty_content", f"{len(empty)} step(s) with empty content: {shown}", "history[].content")
    if reference is None:
        warn("unlabelled", "no mistake_agent/mistake_step: can run, cannot be scored", path="")
        return
    summary.labelled += 1
    summary.root_to_end.append(trajectory.n_steps - 1 - reference.step)
    speaker = trajectory.steps[reference.step].agent
    if normalize_role(speaker) != normalize_role(reference.role):
        warn(
            "noisy_label",
            f"labelled agent {reference.role!r} but step {reference.step} is spoken by {speaker!r} "
            "(kept as recorded)",
            "mistake_step",
        )


def _check_against_manifest(record: Record, expected: dict[str, ManifestRecord], report: CheckReport) -> None:
    trajectory = record.trajectory
    listed = expected.get(trajectory.qid)
    if listed is None:
        report.manifest_unlisted += 1
        return
    if listed.sha256 != trajectory.sha256:
        report.problems.append(
            Problem(
                "error",
                "manifest_sha256",
                f"SHA-256 {trajectory.sha256} differs from the manifest's {listed.sha256}",
                path=record.origin,
                record=trajectory.qid,
            )
        )
    else:
        report.manifest_verified += 1
