"""FALAT (Rafi et al., 2026), reconstructed: dependency-guided search for the step that introduced a failure.

No public code exists; the package rebuilds the one-sentence description as six stages (typing, linking,
locate, backward walk, pruning, verify and decide), each a plain function tested on its own. The rules of every
stage, the options and the fallbacks are in ``docs/methods/falat.md``.
"""

from rcarun.methods.falat.graph import (
    EDGE_KINDS,
    DependencyGraph,
    Edge,
    EdgeKind,
    ancestors,
    link_steps,
    salient_tokens,
)
from rcarun.methods.falat.method import Falat, FalatOptions
from rcarun.methods.falat.prompts import Templates, locate_messages, verify_messages, weighted_caps
from rcarun.methods.falat.schemas import (
    FailurePoint,
    Verdict,
    locate_schema,
    parse_failure_point,
    parse_verdict,
    verify_schema,
)
from rcarun.methods.falat.search import (
    Candidate,
    Decision,
    DecisionRule,
    PrunedCandidate,
    Pruning,
    SearchResult,
    decide,
    is_verified,
    path_to_failure,
    prune_carriers,
    search_sources,
    walk_back,
)
from rcarun.methods.falat.step_types import STEP_TYPES, StepType, TypedStep, type_step, type_steps

__all__ = [
    "EDGE_KINDS",
    "STEP_TYPES",
    "Candidate",
    "Decision",
    "DecisionRule",
    "DependencyGraph",
    "Edge",
    "EdgeKind",
    "FailurePoint",
    "Falat",
    "FalatOptions",
    "PrunedCandidate",
    "Pruning",
    "SearchResult",
    "StepType",
    "Templates",
    "TypedStep",
    "Verdict",
    "ancestors",
    "decide",
    "is_verified",
    "link_steps",
    "locate_messages",
    "locate_schema",
    "parse_failure_point",
    "parse_verdict",
    "path_to_failure",
    "prune_carriers",
    "salient_tokens",
    "search_sources",
    "type_step",
    "type_steps",
    "verify_messages",
    "verify_schema",
    "walk_back",
    "weighted_caps",
]
