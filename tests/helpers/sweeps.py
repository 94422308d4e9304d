"""Sweep configs pointing at real mock servers on loopback, and quick reads of results.db, for end-to-end tests."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rcarun.data import bundled_sample_path
from rcarun.runner import SweepConfig


def make_config(
    backbones: Mapping[str, Mapping[str, Any]],
    *,
    dataset: Path | None = None,
    realizations: int = 1,
    stages: Mapping[str, Any] | None = None,
    budget: Mapping[str, Any] | None = None,
    methods: list[dict[str, Any]] | None = None,
) -> SweepConfig:
    return SweepConfig.model_validate(
        {
            "sweep": {
                "dataset": str(dataset or bundled_sample_path()),
                "realizations": realizations,
                "drain_timeout_s": 5,
            },
            "methods": methods or [{"name": "all-at-once"}],
            "backbones": {
                name: {"provider": "simulated", "model": "sim-model", **backbone}
                for name, backbone in backbones.items()
            },
            "stages": stages or {},
            "budget": budget or {},
        }
    )


def rows(db: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as connection:
        return connection.execute(sql, params).fetchall()
