"""Root-cause attribution methods. Each sees a `Trajectory` and the `LLM` protocol, nothing else.

`create_method(name)` finds them by the names used in configs. Importing this package does not import them: each
method's module is imported when its name is first used (`registry.BUILT_IN_METHODS`), so a run pays only for the
methods it runs.
"""

from rcarun.methods.base import (
    Attribution,
    Method,
    abstention,
    home_backbone,
    role_is_valid,
    speaker_attribution,
    step_is_valid,
)
from rcarun.methods.llm import LLM, ChatOptions, Message, Reasoning, Reply, ToolCall, ToolChoice
from rcarun.methods.registry import create_method, method, registered_methods

__all__ = [
    "LLM",
    "Attribution",
    "ChatOptions",
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
