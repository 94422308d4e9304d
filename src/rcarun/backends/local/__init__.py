"""The local model backend: forward passes over a causal LM on this machine, for methods that read a model's
internals (SOAP, issue 18) instead of chatting with it.

Everything here is shaped after `rcarun.methods.forward.ForwardModel`, but returns its own `ForwardPass` (the
same fields as `SegmentStates`): backends sit below methods and may not import them, so the runner, which must
record and cache passes in results.db anyway, hands a method the field-for-field copy.

torch and transformers are the optional extra ``rcarun[local]``; they are imported when a model is loaded or
built, never when this package is, so ``import rcarun`` and the CLI work without them.
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
