"""LongRCA records of any length: the five source shapes of ``tests/data/longrca_shapes`` padded with neutral steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SHAPES = Path(__file__).resolve().parents[1] / "data" / "longrca_shapes"
SOURCES = ("swe_bench_pro", "terminal_bench_2", "travelplanner", "vitabench", "webarena_verified")


def shape(source: str) -> dict[str, Any]:
    """The source's shape record, as the release writes it."""
    return json.loads((SHAPES / source / f"{source}__900.json").read_text())  # type: ignore[no-any-return]


def padded(raw: dict[str, Any], n_steps: int, filler_chars: int) -> dict[str, Any]:
    """The record with neutral workflow steps inserted after its opening, so that its log is ``n_steps`` long.

    The opening (the task's steps and the first workflow step) and the original ending stay as they are; the
    label moves with the step it names.
    """
    history = raw["history"]
    opening = next(i for i, item in enumerate(history) if i > 0 and item["name"] != history[0]["name"])
    workers = [
        item["name"] for item in history[opening:] if item["name"] not in ("human", history[0]["name"])
    ]
    inserted = n_steps - len(history)
    filler = [
        {
            "name": workers[i % len(workers)],
            "role": "assistant",
            "content": f"Progress note {i}: item {i} of the checklist was looked at and recorded. "
            + "Details follow. " * max(0, (filler_chars - 70) // 16),
        }
        for i in range(inserted)
    ]
    items = [*history[: opening + 1], *filler, *history[opening + 1 :]]
    record = dict(raw)
    record["history"] = [{**item, "step": index} for index, item in enumerate(items)]
    if raw["mistake_step"] > opening:
        record["mistake_step"] = raw["mistake_step"] + inserted
    return record


def write_padded(directory: Path, source: str, n_steps: int, filler_chars: int) -> Path:
    """Write the source's shape padded to ``n_steps`` as ``<directory>/<source>/<question_ID>.json``."""
    raw = shape(source)
    folder = directory / source
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{raw['question_ID']}.json"
    path.write_text(json.dumps(padded(raw, n_steps, filler_chars)))
    return path
