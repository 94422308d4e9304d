"""The progress bar's words for a backbone: what its calls in flight have streamed so far counts at once."""

from __future__ import annotations

from rcarun.backends import BackendSettings, CallProgress, create_backend
from rcarun.backends.streaming import ChunkAssembler
from rcarun.budgets import BackboneGate, BackboneLimits
from rcarun.runner import BackboneConfig
from rcarun.runner.progress import postfix
from rcarun.runner.runtime import BackboneRuntime


def _runtime() -> BackboneRuntime:
    url = "http://127.0.0.1:9/v1"
    return BackboneRuntime(
        name="b",
        config=BackboneConfig(provider="simulated", model="m", base_url=url),
        backend=create_backend(BackendSettings(name="b", provider="simulated", model="m", base_urls=(url,))),
        gate=BackboneGate("b", BackboneLimits(concurrency=2)),
    )


def _streaming(tokens: int) -> CallProgress:
    progress = CallProgress()
    progress.assembler = ChunkAssembler()
    for _ in range(tokens):
        progress.assembler.add(b'{"choices":[{"index":0,"delta":{"content":"ab"}}]}')
    return progress


def test_the_bar_counts_calls_in_flight_and_the_tokens_they_streamed() -> None:
    runtime = _runtime()
    assert "fly=0 streamed=0 " in postfix(runtime) and "cut=" not in postfix(runtime)

    runtime.counters.streamed_tokens = 1_000
    runtime.in_flight.update({_streaming(3), _streaming(40)})
    runtime.counters.cut_calls = 2

    text = postfix(runtime)
    assert "fly=2 streamed=1,043 " in text
    assert text.endswith(" cut=2")
