"""A small run whose every shown value is known in advance, for the trajectory viewer's tests.

A JSONL dataset of three trajectories (one whose contents are hostile HTML, one long step among them, and one
unlabelled with an awkward qid), and a run over it written through the store: predictions that are right, near,
abstained and missing, and calls whose prompts, answers and reasoning carry markers a test can look for.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from playwright.sync_api import Browser, sync_playwright

from rcarun.analysis.viewer.chromium import CHROMIUM_FLAGS, find_chromium
from rcarun.data import iter_dataset
from rcarun.store import CallRow, ItemRow, PredictionRow, StoreWriter, TrajectoryRow, open_store

__all__ = [
    "HOSTILE",
    "HOSTILE_QID",
    "LONG_TAIL",
    "PLAIN_QID",
    "PROMPT_MARKER",
    "REASONING_MARKER",
    "WEIRD_QID",
    "ViewerRun",
    "build_viewer_run",
]

HOSTILE_QID: Final = "hostile/1"
PLAIN_QID: Final = "plain/2"
WEIRD_QID: Final = "odd qid/../Ünï <3>"
# Step 3 of HOSTILE_QID, the reference root: it must be shown as text and never run.
HOSTILE: Final = '<img src=x onerror="window.__pwned=1"></script><script>window.__pwned=2</script> & done'
# The end of step 5, a step long enough to be collapsed: absent from the page until the step is opened.
LONG_TAIL: Final = "LONG-STEP-TAIL-MARKER"
PROMPT_MARKER: Final = "PROMPT-MARKER-alpha-r0"
REASONING_MARKER: Final = "REASONING-MARKER-alpha-r0"
ANSWER_TEXT: Final = '{"reason": "the coder broke it", "responsible_role": "Coder", "root_step": 3}'
ROLES: Final = ("Planner", "Coder", "Verifier")


@dataclass(frozen=True, slots=True)
class ViewerRun:
    db: Path
    dataset: Path
    run_name: str


def _history(n: int, contents: dict[int, str]) -> list[dict[str, Any]]:
    return [{"role": ROLES[i % 3], "content": contents.get(i, f"step {i} says hello")} for i in range(n)]


def _write_dataset(path: Path) -> None:
    long_step = "x" * 900 + " " + LONG_TAIL
    records = [
        {
            "qid": HOSTILE_QID,
            "source": "hostile",
            "question": "Find the <b>bug</b>",
            "history": _history(12, {3: HOSTILE, 5: long_step}),
            "mistake_agent": "Coder",
            "mistake_step": 3,
            "mistake_reason": "the coder used the wrong file",
        },
        {
            "qid": PLAIN_QID,
            "source": "plain",
            "question": "Plan a trip",
            "history": _history(5, {}),
            "mistake_agent": "Coder",
            "mistake_step": 1,
        },
        {"qid": WEIRD_QID, "source": "plain", "question": "Unlabelled", "history": _history(4, {})},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def _body(content: str, reasoning: str) -> bytes:
    message = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    return json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "model": "sim",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150},
        }
    ).encode()


def _request(marker: str) -> bytes:
    messages = [
        {"role": "system", "content": "You diagnose failures."},
        {"role": "user", "content": f"Read the log. {marker} <i>not markup</i>"},
    ]
    return json.dumps({"messages": messages, "max_tokens": 64, "temperature": 0.0}, sort_keys=True).encode()


async def _build(db: Path, dataset: Path, name: str) -> None:
    config = {
        "sweep": {"dataset": str(dataset), "realizations": 2},
        "backbones": {"alpha": {"provider": "simulated"}, "beta": {"provider": "openai-compatible"}},
        "methods": [{"name": "all-at-once", "label": "aao", "options": {}}],
    }
    store = open_store(db)
    try:
        run_id = store.get_or_create_run(name, json.dumps(config))
    finally:
        store.close()
    records = list(iter_dataset(dataset))
    async with StoreWriter(db) as writer:
        for record in records:
            t = record.trajectory
            writer.add_trajectory(
                TrajectoryRow(
                    run_id=run_id,
                    qid=t.qid,
                    source=t.source,
                    n_steps=t.n_steps,
                    roles_json=json.dumps([s.agent for s in t.steps]),
                    ref_role=record.reference.role if record.reference else None,
                    ref_step=record.reference.step if record.reference else None,
                    sha256=t.sha256,
                )
            )

        def keys(backbone: str, qid: str, realization: int) -> dict[str, Any]:
            return {
                "run_id": run_id,
                "item_id": f"{backbone}|aao|{qid}|r{realization}",
                "backbone": backbone,
                "method": "aao",
                "qid": qid,
                "realization": realization,
            }

        def predict(
            backbone: str, qid: str, realization: int, role: str | None, step: int | None, **extra: Any
        ) -> None:
            k = keys(backbone, qid, realization)
            writer.set_item(ItemRow(**k, status="done", attempts=1))
            output = extra.pop("output", {})
            writer.add_prediction(
                PredictionRow(
                    **k,
                    pred_role=role,
                    pred_step=step,
                    role_valid=role in ROLES,
                    step_valid=step is not None,
                    abstained=extra.pop("abstained", False),
                    output_json=json.dumps(output),
                    **extra,
                )
            )

        def call(
            k: dict[str, Any], attempt: int, status: str, request: bytes, body: bytes | None, **extra: Any
        ) -> None:
            row = {key: k[key] for key in ("run_id", "item_id", "backbone", "method", "qid", "realization")}
            writer.add_call(
                CallRow(
                    **row,
                    model="sim",
                    stage="attribution",
                    attempt=attempt,
                    max_tokens=64 * attempt,
                    status=status,  # type: ignore[arg-type]
                    started_at="2025-01-01T00:00:00.000Z",
                    request_sha256=writer.put_blob(request),
                    response_sha256=writer.put_blob(body) if body is not None else None,
                    **extra,
                )
            )

        output = {"answer": {"reason": "the coder broke it <b>", "evidence": ["step 3", "step 4"]}}
        predict("alpha", HOSTILE_QID, 0, "Coder", 3, output=output)
        alpha0 = keys("alpha", HOSTILE_QID, 0)
        call(
            alpha0,
            1,
            "length",
            _request(PROMPT_MARKER),
            _body("", "cut"),
            prompt_tokens=120,
            completion_tokens=64,
            cost_usd=0.0125,
            latency_ms=812.0,
            finish_reason="length",
        )
        call(
            alpha0,
            2,
            "ok",
            _request(PROMPT_MARKER),
            _body(ANSWER_TEXT, REASONING_MARKER),
            prompt_tokens=120,
            completion_tokens=30,
            cost_usd=0.0075,
            latency_ms=400.0,
            finish_reason="stop",
        )
        predict("alpha", HOSTILE_QID, 1, "Planner", 5, output={"reason": "planner misread"})
        call(keys("alpha", HOSTILE_QID, 1), 1, "ok", _request("r1"), _body("{}", ""), prompt_tokens=100)
        predict("beta", HOSTILE_QID, 0, None, None, abstained=True, output={"abstain_reason": "unsure"})
        beta1 = keys("beta", HOSTILE_QID, 1)
        writer.set_item(ItemRow(**beta1, status="failed", error="retries exhausted", attempts=3))
        call(
            beta1,
            1,
            "error",
            _request("beta"),
            b'{"error": {"message": "overloaded"}}',
            error="HTTP 503: overloaded",
            error_kind="server_error",
            http_status=503,
        )
        predict("alpha", PLAIN_QID, 0, "Coder", 1)
        predict("alpha", PLAIN_QID, 1, "Coder", 4)
        predict("alpha", WEIRD_QID, 0, "Planner", 0)


def build_viewer_run(directory: Path, *, name: str = "viewer") -> ViewerRun:
    """Write the dataset and the run into ``directory`` (``data.jsonl``, ``results.db``)."""
    dataset = directory / "data.jsonl"
    db = directory / "results.db"
    _write_dataset(dataset)
    asyncio.run(_build(db, dataset, name))
    return ViewerRun(db=db, dataset=dataset, run_name=name)


@contextmanager
def launched_chromium() -> Iterator[Browser]:
    """Debian's Chromium through Playwright, closed on the way out; the test is skipped when there is none."""
    chromium = find_chromium()
    if chromium is None:
        pytest.skip(
            "Chromium is not installed and could not be (make test runs apt-get install chromium as root)"
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=list(CHROMIUM_FLAGS))
        try:
            yield browser
        finally:
            browser.close()
