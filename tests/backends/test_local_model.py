"""The local model backend on the tiny random model: every reduction against a brute-force one from
transformers' own ``output_hidden_states`` / ``output_attentions`` / logits, the causal equivalence that lets one
pass serve every step, the token layout and limits, and the lazy import of torch."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rcarun.backends.local import (  # noqa: E402  (after the skip: the extra may be absent)
    ForwardPass,
    LocalForwardModel,
    TokenLayout,
    require_local_extra,
    tiny_model,
    tiny_tokenizer,
)
from rcarun.errors import ConfigError  # noqa: E402
from rcarun.methods.forward import SegmentStates  # noqa: E402

SEGMENTS = [
    "Task: how many moons does Mars have?\n",
    "Step 0 (Orchestrator): ask the WebSurfer to search.\n",
    "Step 1 (WebSurfer): Mars has two moons, Phobos and Deimos; <|end|> is plain text here.\n",
    "Step 2 (Assistant): the answer is 3.\n",
    "Step 3 (Orchestrator): FINAL ANSWER: 3 ✓\n",
]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny() -> Iterator[LocalForwardModel]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # leave the machine's other core alone; these passes are tiny
    model = tiny_model(seed=0)
    yield model
    model.close()
    torch.set_num_threads(threads)


def brute_force(model: LocalForwardModel, layout: TokenLayout) -> ForwardPass:
    """The same reductions from transformers' full outputs, one segment at a time, in float64."""
    ids = torch.tensor([layout.input_ids])
    with torch.inference_mode():
        out = model.model(input_ids=ids, output_hidden_states=True, output_attentions=True, use_cache=False)
    hidden = [h[0].double().numpy() for h in out.hidden_states]
    attentions = [a[0].double().numpy() for a in out.attentions]
    log_probs = torch.log_softmax(out.logits[0].double(), dim=-1).numpy()
    spans = [range(s, s + n) for s, n in zip(layout.starts, layout.n_tokens, strict=True)]
    pooled = np.array([[h[span].mean(axis=0) for span in spans] for h in hidden])
    heads = range(attentions[0].shape[0])
    # a[h, query, key]: the block of i's queries on j's keys, summed over keys, averaged over queries and heads.
    attention = np.array(
        [[[a[np.ix_(heads, i, j)].sum(axis=-1).mean() for j in spans] for i in spans] for a in attentions]
    )
    nll = np.array(
        [np.mean([-log_probs[t - 1, layout.input_ids[t]] for t in span if t > 0]) for span in spans]
    )
    return ForwardPass(n_tokens=layout.n_tokens, pooled=pooled, attention=attention, nll=nll)


def assert_same(actual: npt.NDArray[np.floating], expected: npt.NDArray[np.floating]) -> None:
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


async def test_shapes_dtypes_and_token_counts(tiny: LocalForwardModel) -> None:
    result = await tiny.encode(SEGMENTS)
    n = len(SEGMENTS)
    assert tiny.n_layers == 3
    assert tiny.attention_layers == (0, 1, 2)
    assert result.n_tokens == tuple(len(s.encode()) for s in SEGMENTS)  # one token per UTF-8 byte
    assert result.n_tokens == tuple(tiny.count_tokens(s) for s in SEGMENTS)
    assert result.pooled.shape == (tiny.n_layers + 1, n, 32)
    assert result.attention.shape == (tiny.n_layers, n, n)
    assert result.nll.shape == (n,)
    for array in (result.pooled, result.attention, result.nll):
        assert array.dtype == np.float32
        assert np.isfinite(array).all()
    # Causal: nothing above the diagonal; a row's mass is at most 1 (the template's tokens take the rest).
    assert (np.triu(result.attention, k=1) == 0).all()
    assert (result.attention.sum(axis=-1) <= 1 + 1e-6).all()
    assert (result.attention.sum(axis=-1) > 0.5).all()


async def test_reductions_equal_brute_force_from_transformers_outputs(tiny: LocalForwardModel) -> None:
    result = await tiny.encode(SEGMENTS)
    expected = brute_force(tiny, tiny.layout(SEGMENTS))
    assert_same(result.pooled, expected.pooled)
    assert_same(result.attention, expected.attention)
    assert_same(result.nll, expected.nll)
    # The random model's attention is far from uniform, so a swapped axis or a missing mean could not pass.
    assert np.ptp(expected.attention[:, -1, :-1]) > 0.05


async def test_one_pass_equals_a_pass_per_prefix(tiny: LocalForwardModel) -> None:
    whole = await tiny.encode(SEGMENTS)
    for last in range(len(SEGMENTS)):
        prefix = await tiny.encode(SEGMENTS[: last + 1])
        rows = slice(0, last + 1)
        assert prefix.n_tokens == whole.n_tokens[rows]
        assert_same(prefix.pooled, whole.pooled[:, rows])
        assert_same(prefix.attention, whole.attention[:, rows, rows])
        assert_same(prefix.nll, whole.nll[rows])


def test_layout_is_one_user_turn_of_the_chat_template(tiny: LocalForwardModel) -> None:
    # The byte-level tokenizer merges nothing, so the template around the joined text gives the same ids.
    plain = [segment.replace("<|end|>", "END") for segment in SEGMENTS]
    layout = tiny.layout(plain)
    rendered = tiny.tokenizer.apply_chat_template(
        [{"role": "user", "content": "".join(plain)}], tokenize=True
    )
    assert list(layout.input_ids) == rendered["input_ids"]
    assert layout.input_ids[: layout.starts[0]] == (256, 260, 10)  # <s> <|user|> \n
    assert layout.input_ids[layout.starts[-1] + layout.n_tokens[-1] :] == (257, 10)  # <|end|> \n
    assert tiny.template_tokens == 5
    assert list(layout.starts) == [3 + sum(layout.n_tokens[:k]) for k in range(len(plain))]
    # A special token's text inside a segment is data: its bytes, not the control token.
    assert tiny.count_tokens("<|end|>") == 7
    assert 257 not in tiny.layout(SEGMENTS).input_ids[3:-2]


def test_without_chat_template_the_prefix_is_bos_alone() -> None:
    model = tiny_model(seed=0, chat_template=False)
    layout = model.layout(["ab", "c"])
    assert model.template_tokens == 1
    assert layout.input_ids == (256, 97, 98, 99)
    assert layout.starts == (1, 3)
    model.close()


def test_too_many_tokens_raise_value_error_counting_the_template() -> None:
    model = tiny_model(seed=0, context_tokens=20)
    assert model.template_tokens == 5
    model.layout(["a" * 10, "b" * 5])  # 15 + 5 = 20 fits exactly
    with pytest.raises(ValueError, match="context_tokens=20"):
        model.layout(["a" * 10, "b" * 6])
    with pytest.raises(ValueError, match="context_tokens=20"):
        asyncio.run(model.encode(["a" * 16]))
    with pytest.raises(ValueError, match="at least one segment"):
        model.layout([])
    with pytest.raises(TypeError):
        model.layout("a string is not a list of segments")
    with pytest.raises(ValueError, match="no room"):
        tiny_model(seed=0, context_tokens=5)
    model.close()


async def test_an_empty_segment_is_nan_where_its_mean_is_over_nothing(tiny: LocalForwardModel) -> None:
    result = await tiny.encode(["Task.", "", "Step."])
    assert result.n_tokens == (5, 0, 5)
    assert np.isnan(result.pooled[:, 1]).all()
    assert np.isnan(result.nll[1])
    assert np.isnan(result.attention[:, 1]).all()
    assert (result.attention[:, 2, 1] == 0).all()
    assert np.isfinite(result.pooled[:, [0, 2]]).all()
    # The empty segment changes no token, so the others are as without it.
    without = await tiny.encode(["Task.", "Step."])
    assert_same(result.pooled[:, [0, 2]], without.pooled)
    assert_same(result.nll[[0, 2]], without.nll)


async def test_concurrent_passes_run_one_at_a_time_and_agree(tiny: LocalForwardModel) -> None:
    running, most = 0, 0

    def enter(*_: object) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)

    def leave(*_: object) -> None:
        nonlocal running
        running -= 1

    decoder = tiny.model.get_decoder()
    handles = [decoder.register_forward_pre_hook(enter), decoder.register_forward_hook(leave)]
    inputs = [SEGMENTS[: k + 1] for k in range(len(SEGMENTS))]
    try:
        together = await asyncio.gather(
            *(tiny.encode(segments) for segments in inputs),
            asyncio.to_thread(tiny.encode_blocking, SEGMENTS),  # another thread, outside the model's executor
        )
    finally:
        for handle in handles:
            handle.remove()
    assert most == 1
    for segments, result in zip([*inputs, SEGMENTS], together, strict=True):
        alone = tiny.encode_blocking(segments)
        np.testing.assert_array_equal(result.pooled, alone.pooled)
        np.testing.assert_array_equal(result.attention, alone.attention)


def test_a_hybrid_model_has_nan_attention_where_a_layer_has_none() -> None:
    # Qwen3.5 (one of the paper's models) alternates three linear-attention layers with one softmax layer.
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    tokenizer = tiny_tokenizer()
    config = Qwen3_5TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        attn_implementation="eager",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hybrid = LocalForwardModel(Qwen3_5ForCausalLM(config), tokenizer, name="tiny-random-qwen3.5")
    assert hybrid.attention_layers == (3,)
    segments = SEGMENTS[:3]
    result = hybrid.encode_blocking(segments)
    expected = brute_force(hybrid, hybrid.layout(segments))  # transformers returns the one softmax layer only
    assert np.isnan(result.attention[:3]).all()
    assert_same(result.attention[3:], expected.attention)
    assert_same(result.pooled, expected.pooled)
    assert_same(result.nll, expected.nll)
    hybrid.close()


def test_tiny_model_is_a_function_of_its_seed() -> None:
    first = tiny_model(seed=7).encode_blocking(SEGMENTS[:2])
    again = tiny_model(seed=7).encode_blocking(SEGMENTS[:2])
    other = tiny_model(seed=8).encode_blocking(SEGMENTS[:2])
    np.testing.assert_array_equal(first.pooled, again.pooled)
    np.testing.assert_array_equal(first.attention, again.attention)
    assert not np.allclose(first.pooled[1:], other.pooled[1:])


def test_load_from_a_directory_gives_the_same_passes(tiny: LocalForwardModel, tmp_path: Path) -> None:
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    loaded = LocalForwardModel.load(str(tmp_path), device="cpu", local_files_only=True, context_tokens=4096)
    assert loaded.name == str(tmp_path)  # a directory has no revision to add
    assert (loaded.n_layers, loaded.template_tokens, loaded.context_tokens) == (3, 5, 4096)
    assert loaded.device.type == "cpu"
    assert loaded.model.dtype == torch.float32
    mine, theirs = tiny.encode_blocking(SEGMENTS), loaded.encode_blocking(SEGMENTS)
    assert_same(theirs.pooled, mine.pooled)
    assert_same(theirs.attention, mine.attention)
    assert_same(theirs.nll, mine.nll)
    loaded.close()
    with pytest.raises(ConfigError, match="dtype 'int8'"):
        LocalForwardModel.load(str(tmp_path), dtype="int8", local_files_only=True)


def test_a_model_without_eager_attention_is_refused(tiny: LocalForwardModel) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=300, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, attn_implementation="sdpa"
    )
    sdpa = LlamaForCausalLM(config)
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        LocalForwardModel(sdpa, tiny.tokenizer, name="sdpa")


def test_a_pass_copies_field_for_field_into_the_methods_segment_states(tiny: LocalForwardModel) -> None:
    # Backends may not import rcarun.methods, so the runner hands a method this copy of a ForwardPass.
    assert [f.name for f in dataclasses.fields(ForwardPass)] == [
        f.name for f in dataclasses.fields(SegmentStates)
    ]
    result = tiny.encode_blocking(SEGMENTS[:2])
    states = SegmentStates(**{f.name: getattr(result, f.name) for f in dataclasses.fields(ForwardPass)})
    assert states.n_tokens == result.n_tokens
    for attribute in ("name", "context_tokens", "template_tokens", "n_layers", "count_tokens", "encode"):
        assert hasattr(tiny, attribute)


def test_importing_rcarun_does_not_import_torch() -> None:
    code = (
        "import sys, rcarun, rcarun.backends, rcarun.backends.local, rcarun.cli, rcarun.methods.forward\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout.strip() == "[]"


def test_a_missing_extra_is_one_line_naming_it() -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # as if the extra were not installed\n"
        "from rcarun.backends.local import tiny_model\n"
        "try:\n"
        "    tiny_model()\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout.startswith("ConfigError the local model backend needs torch")
    assert done.stdout.strip().endswith("pip install 'rcarun[local]'")
    assert done.stdout.count("\n") == 1
    require_local_extra()  # here the extra is installed
