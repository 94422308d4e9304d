"""Stages a method declares shareable are paid once per trajectory and realization across its conditions."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from helpers.sweeps import make_config, rows
from rcarun.data import Trajectory
from rcarun.methods import LLM, Attribution, Message, Method, method, registered_methods, registry
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import run_sweep

_SCHEMA = {
    "type": "object",
    "properties": {"note": {"type": "string"}},
    "required": ["note"],
    "additionalProperties": False,
}


class _TwoStage(Method):
    """A stand-in for RCTA: a shared preparation stage, then a condition-specific final stage."""

    shareable_stages = frozenset({"prep"})

    def __init__(self, label: str) -> None:
        self.label = label

    async def attribute(self, trajectory: Trajectory, llm: LLM) -> Attribution:
        prompt = [Message("user", f"summarise {trajectory.qid}")]
        await llm.chat(prompt, stage="prep", max_tokens=64, schema=_SCHEMA)
        await llm.chat(prompt, stage="final", max_tokens=64, schema=_SCHEMA)  # identical, but not shareable
        return Attribution(pred_role=None, pred_step=None, role_valid=False, step_valid=False, abstained=True)


@pytest.fixture
def two_stage_method() -> Iterator[str]:
    """Registered for this test only: the demo and other tests run every registered method."""
    name = "test-two-stage"

    @method(name)
    def _create(label: str, options: Mapping[str, Any]) -> _TwoStage:
        return _TwoStage(label)

    try:
        yield name
    finally:
        registry._REGISTRY.pop(name, None)
    assert name not in registered_methods()


async def test_conditions_share_declared_stages_within_one_fresh_run(
    tmp_path: Path, two_stage_method: str
) -> None:
    db = tmp_path / "results.db"
    async with MockServer(MockConfig(latency_s=0.05)) as server:
        config = make_config(
            {"sim": {"base_url": server.base_url, "limits": {"concurrency": 8}}},
            realizations=2,
            methods=[{"name": two_stage_method, "label": label} for label in ("a", "b", "c")],
        )
        outcome = await run_sweep(config, db_path=db, run_name="s", show_progress=False)
        accepted = server.stats().accepted

    assert outcome.status == "finished"
    trajectories, realizations, conditions = 10, 2, 3
    paid = dict(rows(db, "SELECT stage, count(*) FROM calls WHERE status = 'ok' GROUP BY stage"))
    cached = dict(rows(db, "SELECT stage, count(*) FROM calls WHERE status = 'cached' GROUP BY stage"))
    # "prep" is paid once per trajectory x realization; the two other conditions are served the same answer.
    assert paid == {"prep": trajectories * realizations, "final": trajectories * realizations * conditions}
    assert cached == {"prep": trajectories * realizations * (conditions - 1)}
    assert accepted == paid["prep"] + paid["final"]
    # Realizations never serve each other: every (qid, realization) paid its own prep call.
    assert rows(
        db,
        "SELECT count(DISTINCT qid || '|' || realization) FROM calls WHERE stage = 'prep' AND status = 'ok'",
    ) == [(trajectories * realizations,)]
    # A cached row points at the answer the paid row stored.
    assert rows(
        db,
        "SELECT count(*) FROM calls c WHERE c.status = 'cached' AND NOT EXISTS (SELECT 1 FROM calls p "
        "WHERE p.status = 'ok' AND p.cache_key = c.cache_key AND p.response_sha256 = c.response_sha256)",
    ) == [(0,)]
