"""The benchmark's workload: a synthetic Who&When-shaped dataset, and the exact request bodies it turns into.

Every client must send the same requests. rcarun reads the dataset through its own runner; the peers get their
bodies from `request_bodies`, which asks the all-at-once method (built through the registry) for its call and
builds the body with rcarun's request builder and the scenario's preset, so messages, the output budget,
``temperature`` and ``response_format`` are identical byte for byte. The simulator answers deterministically at
temperature 0, so completions (and the tokens charged) match across clients too.

Texts are cut from one fixed pseudo-random word stream at seeded offsets: cheap to make and distinct per
trajectory.
"""

from __future__ import annotations

import importlib
import json
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rcarun.backends import BackendSettings, ChatMessage, ChatRequest, build_body, get_preset
from rcarun.data import Trajectory, iter_dataset
from rcarun.methods import LLM, Message, Method, Reply, create_method
from rcarun.methods.registry import BUILT_IN_METHODS

from .scenarios import PromptSizes, Scenario

__all__ = ["SOURCE", "BenchRequest", "draw_sizes", "request_bodies", "write_dataset"]

SOURCE = "bench"
MODEL = "sim-bench"
_AGENTS = ("Orchestrator", "WebSurfer", "Coder", "ComputerTerminal", "Assistant")
# Words of the synthetic step texts (split once per stream).
_VOCABULARY = (
    "search result page table column error retry value file output agent plan step check answer query "
    "number source website link download parse code run test failed success verify final compute list"
)
_STREAM_CHARS = 200_000
_METHOD = "all-at-once"
# The method's module is imported with this one, so that a peer's measured run does not pay for it (tens of ms:
# a quarter of a millisecond a call in a --quick scenario).
importlib.import_module(BUILT_IN_METHODS[_METHOD])


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One call as a peer sends it.

    Attributes:
        body: the chat-completions JSON body, as rcarun's request builder makes it.
        prompt_chars: characters of message content (what a client can estimate tokens from).
        messages: number of messages (each costs a few tokens of overhead on the server's count).
    """

    body: Mapping[str, Any]
    prompt_chars: int
    messages: int


def draw_sizes(sizes: PromptSizes, count: int, seed: int) -> list[int]:
    """``count`` content sizes in characters, reproducible from ``seed``."""
    rng = random.Random(f"bench-sizes:{seed}")
    drawn: list[int] = []
    for _ in range(count):
        if sizes.kind == "uniform":
            value = rng.randint(sizes.low, sizes.high)
        else:
            value = round(math.exp(rng.gauss(math.log(sizes.median), sizes.sigma)))
        drawn.append(min(sizes.high, max(sizes.low, value)))
    return drawn


def _word_stream(seed: int) -> str:
    rng = random.Random(f"bench-words:{seed}")
    vocabulary = _VOCABULARY.split()
    words: list[str] = []
    length = 0
    while length < _STREAM_CHARS:
        word = rng.choice(vocabulary)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)


def _trajectory_json(index: int, size: int, rng: random.Random, stream: str) -> dict[str, Any]:
    n_steps = rng.randint(3, 8)
    # Split ``size`` characters over the steps at random cut points so that step lengths vary too.
    cuts = sorted(rng.randint(0, size) for _ in range(n_steps - 1))
    lengths = [b - a for a, b in zip([0, *cuts], [*cuts, size], strict=True)]
    history = []
    for step, length in enumerate(lengths):
        start = rng.randrange(0, len(stream) - length - 1)
        history.append(
            {
                "name": _AGENTS[(index + step) % len(_AGENTS)],
                "role": "assistant",
                "content": stream[start : start + length],
            }
        )
    return {
        "question": f"Benchmark task {index}: find the value asked for and report it.",
        "history": history,
        "mistake_agent": history[0]["name"],
        "mistake_step": "0",
    }


def write_dataset(scenario: Scenario, root: Path) -> Path:
    """Write the scenario's dataset under ``root`` (``root/bench/<N>.json``, one trajectory per
    ``realizations`` calls).

    Returns:
        The dataset directory to give to `iter_dataset` or a sweep config.
    """
    source_dir = root / SOURCE
    source_dir.mkdir(parents=True, exist_ok=True)
    stream = _word_stream(scenario.seed)
    rng = random.Random(f"bench-trajectories:{scenario.seed}")
    for index, size in enumerate(draw_sizes(scenario.sizes, scenario.trajectories, scenario.seed)):
        record = _trajectory_json(index, size, rng, stream)
        (source_dir / f"{index}.json").write_text(json.dumps(record), encoding="utf-8")
    return root


class _FirstCall(Exception):
    """Carries a method's first request out of `Method.attribute` (`_RecordingLLM`)."""

    def __init__(self, request: ChatRequest) -> None:
        super().__init__("the benchmark builds requests only")
        self.request = request


class _RecordingLLM:
    """An `LLM` without a context window (so no truncation) that stops the method at its first call."""

    context_window: int | None = None
    backbone = "bench"

    def for_backbone(self, name: str) -> LLM:
        return self

    def estimate_tokens(self, text: str) -> int:
        return math.ceil(len(text) / 4)

    async def chat(
        self, messages: Sequence[Message], *, stage: str, max_tokens: int, **options: Any
    ) -> Reply:
        raise _FirstCall(
            ChatRequest(
                messages=tuple(ChatMessage(m.role, m.content) for m in messages),
                max_tokens=max_tokens,
                temperature=options.get("temperature"),
                schema=options.get("schema"),
                reasoning=options.get("reasoning"),
            )
        )


def _first_request(method: Method, trajectory: Trajectory) -> ChatRequest:
    """The request ``method`` sends first for ``trajectory``. No event loop is needed: the recording LLM
    raises at the first call, before the coroutine ever suspends."""
    coroutine = method.attribute(trajectory, _RecordingLLM())
    try:
        coroutine.send(None)
    except _FirstCall as first:
        return first.request
    finally:
        coroutine.close()
    raise RuntimeError(f"method {method.label!r} answered without calling its LLM")


def request_bodies(dataset: Path, base_url: str, provider: str = "simulated") -> Iterator[BenchRequest]:
    """The request body of every trajectory in ``dataset``, in dataset order, as rcarun's runner sends it to a
    backbone with the preset ``provider`` (the scenario's: e.g. ``max_completion_tokens`` for "openai")."""
    method = create_method(_METHOD, label=_METHOD, options={})
    settings = BackendSettings(name="bench", provider=provider, model=MODEL, base_urls=(base_url,))
    preset = get_preset(provider)
    for record in iter_dataset(dataset):
        request = _first_request(method, record.trajectory)
        yield BenchRequest(
            body=build_body(request, settings, preset),
            prompt_chars=request.prompt_chars(),
            messages=len(request.messages),
        )
