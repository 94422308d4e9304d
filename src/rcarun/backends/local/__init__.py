"""The local model backend: forward passes over a causal LM on this machine, for methods that read a model's
internals (SOAP) instead of chatting with it.

Shaped after `rcarun.methods.forward.ForwardModel` but returning its own `ForwardPass` (backends may not import
methods; the runner copies it across). torch and transformers (``rcarun[local]``) are imported only on use.
"""

from __future__ import annotations

from rcarun.backends.local.model import (
    DEFAULT_CONTEXT_TOKENS,
    ForwardPass,
    LocalForwardModel,
    TokenLayout,
    require_local_extra,
)
from rcarun.backends.local.tiny import TINY_CHAT_TEMPLATE, tiny_model, tiny_tokenizer

__all__ = [
    "DEFAULT_CONTEXT_TOKENS",
    "TINY_CHAT_TEMPLATE",
    "ForwardPass",
    "LocalForwardModel",
    "TokenLayout",
    "require_local_extra",
    "tiny_model",
    "tiny_tokenizer",
]
