"""What a sweep will cost before it is run: a dry run of every method against an LLM that sends nothing.

`rcarun estimate` must answer "how many calls, tokens and dollars?" from the dataset's actual sizes and each
method's real call structure, not from a formula per method that drifts from the code. So each method's own
``attribute(trajectory, llm)`` runs against `EstimatingLLM`, which implements the `LLM` protocol without a network:

- **Prompt tokens, expected**: the messages' characters over the backbone's ``chars_per_token``, the best guess
  of what the provider bills. **Worst case**: the backbone's `TokenEstimator` (the prompt's UTF-8 bytes over
  ``chars_per_token``, with its 5% margin), as `ItemSession` estimates them and the runner reserves them once a
  report calibrated it; output budgets are clamped to the context left after that
  figure, as in a sweep. The method sees the backbone's context window and the same estimator, so its
  truncation policy shapes the prompts as in a sweep. Cached prompt tokens are assumed to be 0 (no
  provider-side prefix caching is counted), so USD leans high on a provider that caches prefixes.
- **Answers** are schema-valid synthetic values (`rcarun.mock.answers.generate_value`), seeded by the backbone,
  the request's content and the sample number, so a run is reproducible, a request shared across methods gets
  one answer, and two backbones answer one request independently, as two models would (and as the simulated
  backbones do: the simulator seeds by model).
- **Tool calls**: a request that offers tools gets the simulator's own decision (`rcarun.mock.answers.
  simulate_tool_calls`, with the simulator's default number of rounds at most): the same number of tool rounds per
  conversation the simulated backbones serve, each round an ``llm.chat`` call costed like any other, its output
  the calls' names and arguments. The tool specs and earlier calls' arguments count as prompt characters.
- **Output tokens, expected**: the answer's own tokens (``ceil(characters / chars_per_token)``, the simulator's
  rule) plus the reasoning tokens the caller declares for the backbone (0 when not declared; rcarun cannot know
  how long a model thinks). When that exceeds the first budget, the length retries are followed as the session
  follows them (budget doubled up to the stage's cap, the model's maximum output and the context left): every
  attempt that stops for length costs its whole budget and its prompt again.
- **Output tokens, worst case**: every call stops for length on every attempt the stage allows: the first
  budget plus every doubled budget, and the prompt once per attempt.
- **Calls**: logical calls (``llm.chat`` invocations), length retries not counted. ``calls_expected`` is the dry
  run's mean; ``calls_max`` the largest a dry run made — or, for a method that declares its bound
  (``worst_case``, see `rcarun.methods.Method`: Step-by-step, whose answers decide when it stops, every step
  checked), that bound, and its worst-case tokens follow it.
- **Randomness**: methods whose call count depends on answers (Step-by-step stops at the first flagged step,
  FALAT verifies candidates, RCTA retries invalid answers) are dry-run ``samples`` times with different seeds;
  expected figures are the mean over samples.
- **Realizations**: one realization is estimated and multiplied by ``realizations`` (they send the same requests;
  only the answers differ).
- **Chance range**: where answers decide the call count, the expected figure is a mean and one sweep is one draw
  around it; on a small sweep whose cost sits in a few long walks the draw can land far from the mean. With two
  samples or more each row carries the central 95% of ``CHANCE_DRAWS`` resampled sweeps (`ChanceRange`): each
  draw picks one dry run per backbone × trajectory at random (seeded, so the range is reproducible) and counts it
  once per realization, i.e. realizations repeat the draw, as a model at temperature 0 answers the same request
  the same way. That is the widest case; realizations that answer independently narrow it by up to
  √realizations. The range spans only the chance the dry runs sample (where the walk stops, which candidates
  fail validation); it is as wide as the samples' tails reach, so more ``samples`` widen it towards the truth.
  Methods whose calls do not depend on the answers get a range of one point.
- **Shared stages**: a request of a stage the method declares shareable (``shareable_stages``, e.g. RCTA's
  summary and outline) or the sweep marks ``shareable`` is counted once per backbone × trajectory × realization
  across the sweep's methods — identical content, stage and backbone, as the runner's cache key sees it — and
  charged to the first method in config order that sends it, as the runner pays for it once.
- **USD**: the backbone's default price (`build_prices`; time-of-day windows are ignored) over prompt and output
  tokens.

Failures in the dry run (a prompt that cannot fit the context window) are counted per row, not raised.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rcarun.backends import ChatMessage, ChatRequest, ChatToolCall, Usage, prompt_size, utf8_length
from rcarun.budgets import PriceTable, TokenEstimator, clamp_to_context, next_length_budget
from rcarun.data import Record, Trajectory, iter_dataset, load_manifest
from rcarun.errors import ConfigError, DataError, RcarunError
from rcarun.methods import (
    Message,
    Method,
    Reasoning,
    Reply,
    ToolCall,
    ToolChoice,
    create_method,
    home_backbone,
)
from rcarun.mock.answers import (
    DEFAULT_TOOL_ROUNDS_MAX,
    count_text_tokens,
    filler_sentence,
    generate_value,
    simulate_tool_calls,
    tool_calls_text,
)
from rcarun.runner.answers import parse_json_answer
from rcarun.runner.cache import call_cache_key
from rcarun.runner.config import BackboneConfig, StageConfig, SweepConfig
from rcarun.runner.scheduler import build_prices, check_method_backbones

__all__ = ["CHANCE_DRAWS", "ChanceRange", "EstimateRow", "EstimatingLLM", "SweepEstimate", "estimate_sweep"]

# Dry runs per item: enough that Step-by-step's chance stopping point mostly averages out (more: --samples).
DEFAULT_SAMPLES = 16

CHANCE_DRAWS = 1000
"""Resampled sweeps behind a `ChanceRange` (its ends are the 25th and 975th of them)."""


@dataclass(frozen=True, slots=True)
class ChanceRange:
    """The central 95% of a total over resampled sweeps (module docstring, "Chance range"): (low, high) each."""

    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    usd: tuple[float, float]


@dataclass(frozen=True, slots=True)
class EstimateRow:
    """One backbone × method: totals over every trajectory and realization of the sweep.

    Attributes:
        trajectories / realizations: the sizes the totals cover (items = trajectories × realizations).
        calls_expected: mean logical calls (length retries not counted); shared calls counted once.
        calls_max: the most calls a dry run made, or the bound a method declares (Step-by-step: no early stop).
        shared_calls: calls another method of the sweep already pays for (not in the token or USD figures).
        attempts_expected: calls plus the expected length retries.
        prompt_tokens_* / output_tokens_* / usd_*: expected and worst case (see the module docstring).
        failed_items: items whose dry run raised (e.g. a prompt larger than the context window), per sample mean.
        chance_range: the central 95% of the totals one sweep could give (None with a single sample).
        prompt_tokens_expected_se: the standard error of ``prompt_tokens_expected`` as a mean of ``samples`` dry
            runs (0 where the answers do not change the prompts; None with a single sample). It shrinks with
            more samples; the chance range does not, beyond what the samples' tails reach.
    """

    backbone: str
    method: str
    trajectories: int
    realizations: int
    calls_expected: float
    calls_max: int
    shared_calls: float
    attempts_expected: float
    prompt_tokens_expected: int
    prompt_tokens_worst: int
    output_tokens_expected: int
    output_tokens_worst: int
    usd_expected: float
    usd_worst: float
    failed_items: float
    chance_range: ChanceRange | None = None
    prompt_tokens_expected_se: float | None = None

    @property
    def usd_per_trajectory(self) -> float:
        """Expected USD per trajectory (all realizations)."""
        return self.usd_expected / self.trajectories if self.trajectories else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "usd_per_trajectory": self.usd_per_trajectory}


@dataclass(frozen=True, slots=True)
class SweepEstimate:
    """Every backbone × method row, and the chance ranges of groups of rows drawn jointly.

    Attributes:
        method_ranges: per method over its backbones (empty with a single sample).
        usd_range: the whole sweep's USD (None with a single sample).
    """

    rows: tuple[EstimateRow, ...]
    trajectories: int
    realizations: int
    samples: int
    data_problems: int
    method_ranges: Mapping[str, ChanceRange]
    usd_range: tuple[float, float] | None

    @property
    def usd_expected(self) -> float:
        return sum(row.usd_expected for row in self.rows)

    @property
    def usd_worst(self) -> float:
        return sum(row.usd_worst for row in self.rows)


@dataclass(slots=True)
class _Tally:
    """Counts of one item (backbone × method × trajectory) in one dry run."""

    calls: int = 0
    shared_calls: int = 0
    attempts: int = 0
    prompt_expected: int = 0
    prompt_worst: int = 0
    output_expected: int = 0
    output_worst: int = 0
    failed: int = 0
    # The longest length-retry chain of one call (attempts, output budget summed), for bounds built on it.
    chain_attempts: int = 0
    chain_output: int = 0


@dataclass(slots=True)
class _Sums:
    """One backbone × method over the trajectories: means over samples, and the bounds."""

    calls: float = 0.0
    calls_max: int = 0
    shared_calls: float = 0.0
    attempts: float = 0.0
    prompt_expected: float = 0.0
    prompt_worst: float = 0.0
    output_expected: float = 0.0
    output_worst: float = 0.0
    failed: float = 0.0
    prompt_mean_variance: float = 0.0


class EstimatingLLM:
    """The `LLM` protocol for a dry run: counts what the request would cost and answers with a synthetic value.

    Args:
        backbone: the backbone the request would go to (model, context window, output limit, chars per token).
        name: the backbone's name in the sweep (part of the shared-request identity).
        stages: the sweep's stage policies (first budget, length retries and cap, shareable).
        method_label: the method sending (part of the request identity unless the stage is shareable).
        shareable_stages: stages the method declares identical across its conditions.
        shared: identities of shareable requests already counted for this backbone × trajectory × realization.
        tally: where this item's counts go.
        sample: the dry run's number; seeds the answers.
        reasoning_tokens: the expected reasoning tokens per call on this backbone.
    """

    def __init__(
        self,
        backbone: BackboneConfig,
        *,
        name: str,
        stages: Mapping[str, StageConfig],
        method_label: str,
        shareable_stages: frozenset[str],
        budgeted_stages: frozenset[str] = frozenset(),
        shared: set[str],
        tally: _Tally,
        sample: int = 0,
        reasoning_tokens: int = 0,
        sibling: Callable[[str], EstimatingLLM] | None = None,
    ) -> None:
        self._backbone = backbone
        self._name = name
        self._stages = stages
        self._method_label = method_label
        self._shareable_stages = shareable_stages
        self._budgeted_stages = budgeted_stages
        self._shared = shared
        self._tally = tally
        self._sample = sample
        self._reasoning_tokens = reasoning_tokens
        self._estimator = TokenEstimator(backbone.chars_per_token)
        # Makes the same item's LLM on another backbone (a judge panel's judges).
        self._sibling = sibling
        self.calls = 0

    @property
    def backbone(self) -> str:
        return self._name

    def for_backbone(self, name: str) -> EstimatingLLM:
        if name == self._name:
            return self
        if self._sibling is None:
            raise ConfigError(f"this dry run reaches no backbone but {self._name!r}")
        return self._sibling(name)

    @property
    def context_window(self) -> int | None:
        return self._backbone.context_window

    def estimate_tokens(self, text: str) -> int:
        return self._estimator.estimate(utf8_length(text))

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        stage: str,
        max_tokens: int,
        schema: Mapping[str, Any] | None = None,
        temperature: float | None = None,
        reasoning: Reasoning | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        sample: int = 0,
        tool_choice: ToolChoice | None = None,
    ) -> Reply:
        backbone = self._backbone
        policy = self._stages.get(stage) or StageConfig()
        wire_messages = tuple(
            ChatMessage(
                m.role,
                m.content,
                tool_calls=tuple(ChatToolCall(c.id, c.name, c.arguments) for c in m.tool_calls),
                tool_call_id=m.tool_call_id,
            )
            for m in messages
        )
        wire_tools = tuple(tools or ())
        size = prompt_size(wire_messages, wire_tools)
        prompt = self._estimator.estimate(
            size.utf8_bytes
        )  # with the runner's margin: budgets and the worst case
        prompt_expected = math.ceil(size.chars / backbone.chars_per_token)
        budget = clamp_to_context(
            policy.first_budget(max_tokens, method_sets_it=stage in self._budgeted_stages),
            context_window=backbone.context_window,
            prompt_tokens_estimate=prompt,
            model_max_output=backbone.max_output_tokens,
        )
        request = ChatRequest(
            messages=wire_messages,
            max_tokens=budget,
            temperature=temperature,
            schema=schema,
            reasoning=reasoning,
            tools=wire_tools,
            tool_choice=tool_choice,
        )
        request_sha = request.sha256()
        shareable = policy.shareable or stage in self._shareable_stages
        key = call_cache_key(
            backbone=self._name,
            model=backbone.model,
            request_sha256=request_sha,
            stage=stage,
            realization=0,
            method_label=None if shareable else self._method_label,
            sample=sample,
        )
        # Seeded by backbone and request (not the method), so a shared request gets one answer in every method.
        seed = f"{self._name}:{request_sha}:{self._sample}:{sample}"
        rng = random.Random(int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8]))
        tool_calls = _simulated_tool_calls(wire_messages, wire_tools, tool_choice, backbone.model, rng)
        if tool_calls:
            answer = tool_calls_text(
                [{"function": {"name": c.name, "arguments": c.arguments}} for c in tool_calls]
            )
        elif schema is not None:
            answer = json.dumps(generate_value(schema, rng), ensure_ascii=False)
        else:
            answer = filler_sentence(rng)
        self.calls += 1
        tally = self._tally
        if shareable and key in self._shared:
            tally.shared_calls += 1
            return self._reply(answer, schema, "stop", attempts=1, tool_calls=tool_calls)
        if shareable:
            self._shared.add(key)
        tally.calls += 1

        chain = self._budget_chain(budget, policy, prompt)
        tally.prompt_worst += prompt * len(chain)
        tally.output_worst += sum(chain)
        tally.chain_attempts = max(tally.chain_attempts, len(chain))
        tally.chain_output = max(tally.chain_output, sum(chain))

        cpt = backbone.chars_per_token
        needed = self._reasoning_tokens + count_text_tokens(answer, cpt)
        # Attempts until a budget holds the whole output, or the chain ends.
        attempts = next((i + 1 for i, room in enumerate(chain) if needed <= room), len(chain))
        final_budget = chain[attempts - 1]
        tally.attempts += attempts
        tally.prompt_expected += prompt_expected * attempts
        tally.output_expected += sum(chain[: attempts - 1]) + min(needed, final_budget)
        if needed <= final_budget:
            return self._reply(answer, schema, "stop", attempts=attempts, tool_calls=tool_calls)
        if tool_calls:
            return self._reply("", schema, "length", attempts=attempts)  # calls cut short are no calls
        # Out of budget even after the retries: thinking first, then what is left of the answer.
        room = max(0, final_budget - self._reasoning_tokens)
        return self._reply(answer[: math.floor(room * cpt)], schema, "length", attempts=attempts)

    def _budget_chain(self, first: int, policy: StageConfig, prompt: int) -> list[int]:
        """The first budget and each doubled budget the stage's length retries may use."""
        chain = [first]
        for _ in range(policy.length_retries):
            grown = next_length_budget(
                chain[-1],
                cap=policy.length_cap,
                model_max_output=self._backbone.max_output_tokens,
                context_window=self._backbone.context_window,
                prompt_tokens=prompt,
            )
            if grown is None:
                break
            chain.append(grown)
        return chain

    @staticmethod
    def _reply(
        text: str,
        schema: Mapping[str, Any] | None,
        finish_reason: str,
        *,
        attempts: int,
        tool_calls: tuple[ToolCall, ...] = (),
    ) -> Reply:
        if tool_calls:
            return Reply(
                text="",
                parsed=None,
                parse_error=None,
                finish_reason="tool_calls",
                attempts=attempts,
                tool_calls=tool_calls,
            )
        parsed: Any = None
        parse_error: str | None = None
        if schema is not None:
            parsed, parse_error = parse_json_answer(text)
        return Reply(
            text=text, parsed=parsed, parse_error=parse_error, finish_reason=finish_reason, attempts=attempts
        )


def _simulated_tool_calls(
    messages: Sequence[ChatMessage],
    tools: Sequence[Mapping[str, Any]],
    tool_choice: ToolChoice | None,
    model: str,
    rng: random.Random,
) -> tuple[ToolCall, ...]:
    """The calls the simulator would make for this request (its rule, its default number of rounds)."""
    if not tools:
        return ()
    body: dict[str, Any] = {
        "messages": [
            {
                "role": m.role,
                "content": m.content,
                "tool_calls": [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in m.tool_calls
                ],
            }
            for m in messages
        ],
        "tools": list(tools),
        "tool_choice": tool_choice,
    }
    calls = simulate_tool_calls(body, model=model, rounds_max=DEFAULT_TOOL_ROUNDS_MAX, rng=rng)
    return tuple(
        ToolCall(call["id"], call["function"]["name"], call["function"]["arguments"]) for call in calls or ()
    )


def estimate_sweep(
    config: SweepConfig,
    *,
    samples: int = DEFAULT_SAMPLES,
    reasoning_tokens: Mapping[str, int] | None = None,
) -> SweepEstimate:
    """Dry-run every backbone × method × trajectory of ``config`` and total the expected and worst-case cost.

    Synchronous (it runs its own event loop): call it outside a running loop.

    Args:
        config: the sweep (backbones must be resolved: ``config.backbones`` is what is estimated).
        samples: dry runs per item with different answer seeds; expected figures are their mean.
        reasoning_tokens: expected reasoning tokens per call, by backbone name (default 0).

    Raises:
        ConfigError: unknown method, duplicate labels, no backbones, ``samples`` below 1.
        DataError: no trajectories (or a bad record with ``strict_data``).
    """
    if samples < 1:
        raise ConfigError(f"samples must be >= 1, got {samples}")
    if not config.backbones:
        raise ConfigError("the sweep has no backbones to estimate")
    methods = [create_method(m.name, label=m.resolved_label, options=m.options) for m in config.methods]
    labels = [m.label for m in methods]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"method labels must be unique within a sweep, got {labels}")
    check_method_backbones(methods, config)
    problems: list[DataError] = []
    trajectories = [record.trajectory for record in _records(config, problems)]
    if not trajectories:
        raise DataError("no trajectories found", path=config.sweep.dataset)
    reasoning = dict(reasoning_tokens or {})
    unknown = sorted(set(reasoning) - set(config.backbones))
    if unknown:
        raise ConfigError(f"reasoning tokens given for backbones the sweep does not use: {unknown}")

    realizations = config.sweep.realizations
    by_label = {method.label: method for method in methods}

    async def dry_runs() -> tuple[dict[_Key, _Sums], list[_Deviations]]:
        sums: dict[_Key, _Sums] = {}
        varying: list[_Deviations] = []
        for name, backbone in config.backbones.items():
            if backbone.is_local:
                continue  # forward passes on this machine: no tokens billed, nothing to estimate
            runs_here = [m for m in methods if not m.reads_model and home_backbone(m) in (None, name)]
            for trajectory in trajectories:
                runs = [
                    await _dry_run(config, name, runs_here, trajectory, sample, reasoning)
                    for sample in range(samples)
                ]
                for key in dict.fromkeys(key for run in runs for key in run):
                    backbone_name, label = key
                    _fold(
                        sums.setdefault(key, _Sums()),
                        [run.get(key, _Tally()) for run in runs],
                        by_label[label],
                        trajectory,
                        config.backbones[backbone_name],
                    )
                deviations = _deviations(runs)
                if deviations:
                    varying.append(deviations)
        return sums, varying

    sums, varying = asyncio.run(dry_runs())  # one loop for the whole estimate, not one per dry run
    draws = _resample(varying, samples) if samples > 1 else {}
    rows: list[EstimateRow] = []
    chances: dict[_Key, _Draws] = {}
    for name, backbone in config.backbones.items():
        prices = build_prices(backbone)
        for method in methods:
            key = (name, method.label)
            if key not in sums:
                continue
            chance = None
            if samples > 1:
                chances[key] = _row_draws(sums[key], draws.get(key), realizations, prices)
                chance = chances[key].central()
            rows.append(_row(name, method.label, sums[key], len(trajectories), realizations, prices, chance))
    method_ranges = {
        method.label: _Draws.total(
            [d for (_, label), d in chances.items() if label == method.label]
        ).central()
        for method in methods
        if any(label == method.label for _, label in chances)
    }
    usd_range = _Draws.total(list(chances.values())).central().usd if chances else None
    return SweepEstimate(
        rows=tuple(rows),
        trajectories=len(trajectories),
        realizations=realizations,
        samples=samples,
        data_problems=len(problems),
        method_ranges=method_ranges,
        usd_range=usd_range,
    )


async def _dry_run(
    config: SweepConfig,
    name: str,
    methods: Sequence[Method],
    trajectory: Trajectory,
    sample: int,
    reasoning_tokens: Mapping[str, int],
) -> dict[tuple[str, str], _Tally]:
    """Every method run by backbone ``name`` on one trajectory, in config order, sharing one set of already-paid
    shareable requests per backbone; counts are keyed by (backbone sent to, method)."""
    shared: dict[str, set[str]] = {}
    tallies: dict[tuple[str, str], _Tally] = {}
    for method in methods:

        def llm_on(backbone_name: str, method: Method = method) -> EstimatingLLM:
            if backbone_name not in config.backbones:
                raise ConfigError(f"the sweep defines no backbone called {backbone_name!r}")
            return EstimatingLLM(
                config.backbones[backbone_name],
                name=backbone_name,
                stages=config.stages,
                method_label=method.label,
                shareable_stages=method.shareable_stages,
                budgeted_stages=frozenset(method.stage_budgets),
                shared=shared.setdefault(backbone_name, set()),
                tally=tallies.setdefault((backbone_name, method.label), _Tally()),
                sample=sample,
                reasoning_tokens=reasoning_tokens.get(backbone_name, 0),
                sibling=llm_on,
            )

        llm = llm_on(name)
        try:
            await method.attribute(trajectory, llm)
        except RcarunError:
            tallies[(name, method.label)].failed += 1
    return tallies


def _fold(
    sums: _Sums, tallies: Sequence[_Tally], method: Method, trajectory: Trajectory, backbone: BackboneConfig
) -> None:
    """Add one trajectory's dry runs: means for the expected figures, the largest run or a bound for the maxima."""
    samples = len(tallies)
    sums.calls += sum(t.calls for t in tallies) / samples
    sums.shared_calls += sum(t.shared_calls for t in tallies) / samples
    sums.attempts += sum(t.attempts for t in tallies) / samples
    sums.prompt_expected += sum(t.prompt_expected for t in tallies) / samples
    sums.output_expected += sum(t.output_expected for t in tallies) / samples
    sums.failed += sum(t.failed for t in tallies) / samples
    if samples > 1:
        # The sampling variance of this trajectory's mean; trajectories are dry-run independently, so they add.
        sums.prompt_mean_variance += statistics.variance(t.prompt_expected for t in tallies) / samples
    worst = max(tallies, key=lambda t: t.prompt_worst + t.output_worst)
    calls_max, prompt_worst, output_worst = (
        max(t.calls for t in tallies),
        worst.prompt_worst,
        worst.output_worst,
    )
    bound = method.worst_case(trajectory, _Counter(backbone))
    if bound is not None:
        # Answers decide when the method stops (Step-by-step: the first flagged step); its declared bound is
        # the maximum, each call at its worst length-retry chain.
        attempts = max(t.chain_attempts for t in tallies) or 1
        chain_output = max(t.chain_output for t in tallies)
        calls_max = max(calls_max, bound.calls)
        prompt_worst = max(prompt_worst, bound.prompt_tokens * attempts)
        output_worst = max(output_worst, bound.calls * chain_output)
    sums.calls_max += calls_max
    sums.prompt_worst += prompt_worst
    sums.output_worst += output_worst


_Key = tuple[str, str]  # (backbone the request went to, method label)
_Deviations = dict[_Key, list[tuple[float, float]]]  # per key, per sample: (prompt, output) minus their mean


def _deviations(runs: Sequence[Mapping[_Key, _Tally]]) -> _Deviations:
    """One backbone × trajectory's dry runs as each sample's distance from their mean, for the keys that vary."""
    varying: _Deviations = {}
    for key in dict.fromkeys(key for run in runs for key in run):
        values = [(t.prompt_expected, t.output_expected) for t in (run.get(key, _Tally()) for run in runs)]
        if len(set(values)) == 1:
            continue
        prompt_mean = statistics.fmean(p for p, _ in values)
        output_mean = statistics.fmean(o for _, o in values)
        varying[key] = [(p - prompt_mean, o - output_mean) for p, o in values]
    return varying


def _resample(varying: Sequence[_Deviations], samples: int) -> dict[_Key, list[tuple[float, float]]]:
    """Per key, ``CHANCE_DRAWS`` draws of the summed deviation: each draw takes one dry run of every varying
    backbone × trajectory (the same one for all its keys, which were answered together)."""
    rng = random.Random(0)
    totals: dict[_Key, list[list[float]]] = {}
    for key in dict.fromkeys(key for unit in varying for key in unit):
        totals[key] = [[0.0, 0.0] for _ in range(CHANCE_DRAWS)]
    for draw in range(CHANCE_DRAWS):
        for unit in varying:
            sample = rng.randrange(samples)
            for key, deviations in unit.items():
                prompt, output = deviations[sample]
                total = totals[key][draw]
                total[0] += prompt
                total[1] += output
    return {key: [(p, o) for p, o in draws] for key, draws in totals.items()}


@dataclass(frozen=True, slots=True)
class _Draws:
    """A total over the resampled sweeps: prompt tokens, output tokens and USD of each draw."""

    prompt: tuple[float, ...]
    output: tuple[float, ...]
    usd: tuple[float, ...]

    @staticmethod
    def total(parts: Sequence[_Draws]) -> _Draws:
        """The draw-by-draw sum: the parts were drawn jointly, so draw k of each belongs to one sweep."""
        return _Draws(*(tuple(map(math.fsum, zip(*columns, strict=True))) for columns in _columns(parts)))

    def central(self) -> ChanceRange:
        def ends(values: tuple[float, ...]) -> tuple[float, float]:
            cuts = statistics.quantiles(values, n=40, method="inclusive")  # 2.5% steps
            return cuts[0], cuts[-1]

        (prompt_low, prompt_high), (output_low, output_high) = ends(self.prompt), ends(self.output)
        return ChanceRange(
            prompt_tokens=(round(prompt_low), round(prompt_high)),
            output_tokens=(round(output_low), round(output_high)),
            usd=ends(self.usd),
        )


def _columns(parts: Sequence[_Draws]) -> tuple[list[tuple[float, ...]], ...]:
    if not parts:
        empty = [(0.0,) * CHANCE_DRAWS]
        return empty, empty, empty
    return [p.prompt for p in parts], [p.output for p in parts], [p.usd for p in parts]


def _row_draws(
    sums: _Sums, deviations: Sequence[tuple[float, float]] | None, realizations: int, prices: PriceTable
) -> _Draws:
    """One row's resampled sweeps: its expected figures moved by each draw's deviation, every realization
    repeating the draw (the widest case, see the module docstring)."""
    moves = deviations or [(0.0, 0.0)] * CHANCE_DRAWS
    prompt = tuple(max(0.0, (sums.prompt_expected + p) * realizations) for p, _ in moves)
    output = tuple(max(0.0, (sums.output_expected + o) * realizations) for _, o in moves)
    price = prices.default
    usd = tuple(
        price.cost_usd(Usage(prompt_tokens=round(p), completion_tokens=round(o)))
        for p, o in zip(prompt, output, strict=True)
    )
    return _Draws(prompt, output, usd)


class _Counter:
    """A `TokenCounter` with the backbone's estimator and context window (what the method sees in a sweep)."""

    def __init__(self, backbone: BackboneConfig) -> None:
        self._estimator = TokenEstimator(backbone.chars_per_token)
        self.context_window = backbone.context_window

    def estimate_tokens(self, text: str) -> int:
        return self._estimator.estimate(utf8_length(text))


def _row(
    backbone: str,
    method: str,
    sums: _Sums,
    trajectories: int,
    realizations: int,
    prices: PriceTable,
    chance_range: ChanceRange | None,
) -> EstimateRow:
    """Totals over every realization (one realization estimated, multiplied), priced at the default price."""
    price = prices.default
    prompt_expected = round(sums.prompt_expected * realizations)
    output_expected = round(sums.output_expected * realizations)
    prompt_worst = round(sums.prompt_worst * realizations)
    output_worst = round(sums.output_worst * realizations)
    return EstimateRow(
        backbone=backbone,
        method=method,
        trajectories=trajectories,
        realizations=realizations,
        calls_expected=sums.calls * realizations,
        calls_max=sums.calls_max * realizations,
        shared_calls=sums.shared_calls * realizations,
        attempts_expected=sums.attempts * realizations,
        prompt_tokens_expected=prompt_expected,
        prompt_tokens_worst=prompt_worst,
        output_tokens_expected=output_expected,
        output_tokens_worst=output_worst,
        usd_expected=price.cost_usd(Usage(prompt_tokens=prompt_expected, completion_tokens=output_expected)),
        usd_worst=price.cost_usd(Usage(prompt_tokens=prompt_worst, completion_tokens=output_worst)),
        failed_items=sums.failed * realizations,
        chance_range=chance_range,
        prompt_tokens_expected_se=None
        if chance_range is None
        else math.sqrt(sums.prompt_mean_variance) * realizations,
    )


def _records(config: SweepConfig, problems: list[DataError]) -> Iterator[Record]:
    """The sweep's records: the dataset, or the manifest's selection with its pinned SHA-256 (as the runner reads)."""
    records = iter_dataset(
        Path(config.sweep.dataset), strict=config.sweep.strict_data, on_problem=problems.append
    )
    if config.sweep.manifest is None:
        yield from records
        return
    listed = {entry.qid: entry for entry in load_manifest(config.sweep.manifest).records}
    for record in records:
        entry = listed.get(record.trajectory.qid)
        if entry is None:
            continue
        if entry.sha256 != record.trajectory.sha256:
            problems.append(DataError("SHA-256 differs from the manifest's; left out", record=entry.qid))
            continue
        yield record
