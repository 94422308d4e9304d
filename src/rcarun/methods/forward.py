"""The `ForwardModel` a method that reads a model's internals receives: forward passes, not chat.

SOAP reads hidden states and attentions, not answers, so it gets its own narrow protocol beside `LLM`; arrays
come back already reduced per segment. Why one causal pass serves every step that fits: ``docs/methods/soap.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    # Annotations only: every sweep imports this module through `rcarun.methods`, and numpy costs a chat sweep
    # about 10 MB of resident memory and 0.15 s of CPU at start-up that it never uses.
    import numpy as np
    import numpy.typing as npt

__all__ = ["ForwardModel", "SegmentStates"]


@dataclass(frozen=True, slots=True, eq=False)
class SegmentStates:
    """One forward pass over a list of segments, reduced per segment.

    Attributes:
        n_tokens: tokens of each segment, as the model saw them (the chat template's own tokens belong to none).
        pooled: ``[n_layers + 1, n_segments, hidden]`` float32: each segment's token states mean-pooled, at every
            layer; index 0 is the embedding output, index ``l`` the output of decoder layer ``l`` (transformers'
            ``hidden_states`` order, whose last entry is taken after the final norm).
        attention: ``[n_layers, n_segments, n_segments]`` float32: at decoder layer ``l`` (0-based), the attention
            from the tokens of segment ``i`` to the tokens of segment ``j``: summed over ``j``'s tokens, averaged
            over ``i``'s tokens and over heads. Causal, so zero above the diagonal; a row sums to at most 1 (the
            rest goes to the template's tokens). A layer without softmax attention (the linear-attention layers
            of a hybrid model such as Qwen3.5) is all NaN.
        nll: ``[n_segments]`` float32: mean negative log-likelihood of each segment's tokens given everything
            before them (perplexity = exp(nll)); the first token of the whole input has no prediction and is left
            out of its segment's mean.

    A segment of no tokens has NaN in its ``pooled`` and ``nll`` entries and in its ``attention`` row, and zeros
    in its ``attention`` column. A backend returns its own value with these fields (backends may not import
    methods); the runner hands methods this one.
    """

    n_tokens: tuple[int, ...]
    pooled: npt.NDArray[np.float32]
    attention: npt.NDArray[np.float32]
    nll: npt.NDArray[np.float32]


class ForwardModel(Protocol):
    """A frozen causal LM that a method can run forward over text segments.

    Attributes:
        name: what identifies the model in results.db (a hub name or a path, with a revision when known).
        context_tokens: the most tokens one pass may hold, template included (SOAP's default is 8,192).
        template_tokens: tokens the chat template adds around the segments of one user turn.
        n_layers: decoder layers; valid layer indices for ``pooled`` are ``0 … n_layers``.
    """

    name: str
    context_tokens: int
    template_tokens: int
    n_layers: int

    def count_tokens(self, text: str) -> int:
        """Tokens of one segment exactly as `encode` will tokenize it."""
        ...

    async def encode(self, segments: Sequence[str]) -> SegmentStates:
        """One forward pass over the segments, in one user turn; raises ValueError when they exceed
        ``context_tokens``."""
        ...
