"""Runs written row by row through the store, for tests whose every number is known in advance.

`build_run` writes the trajectories, one done item and one prediction per `Pred`, and a stored sweep config
naming each method label's registry name (which is how a report tells RCTA's component conditions and the
paper's baselines apart) and, when given, each backbone's provider (how it tells a local backbone, SOAP's, from
the chat ones) and the ids a cell answers (a ``method_prepared`` event, as SOAP's test split).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rcarun.data import task_key
from rcarun.store import (
    METHOD_PREPARED,
    EventRow,
    ItemRow,
    PredictionRow,
    StoreWriter,
    TrajectoryRow,
    open_store,
)

__all__ = ["Pred", "Traj", "build_run"]


@dataclass(frozen=True)
class Traj:
    """One labelled trajectory."""

    qid: str
    source: str
    ref_role: str = "Planner"
    ref_step: int = 10
    n_steps: int = 40
    roles: tuple[str, ...] = ("Planner", "Coder", "Verifier", "DiagnostAgent (-> ActionAgent)")
    task: str | None = None  # the task instruction, stored as its key (`rcarun.data.task_key`)


@dataclass(frozen=True)
class Pred:
    """One prediction (``output`` becomes ``output_json``)."""

    backbone: str
    method: str
    qid: str
    role: str | None
    step: int | None
    abstained: bool = False
    output: dict[str, Any] | None = None
    realization: int = 0


Scope = tuple[str, str, int]
"""(backbone, method, realization) of a cell that answers only some of the run's trajectories."""


async def _build(
    db: Path,
    name: str,
    config: dict[str, Any],
    trajs: list[Traj],
    preds: list[Pred],
    scopes: dict[Scope, list[str]],
) -> int:
    store = open_store(db)
    try:
        run_id = store.get_or_create_run(name, json.dumps(config))
    finally:
        store.close()
    async with StoreWriter(db) as writer:
        for (backbone, method, realization), items in scopes.items():
            detail = {"backbone": backbone, "method": method, "realization": realization, "items": items}
            writer.add_event(EventRow(run_id=run_id, kind=METHOD_PREPARED, detail_json=json.dumps(detail)))
        for traj in trajs:
            writer.add_trajectory(
                TrajectoryRow(
                    run_id=run_id,
                    qid=traj.qid,
                    source=traj.source,
                    n_steps=traj.n_steps,
                    roles_json=json.dumps(list(traj.roles)),
                    ref_role=traj.ref_role,
                    ref_step=traj.ref_step,
                    sha256=hashlib.sha256(traj.qid.encode()).hexdigest(),
                    task_sha256=task_key(traj.task) if traj.task else None,
                )
            )
        for pred in preds:
            keys = {
                "run_id": run_id,
                "item_id": f"{pred.backbone}|{pred.method}|{pred.qid}|r{pred.realization}",
                "backbone": pred.backbone,
                "method": pred.method,
                "qid": pred.qid,
                "realization": pred.realization,
            }
            writer.set_item(ItemRow(**keys, status="done", attempts=1))
            writer.add_prediction(
                PredictionRow(
                    **keys,
                    pred_role=pred.role,
                    pred_step=pred.step,
                    role_valid=pred.role is not None,
                    step_valid=pred.step is not None,
                    abstained=pred.abstained,
                    output_json=json.dumps(pred.output or {}),
                )
            )
    return run_id


def build_run(
    db: Path,
    name: str,
    trajs: list[Traj],
    preds: list[Pred],
    *,
    methods: list[dict[str, Any]] | None = None,
    manifest: str | None = None,
    backbones: dict[str, str] | None = None,
    scopes: dict[Scope, list[str]] | None = None,
) -> int:
    """Write one run into ``db`` (created when missing) and return its id.

    Args:
        db: the results database.
        name: the run's name.
        trajs: its labelled trajectories.
        preds: its predictions, each with a done item.
        methods: the sweep config's ``methods`` (``{"name", "label", "options"}``); labels it does not name
            are read as their own registry names.
        manifest: ``sweep.manifest`` (a run drawn by a manifest, as LongRCA-Mini).
        backbones: the stored config's backbones, name → provider (none: the config names no backbone).
        scopes: per cell, the ids it answers, written as its ``method_prepared`` event.
    """
    config: dict[str, Any] = {
        "sweep": {"dataset": "hand-built", "manifest": manifest},
        "methods": methods or [],
    }
    if backbones:
        config["backbones"] = {name: {"provider": provider} for name, provider in backbones.items()}
    return asyncio.run(_build(db, name, config, trajs, preds, scopes or {}))
