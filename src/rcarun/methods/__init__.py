"""Root-cause attribution methods. Each sees a `Trajectory` and the `LLM` protocol, nothing else.

Importing this package registers every method, so `create_method(name)` finds them by the names used in configs.
"""

from rcarun.methods import all_at_once as _all_at_once  # noqa: F401  (registers "all-at-once")
from rcarun.methods import binary_search as _binary_search  # noqa: F401  (registers "binary-search")
from rcarun.methods import continual_search as _continual_search  # noqa: F401  (continual-search, passive-...)
from rcarun.methods import echo as _echo  # noqa: F401  (registers "echo")
from rcarun.methods import ensembles as _ensembles  # noqa: F401  (self-consistency, judge-panel)
from rcarun.methods import falat as _falat  # noqa: F401  (registers "falat")
from rcarun.methods import step_by_step as _step_by_step  # noqa: F401  (registers "step-by-step")
from rcarun.methods.base import (
    Attribution,
    Method,
    abstention,
    home_backbone,
    role_is_valid,
    speaker_attribution,
    step_is_valid,
)
from rcarun.methods.llm import LLM, Message, Reasoning, Reply, ToolCall, ToolChoice
from rcarun.methods.rcta import method as _rcta  # noqa: F401  (registers "rcta" and "rcta/no-a1".."rcta/no-a4")
from rcarun.methods.registry import create_method, method, registered_methods

__all__ = [
    "LLM",
    "Attribution",
    "Message",
    "Method",
    "Reasoning",
    "Reply",
    "ToolCall",
    "ToolChoice",
    "abstention",
    "create_method",
    "home_backbone",
    "method",
    "registered_methods",
    "role_is_valid",
    "speaker_attribution",
    "step_is_valid",
]
