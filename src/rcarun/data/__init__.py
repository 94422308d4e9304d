"""Trajectories, their human labels and the loaders that read them: the only data the rest of rcarun sees.

Methods receive a `Trajectory` (no labels); the runner pairs it with its `Reference` through a `Record`. The
rules every layer shares (roles, tasks, step numbers, checks, manifests) live here. Imports only `rcarun.errors`.
"""

from __future__ import annotations

from .bundled import bundled_sample_path
from .check import CheckReport, Problem, SourceSummary, check_dataset, check_records
from .loaders import (
    ProblemHandler,
    count_entries,
    iter_dataset,
    load_jsonl,
    load_trajectory_file,
    natural_sort_key,
)
from .manifest import (
    DEFAULT_MINI_SEED,
    DEFAULT_MINI_SIZE,
    LONGRCA_MINI,
    Manifest,
    ManifestRecord,
    allocate_quotas,
    dataset_sha256,
    load_manifest,
    longrca_mini_manifest_path,
    sample_mini,
    save_manifest,
)
from .roles import Handoff, normalize_role, parse_handoff, role_matches, strip_handoff_suffix
from .task import (
    MAX_TASK_STEPS,
    TASK_PROFILES,
    TaskDerivation,
    TaskProfile,
    derive_task,
    task_key,
    task_profile,
)
from .trajectory import Record, Reference, Step, Trajectory, agent_from_role, agent_of_step, parse_step

__all__ = [
    "DEFAULT_MINI_SEED",
    "DEFAULT_MINI_SIZE",
    "LONGRCA_MINI",
    "MAX_TASK_STEPS",
    "TASK_PROFILES",
    "CheckReport",
    "Handoff",
    "Manifest",
    "ManifestRecord",
    "Problem",
    "ProblemHandler",
    "Record",
    "Reference",
    "SourceSummary",
    "Step",
    "TaskDerivation",
    "TaskProfile",
    "Trajectory",
    "agent_from_role",
    "agent_of_step",
    "allocate_quotas",
    "bundled_sample_path",
    "check_dataset",
    "check_records",
    "count_entries",
    "dataset_sha256",
    "derive_task",
    "iter_dataset",
    "load_jsonl",
    "load_manifest",
    "load_trajectory_file",
    "longrca_mini_manifest_path",
    "natural_sort_key",
    "normalize_role",
    "parse_handoff",
    "parse_step",
    "role_matches",
    "sample_mini",
    "save_manifest",
    "strip_handoff_suffix",
    "task_key",
    "task_profile",
]
