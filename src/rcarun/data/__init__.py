"""Trajectories, their human labels and the loaders that read them: the only data the rest of rcarun sees.

Methods receive a `Trajectory` (no labels); the runner and analysis pair it with its `Reference` through the
`Record` the loaders yield. This package imports nothing of rcarun's except `rcarun.errors`.
"""

from __future__ import annotations

from .bundled import bundled_sample_path
from .loaders import (
    ProblemHandler,
    count_entries,
    iter_dataset,
    load_jsonl,
    load_trajectory_file,
    natural_sort_key,
)
from .trajectory import Record, Reference, Step, Trajectory, agent_from_role, agent_of_step

__all__ = [
    "ProblemHandler",
    "Record",
    "Reference",
    "Step",
    "Trajectory",
    "agent_from_role",
    "agent_of_step",
    "bundled_sample_path",
    "count_entries",
    "iter_dataset",
    "load_jsonl",
    "load_trajectory_file",
    "natural_sort_key",
]
