"""Root-cause attribution methods. Each sees a `Trajectory` and the `LLM` protocol, nothing else.

Importing this package registers every method, so `create_method(name)` finds them by the names used in configs.
"""

from rcarun.methods import all_at_once as _all_at_once  # noqa: F401  (registers "all-at-once")
from rcarun.methods.base import Attribution, Method, role_is_valid, step_is_valid
from rcarun.methods.llm import LLM, Message, Reasoning, Reply
from rcarun.methods.registry import create_method, method, registered_methods

__all__ = [
    "LLM",
    "Attribution",
    "Message",
    "Method",
    "Reasoning",
    "Reply",
    "create_method",
    "method",
    "registered_methods",
    "role_is_valid",
    "step_is_valid",
]
