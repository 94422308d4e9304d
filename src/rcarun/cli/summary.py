"""What `rcarun sweep` prints when it ends, and the exit status that says how it went."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from rcarun.runner import SweepOutcome
from rcarun.store import BackboneSummary, ItemRow, Store, open_store

__all__ = [
    "EXIT_FINISHED",
    "EXIT_ITEMS_FAILED",
    "EXIT_NOTHING_READABLE",
    "EXIT_STOPPED",
    "exit_status",
    "print_accuracy",
    "print_summary",
]

# 0: every item has a prediction; 3: stopped early, resumable (a budget, Ctrl-C, a backbone stopped); 4: ran to
# the end but items failed for good; 5: ran to the end but not one answer of some backbone could be read (a
# wrong model or endpoint, not a finding). 130 (cancelled) and 2 (unusable config, data or results.db) are
# `rcarun.cli`'s.
EXIT_FINISHED = 0
EXIT_STOPPED = 3
EXIT_ITEMS_FAILED = 4
EXIT_NOTHING_READABLE = 5
# One example message per cause in the closing summary is cut to this many characters.
_EXAMPLE_CHARS = 160
_HTTP_STATUS = re.compile(r"HTTP (\d{3})")
_BANNER = (
    "SIMULATED BACKBONES — every backbone below is rcarun's mock server on loopback, or a local model with "
    "random weights (tiny); the numbers show the engine at work, not any model's accuracy."
)


def _cause(error: str | None) -> str:
    """A failed item's cause for grouping: the error class, with the HTTP status when there was one."""
    text = error or "no message"
    head = text.split(":", 1)[0].strip()
    if head.startswith("unexpected "):
        return head
    kind = head if head.isidentifier() else "other"
    status = _HTTP_STATUS.search(text)
    return f"{kind} (HTTP {status.group(1)})" if status else kind


def _print_causes(failed: Sequence[ItemRow]) -> None:
    """Failed items grouped by backbone and cause, the largest groups first, one example message each."""
    print()
    print("failed items by cause (one example each):")
    causes: dict[tuple[str, str], list[str]] = {}
    for item in failed:
        causes.setdefault((item.backbone, _cause(item.error)), []).append(item.error or "")
    for (backbone, cause), errors in sorted(causes.items(), key=lambda entry: (entry[0][0], -len(entry[1]))):
        example = " ".join(errors[0].split())
        head, _, rest = example.partition(": ")
        if rest and cause.startswith(head):
            example = rest  # the cause already names the class
        if len(example) > _EXAMPLE_CHARS:
            example = example[: _EXAMPLE_CHARS - 1] + "…"
        print(f"  {backbone:<16} {len(errors):>5}  {cause}: {example}")


def print_summary(db: Path, outcome: SweepOutcome, simulated: bool, resume: str) -> None:
    with open_store(db) as store:
        rows = store.backbone_summary(outcome.run_id)
        items = store.items(outcome.run_id)
        invalid = _invalid_predictions(store, outcome.run_id)
    if simulated:
        print(_BANNER)
    print(
        f"run {outcome.run_name!r} (id {outcome.run_id}) {outcome.status}: {outcome.trajectories} trajectories, "
        f"{outcome.data_problems} data problems, results in {db}"
    )
    header = (
        f"{'backbone':<16} {'items':>6} {'failed':>6} {'skipped':>7} {'left':>6} {'calls':>6} {'attempts':>8} "
        f"{'cached':>6} {'tokens':>10} {'USD':>9} {'429s':>5} {'len-retry':>9} {'preds':>6} {'invalid':>7}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        counters = outcome.counters.get(row.backbone)
        planned = counters.items_total if counters is not None else 0
        left = max(0, planned - row.items_done - row.items_failed)
        print(
            f"{row.backbone:<16} {row.items_done:>6} {row.items_failed:>6} {row.items_skipped:>7} {left:>6} "
            f"{row.calls:>6} {row.attempts:>8} {row.cached_calls:>6} {row.total_tokens:>10,} "
            f"{row.cost_usd:>9.4f} {row.rate_limited:>5} {row.length_retries:>9} {row.predictions:>6} "
            f"{invalid.get(row.backbone, 0):>7}"
        )
    failed = [item for item in items if item.status == "failed"]
    if failed:
        _print_causes(failed)
    if invalid:
        print(
            f"{sum(invalid.values())} predictions come from answers that could not be read (predictions.error); "
            "rcarun report counts them per method"
        )
    unreadable = _unreadable_backbones(rows, invalid)
    for row in rows:
        if row.backbone in unreadable:
            print(
                f"backbone {row.backbone!r}: not one of its {row.predictions} answers could be read; check its "
                "model, provider and base_url (rcarun show prints an answer as it came)"
            )
    for reason in outcome.stop_reasons:
        print(f"stopped early: {reason}")
    skipped = sum(row.items_skipped for row in rows)
    if skipped:
        print(
            f"{skipped} items were skipped when a budget was reached: raise it in the config before resuming"
        )
    if outcome.status != "finished":
        print(f"resume with: {resume}")
    if failed:
        print(
            f"retry the {len(failed)} failed items (after fixing their cause) with: {resume} --retry-failed"
        )


def exit_status(db: Path, outcome: SweepOutcome) -> int:
    if outcome.status != "finished":
        return EXIT_STOPPED
    with open_store(db) as store:
        rows = store.backbone_summary(outcome.run_id)
        invalid = _invalid_predictions(store, outcome.run_id)
    if any(row.items_failed for row in rows):
        return EXIT_ITEMS_FAILED
    return EXIT_NOTHING_READABLE if _unreadable_backbones(rows, invalid) else EXIT_FINISHED


def _invalid_predictions(store: Store, run_id: int) -> dict[str, int]:
    """Predictions per backbone that come from answers that could not be read."""
    return {
        str(row[0]): int(row[1])
        for row in store.connection.execute(
            "SELECT backbone, count(*) FROM predictions WHERE run_id = ? AND error IS NOT NULL GROUP BY backbone",
            (run_id,),
        )
    }


def _unreadable_backbones(rows: Sequence[BackboneSummary], invalid: Mapping[str, int]) -> set[str]:
    """Backbones with predictions of which not one came from an answer that could be read."""
    return {
        row.backbone for row in rows if row.predictions and invalid.get(row.backbone, 0) >= row.predictions
    }


def print_accuracy(db: Path, outcome: SweepOutcome) -> None:
    """The report's accuracy table (Table 3 layout), with a pointer to the full report."""
    from rcarun.analysis import ReportOptions, build_report, render_text

    with open_store(db) as store:
        report = build_report(store, outcome.run_id, ReportOptions(resamples=1))
    lines = render_text(report, sections=("accuracy",)).splitlines()
    body = lines[next(i for i, line in enumerate(lines) if line.startswith("Accuracy")) :]
    print()
    print("\n".join(body))
    print(f"full report: rcarun report --db {db} --run {outcome.run_name} [--html report.html]")
