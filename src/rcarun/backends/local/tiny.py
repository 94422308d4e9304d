"""A tiny causal LM with seeded random weights and a byte-level tokenizer, both built in code.

For tests and the demo, with no download: a small Llama-style model (grouped-query attention) and a byte
tokenizer with a chat template. **Its weights are random: its outputs mean nothing** beyond the seed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rcarun.backends.local.model import DEFAULT_CONTEXT_TOKENS, LocalForwardModel, require_local_extra

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

__all__ = ["TINY_CHAT_TEMPLATE", "tiny_model", "tiny_tokenizer"]

TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""One line per turn: ``<s><|user|>\\n{content}<|end|>\\n``."""

_SPECIAL_TOKENS = ("<s>", "<|end|>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>")


def tiny_tokenizer(*, chat_template: bool = True) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer (token ``b`` is byte ``b``, specials from 256), with or without a chat template."""
    require_local_extra()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = _byte_level_chars()
    # BPE with no merges over the byte-level alphabet: every byte stays one token.
    core = Tokenizer(models.BPE(vocab={byte_chars[b]: b for b in range(256)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(_SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="<|end|>",
        pad_token="<pad>",
        chat_template=TINY_CHAT_TEMPLATE if chat_template else None,
    )


def tiny_model(
    seed: int = 0,
    *,
    n_layers: int = 3,
    hidden: int = 32,
    heads: int = 4,
    kv_heads: int = 2,
    init_scale: float = 0.3,
    context_tokens: int = DEFAULT_CONTEXT_TOKENS,
    chat_template: bool = True,
    device: str | None = None,
) -> LocalForwardModel:
    """A random Llama-style causal LM in float32, identical for identical arguments (torch's global random
    state is left as it was). ``init_scale`` is above a trained model's 0.02 so attention is far from uniform."""
    require_local_extra()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_tokenizer(chat_template=chat_template)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=context_tokens,
        initializer_range=init_scale,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="eager",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(dtype=torch.float32)
    model.to(torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")))
    name = f"tiny-random-llama(seed={seed},layers={n_layers},hidden={hidden},heads={heads}/{kv_heads})"
    return LocalForwardModel(model, tokenizer, name=name, context_tokens=context_tokens)


def _byte_level_chars() -> list[str]:
    """GPT-2's byte-to-character table (what ``pre_tokenizers.ByteLevel`` maps byte ``b`` to), indexed by byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars: dict[int, str] = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shifted)
            shifted += 1
    return [chars[b] for b in range(256)]
