"""`LocalForwardModel`: one causal LM on this machine, run forward over text segments and reduced per segment.

Forward hooks reduce each layer's tensors to per-segment values as soon as the layer has run (transformers'
``output_attentions`` would keep ~4 GB a layer at 8,192 tokens), and the NLL's logits are computed in chunks.
Segments are tokenized alone and concatenated in one user turn of the chat template. torch and transformers are
imported inside functions only (the ``rcarun[local]`` extra). Details: docs/reliability.md ("The local model").
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rcarun.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "DEFAULT_CONTEXT_TOKENS",
    "ForwardPass",
    "LocalForwardModel",
    "TokenLayout",
    "require_local_extra",
]

DEFAULT_CONTEXT_TOKENS = 8192
"""SOAP's input limit (paper 004, App. A.2)."""

_EXTRA = "pip install 'rcarun[local]'"
_SENTINEL = "RCARUNSEGMENTSENTINEL"  # no spaces or markup, so that no template trims or escapes it
_LOGIT_ELEMENTS = (
    1 << 26
)  # float32 logits alive at once while computing the NLL: 256 MiB whatever the vocabulary
_DTYPES = ("float32", "bfloat16", "float16")


def require_local_extra() -> None:
    """Import torch and transformers, or raise one `ConfigError` line naming the extra that provides them."""
    for module in ("torch", "transformers"):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"the local model backend needs {module} ({exc}): {_EXTRA}") from None


@dataclass(frozen=True, slots=True, eq=False)
class ForwardPass:
    """One forward pass reduced per segment: the fields of `rcarun.methods.forward.SegmentStates`, one for one
    (shapes and meanings in docs/reliability.md, "The local model")."""

    n_tokens: tuple[int, ...]
    pooled: npt.NDArray[np.float32]
    attention: npt.NDArray[np.float32]
    nll: npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class TokenLayout:
    """The ids of one pass (template prefix, the segments, suffix) and each segment's start and length."""

    input_ids: tuple[int, ...]
    starts: tuple[int, ...]
    n_tokens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _RecordRule:
    """One entry of a model's ``can_record_outputs``: which modules produce an output, at which tuple index."""

    target_class: type[Any] | None
    class_name: str | None
    index: int
    layer_name: str | None

    def matches(self, name: str, module: object) -> bool:
        found = (self.target_class is not None and isinstance(module, self.target_class)) or (
            self.class_name is not None and name.endswith(self.class_name)
        )
        if found and self.layer_name is not None:
            return f".{self.layer_name.strip('.')}." in f".{name}."
        return found


class LocalForwardModel:
    """A frozen causal LM that runs forward over text segments (shaped after `ForwardModel`).

    Build it with `load` or from a model and tokenizer in memory (`tiny_model`). Passes run one at a time on a
    dedicated thread under ``torch.inference_mode()``, so the loop stays free. ``name`` carries ``@<commit>``
    when the revision is known; ``context_tokens`` counts the template's ``template_tokens`` too.
    """

    name: str
    context_tokens: int
    template_tokens: int
    n_layers: int

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        name: str,
        context_tokens: int = DEFAULT_CONTEXT_TOKENS,
        token_cache_size: int = 4096,
    ) -> None:
        """Wrap a loaded model (on its device, with eager attention) and its tokenizer.

        Raises:
            ConfigError: torch or transformers is missing.
            ValueError: the model does not use eager attention, its decoder layers cannot be found, or
                ``context_tokens`` cannot hold the chat template.
        """
        require_local_extra()
        attention_kind = getattr(model.config, "_attn_implementation", None)
        if attention_kind != "eager":
            raise ValueError(
                f"{name}: attention weights need attn_implementation='eager' (the model uses {attention_kind!r})"
            )
        self.name = name
        self.context_tokens = context_tokens
        self._model = model.eval()
        self._tokenizer = tokenizer
        self._decoder = model.get_decoder()
        head = model.get_output_embeddings()
        if head is None:
            raise ValueError(f"{name}: the model has no output embeddings, so no next-token likelihood")
        self._head: torch.nn.Module = head
        self._vocab = int(head.weight.shape[0])
        softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
        self._softcap = float(softcap) if softcap else None
        self._layers, self._attention = _decoder_modules(self._decoder, name)
        self.n_layers = len(self._layers)
        # The fast tokenizer toggles a flag on its Rust object for split_special_tokens: one caller at a time.
        self._tokenize_lock = threading.Lock()
        self._prefix, self._suffix = self._template_ids()
        self.template_tokens = len(self._prefix) + len(self._suffix)
        if self.template_tokens >= context_tokens:
            raise ValueError(
                f"{name}: context_tokens={context_tokens} leaves no room after the chat template's "
                f"{self.template_tokens} tokens"
            )
        self._segment_ids: Callable[[str], tuple[int, ...]] = functools.lru_cache(maxsize=token_cache_size)(
            self._tokenize
        )
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rcarun-forward")
        # Hooks are per pass and the model is shared: one pass at a time, whichever thread asks for it.
        self._pass_lock = threading.Lock()

    @classmethod
    def load(
        cls,
        source: str,
        *,
        revision: str | None = None,
        dtype: str | None = None,
        device: str | None = None,
        context_tokens: int = DEFAULT_CONTEXT_TOKENS,
        trust_remote_code: bool = False,
        local_files_only: bool = False,
    ) -> LocalForwardModel:
        """Load any causal LM and its tokenizer from a path or a hub name, with eager attention.

        ``dtype`` None is bfloat16 on CUDA, float32 on the CPU; ``device`` None is CUDA when present.

        Raises:
            ConfigError: torch or transformers is missing, or ``dtype`` is not one of the three.
        """
        require_local_extra()
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        where = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        chosen = dtype or ("bfloat16" if where.type == "cuda" else "float32")
        if chosen not in _DTYPES:
            raise ConfigError(f"{source}: dtype {chosen!r} is not one of {', '.join(_DTYPES)}")
        pinned = _pin_revision(source, revision, local_files_only=local_files_only)
        options: dict[str, Any] = {
            "revision": pinned,
            "trust_remote_code": trust_remote_code,
            "local_files_only": local_files_only,
        }
        tokenizer = AutoTokenizer.from_pretrained(source, **options)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=getattr(torch, chosen), attn_implementation="eager", **options
        )
        model.to(where)
        commit = getattr(pinned, "resolved", None) or revision
        return cls(
            model, tokenizer, name=f"{source}@{commit}" if commit else source, context_tokens=context_tokens
        )

    @property
    def device(self) -> torch.device:
        """Where the model's weights are."""
        device: torch.device = next(self._model.parameters()).device
        return device

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Decoder layers with softmax attention, whose ``attention`` entries are not NaN: all of them, except
        in a hybrid model (Qwen3.5 has linear attention in three layers of four)."""
        return tuple(layer for layer, found in enumerate(self._attention) if found is not None)

    @property
    def model(self) -> PreTrainedModel:
        """The transformers model (frozen: never train it or change its attention implementation)."""
        return self._model

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The transformers tokenizer."""
        return self._tokenizer

    def count_tokens(self, text: str) -> int:
        """Tokens of one segment exactly as `encode` tokenizes it."""
        return len(self._segment_ids(text))

    def layout(self, segments: Sequence[str]) -> TokenLayout:
        """The ids one pass over ``segments`` would run on; `ValueError` for none or too many tokens."""
        if isinstance(segments, str):
            raise TypeError("segments must be a sequence of strings, not one string")
        if not segments:
            raise ValueError(f"{self.name}: a pass needs at least one segment")
        ids = list(self._prefix)
        starts: list[int] = []
        counts: list[int] = []
        for text in segments:
            segment = self._segment_ids(text)
            starts.append(len(ids))
            counts.append(len(segment))
            ids.extend(segment)
        ids.extend(self._suffix)
        if len(ids) > self.context_tokens:
            raise ValueError(
                f"{self.name}: {len(segments)} segments of {sum(counts)} tokens plus the chat template's "
                f"{self.template_tokens} exceed context_tokens={self.context_tokens}"
            )
        return TokenLayout(input_ids=tuple(ids), starts=tuple(starts), n_tokens=tuple(counts))

    async def encode(self, segments: Sequence[str]) -> ForwardPass:
        """One forward pass over the segments on the model's thread; `ValueError` (before any work) as `layout`."""
        layout = self.layout(segments)
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._run, layout)

    def encode_blocking(self, segments: Sequence[str]) -> ForwardPass:
        """`encode` on the calling thread, for scripts and benchmarks outside an event loop."""
        return self._run(self.layout(segments))

    def close(self) -> None:
        """Wait for the pass in progress, if any, and stop the model's thread."""
        self._executor.shutdown(wait=True)

    def _tokenize(self, text: str) -> tuple[int, ...]:
        with self._tokenize_lock:
            ids = self._tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return tuple(int(i) for i in ids)

    def _template_ids(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        tokenizer = self._tokenizer
        if not getattr(tokenizer, "chat_template", None):
            bos = tokenizer.bos_token_id
            return ((int(bos),) if bos is not None else ()), ()
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": _SENTINEL}], tokenize=False, add_generation_prompt=False
        )
        if not isinstance(rendered, str) or rendered.count(_SENTINEL) != 1:
            raise ValueError(
                f"{self.name}: the chat template does not render a user turn's content once, verbatim"
            )
        prefix, suffix = rendered.split(_SENTINEL)

        def template_part(text: str) -> tuple[int, ...]:
            # The template's own markup is parsed into its special tokens, unlike a segment's text.
            ids = tokenizer(text, add_special_tokens=False, split_special_tokens=False)["input_ids"]
            return tuple(int(i) for i in ids)

        with self._tokenize_lock:
            return template_part(prefix), template_part(suffix)

    def _run(self, layout: TokenLayout) -> ForwardPass:
        import torch

        with self._pass_lock, torch.inference_mode():
            return self._forward(layout)

    def _forward(self, layout: TokenLayout) -> ForwardPass:
        import torch

        device = self.device
        ids = torch.tensor([layout.input_ids], dtype=torch.long, device=device)
        n_segments = len(layout.n_tokens)
        # member[t, k] = 1 when token t belongs to segment k: every per-segment sum is one product with it.
        member = torch.zeros(ids.shape[1], n_segments, dtype=torch.float32, device=device)
        for k, (start, count) in enumerate(zip(layout.starts, layout.n_tokens, strict=True)):
            member[start : start + count, k] = 1.0
        counts = member.sum(dim=0)
        pooled: list[torch.Tensor | None] = [None] * (self.n_layers + 1)
        attention = torch.full((self.n_layers, n_segments, n_segments), math.nan, device=device)

        def pool(states: torch.Tensor) -> torch.Tensor:
            return (member.T @ states[0].float()) / counts[:, None]

        def on_first_input(_module: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            pooled[0] = pool(args[0] if args else kwargs["hidden_states"])

        def on_layer_output(layer: int, _module: object, _args: object, output: Any) -> None:
            pooled[layer + 1] = pool(output[0] if isinstance(output, tuple) else output)

        def on_attention(layer: int, index: int, _module: object, _args: object, output: Any) -> None:
            weights = output[index] if isinstance(output, tuple) else None
            if weights is None:
                raise RuntimeError(f"{self.name}: decoder layer {layer} returned no attention weights")
            # [batch, heads, query, key] → summed over heads in float32, then over each segment's tokens.
            per_token = weights[0].sum(dim=0, dtype=torch.float32)
            attention[layer] = (member.T @ per_token @ member) / (counts[:, None] * weights.shape[1])

        handles = [self._layers[0].register_forward_pre_hook(on_first_input, with_kwargs=True)]
        # The last layer's entry is the decoder's normed output, as transformers' hidden_states has it.
        for layer, module in enumerate(self._layers[:-1]):
            handles.append(module.register_forward_hook(functools.partial(on_layer_output, layer)))
        for layer, found in enumerate(self._attention):
            if found is not None:
                module, index = found
                handles.append(module.register_forward_hook(functools.partial(on_attention, layer, index)))
        try:
            last = self._decoder(input_ids=ids, use_cache=False).last_hidden_state
        finally:
            for handle in handles:
                handle.remove()
        pooled[-1] = pool(last)
        nll = self._segment_nll(last[0], ids[0], member, layout)
        return ForwardPass(
            n_tokens=layout.n_tokens,
            pooled=_numpy(torch.stack([_present(p) for p in pooled])),
            attention=_numpy(attention),
            nll=_numpy(nll),
        )

    def _segment_nll(
        self, last: torch.Tensor, ids: torch.Tensor, member: torch.Tensor, layout: TokenLayout
    ) -> torch.Tensor:
        """Mean NLL per segment, the logits computed a chunk of positions at a time (never ``[T, vocab]``)."""
        import torch

        # Targets are the segments' tokens only: the template's tokens need no logits.
        low = max(1, layout.starts[0])
        high = layout.starts[-1] + layout.n_tokens[-1]
        token_nll = torch.zeros(max(0, high - low), dtype=torch.float32, device=last.device)
        rows = max(1, _LOGIT_ELEMENTS // self._vocab)
        for first in range(low, high, rows):
            end = min(high, first + rows)
            logits = self._head(last[first - 1 : end - 1]).float()
            if self._softcap is not None:
                logits = torch.tanh(logits / self._softcap) * self._softcap
            token_nll[first - low : end - low] = torch.nn.functional.cross_entropy(
                logits, ids[first:end], reduction="none"
            )
        targets = member[low:high]
        return (targets.T @ token_nll) / targets.sum(dim=0)


def _decoder_modules(
    decoder: torch.nn.Module, name: str
) -> tuple[list[torch.nn.Module], list[tuple[torch.nn.Module, int] | None]]:
    """The decoder layers in order, and each one's softmax-attention module with the index of its weights in the
    module's output tuple (None for a layer without one), found the way transformers records outputs."""
    import torch

    recordable = getattr(decoder, "can_record_outputs", None) or {}
    layer_rules = _record_rules(recordable.get("hidden_states"), default_index=0)
    attention_rules = _record_rules(recordable.get("attentions"), default_index=1)
    layers = [
        module
        for path, module in decoder.named_modules()
        if any(r.matches(path, module) for r in layer_rules)
    ]
    fallback = getattr(decoder, "layers", None)  # models that declare no recordable outputs
    if not layers and isinstance(fallback, torch.nn.ModuleList):
        layers = list(fallback)
    if not layers:
        raise ValueError(f"{name}: cannot find the decoder layers of {type(decoder).__name__}")
    attention: list[tuple[torch.nn.Module, int] | None] = []
    for layer in layers:
        found: tuple[torch.nn.Module, int] | None = None
        for path, module in layer.named_modules():
            rule = next((r for r in attention_rules if r.matches(path, module)), None)
            if rule is not None:
                found = (module, rule.index)
                break
        if (
            found is None
            and not attention_rules
            and isinstance(getattr(layer, "self_attn", None), torch.nn.Module)
        ):
            found = (layer.self_attn, 1)
        attention.append(found)
    return layers, attention


def _record_rules(spec: object, *, default_index: int) -> list[_RecordRule]:
    """A ``can_record_outputs`` value (a class, a class name, an ``OutputRecorder`` or a list of them) as rules."""
    if spec is None:
        return []
    if isinstance(spec, list | tuple):
        return [rule for item in spec for rule in _record_rules(item, default_index=default_index)]
    if isinstance(spec, type):
        return [_RecordRule(spec, None, default_index, None)]
    if isinstance(spec, str):
        return [_RecordRule(None, spec, default_index, None)]
    return [
        _RecordRule(
            getattr(spec, "target_class", None),
            getattr(spec, "class_name", None),
            int(getattr(spec, "index", default_index)),
            getattr(spec, "layer_name", None),
        )
    ]


def _pin_revision(source: str, revision: str | None, *, local_files_only: bool) -> str | None:
    """The revision resolved to its commit (a str whose ``resolved`` attribute is the hash) where transformers can
    resolve it, so that the name and every file of the load refer to one commit; else ``revision`` unchanged."""
    try:
        from transformers.utils.hub import resolve_revision
    except ImportError:
        return revision
    pinned: str | None = resolve_revision(source, revision, local_files_only=local_files_only)
    return pinned


def _present(tensor: torch.Tensor | None) -> torch.Tensor:
    if tensor is None:
        raise RuntimeError("a decoder layer did not run during the forward pass")
    return tensor


def _numpy(tensor: torch.Tensor) -> npt.NDArray[np.float32]:
    return np.ascontiguousarray(tensor.detach().float().cpu().numpy(), dtype=np.float32)
