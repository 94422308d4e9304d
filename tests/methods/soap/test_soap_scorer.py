"""SOAP end to end on a fake causal `ForwardModel`: features per target from its own pass, the equivalence of
shared and per-target passes, and the scorer's prediction, ranked list and accounting."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pytest

from rcarun.data import Step, Trajectory
from rcarun.methods.forward import ForwardModel, SegmentStates
from rcarun.methods.soap import (
    Band,
    SoapConfig,
    SoapScorer,
    extract_features,
    fit_soap_reference,
    plan_for,
)

_STEP = re.compile(r"\[step (\d+)\] [^:]+: (.*)\n", re.DOTALL)


class FakeModel:
    """A causal fake: a segment's outputs depend only on itself and the segments before it in the pass.

    Step ``k``'s representation at ``hidden_states`` index ``l`` is ``(l + 1) · vectors[content]``; its
    attention at decoder layer ``l`` to step ``j`` is ``attention[l][(k, j)]``, to the task
    ``task_attention``, to itself ``self_attention``. With ``context_noise`` the outputs also depend on which
    segments precede (as a real model's do): every value shifts with the ids before it, and attention rows are
    renormalised over them.
    """

    def __init__(
        self,
        vectors: dict[str, Sequence[float]],
        *,
        attention: dict[int, dict[tuple[int, int], float]] | None = None,
        task_attention: float = 0.4,
        self_attention: float = 0.1,
        n_layers: int = 2,
        context_tokens: int = 8192,
        template_tokens: int = 3,
        context_noise: float = 0.0,
    ) -> None:
        self.name = "fake-causal"
        self.vectors = vectors
        self.attention = attention or {}
        self.task_attention = task_attention
        self.self_attention = self_attention
        self.n_layers = n_layers
        self.context_tokens = context_tokens
        self.template_tokens = template_tokens
        self.noise = context_noise
        self.hidden = len(next(iter(vectors.values())))
        self.calls: list[list[str]] = []

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    async def encode(self, segments: Sequence[str]) -> SegmentStates:
        self.calls.append(list(segments))
        tokens = tuple(self.count_tokens(s) for s in segments)
        if sum(tokens) + self.template_tokens > self.context_tokens:
            raise ValueError("segments exceed context_tokens")
        keys: list[tuple[int, str]] = []
        for text in segments:
            match = _STEP.fullmatch(text)
            keys.append((int(match.group(1)), match.group(2)) if match else (-1, text))
        n = len(segments)
        pooled = np.zeros((self.n_layers + 1, n, self.hidden), dtype=np.float32)
        attention = np.zeros((self.n_layers, n, n), dtype=np.float32)
        nll = np.zeros(n, dtype=np.float32)
        for i, (step, content) in enumerate(keys):
            signature = sum(k + 2 for k, _ in keys[:i])
            vector = np.asarray(self.vectors.get(content, np.zeros(self.hidden)), dtype=np.float64)
            for layer in range(self.n_layers + 1):
                pooled[layer, i] = vector * (layer + 1) + self.noise * signature
            nll[i] = len(content) / 10 + self.noise * signature
            if step < 0:
                continue
            for layer in range(self.n_layers):
                table = self.attention.get(layer, {})
                row = [self.task_attention] + [table.get((step, keys[j][0]), 0.0) for j in range(1, i)]
                if self.noise:
                    row = [value / (1 + sum(row)) for value in row]
                attention[layer, i, :i] = row
                attention[layer, i, i] = self.self_attention
        return SegmentStates(tokens, pooled, attention, nll)


def _trajectory(qid: str, contents: Sequence[str]) -> Trajectory:
    agents = ["Planner", "Searcher", "Coder", "Checker", "Searcher", "Reporter", "Coder", "Checker"]
    steps = tuple(
        Step(index=i, agent=agents[i % len(agents)], role="assistant", content=text)
        for i, text in enumerate(contents)
    )
    return Trajectory(qid=qid, source="test", task="Fix the bug", steps=steps, sha256="0" * 64)


def test_the_fake_satisfies_the_protocol() -> None:
    model: ForwardModel = FakeModel({"a": [1.0]})
    assert model.n_layers == 2


# Reference directions: e1 (largest), e2, e3, e4 (smallest); the band [0, 2) is "ordinary".
VECTORS = {
    "r0": [4, 0, 0, 0], "r1": [-4, 0, 0, 0], "r2": [0, 2, 0, 0], "r3": [0, -2, 0, 0],
    "r4": [0, 0, 1, 0], "r5": [0, 0, -1, 0], "r6": [0, 0, 0, 0.5], "r7": [0, 0, 0, -0.5],
    # base scores 1 - energy in [0, 2):  0,  0,  0.5,  1,  0,  1
    "a": [1, 1, 0, 0], "b": [1, 1, 0, 0], "c": [1, 0, 1, 0],
    "d": [0, 0, 1, 0], "e": [0, 1, 0, 0], "f": [0, 0, 3, 4],
}  # fmt: skip
# Decoder layer 0: the dependencies of the example; layer 1: none. Relative weights (rows sum to 1):
# 1: [1]; 2: [.5 .5]; 3: [.25 .25 .5]; 4: [.2 .2 0 .6]; 5: [.05 .05 .6 .1 .2]
ATTENTION = {
    0: {
        (1, 0): 0.5,
        (2, 0): 0.05, (2, 1): 0.05,
        (3, 0): 0.125, (3, 1): 0.125, (3, 2): 0.25,
        (4, 0): 0.1, (4, 1): 0.1, (4, 3): 0.3,
        (5, 0): 0.025, (5, 1): 0.025, (5, 2): 0.3, (5, 3): 0.05, (5, 4): 0.1,
    }
}  # fmt: skip
REFERENCE_TRAJECTORIES = [
    _trajectory("ref1", ["r0", "r2", "r4", "r6"]),
    _trajectory("ref2", ["r1", "r3", "r5", "r7"]),
]
TARGET = _trajectory("target", ["a", "b", "c", "d", "e", "f"])
CONFIG = SoapConfig(layer=2, band=Band(0, 2), attention_layers=(0,), window=None, gamma=0.6)


async def _scorer(config: SoapConfig = CONFIG) -> SoapScorer:
    model = FakeModel(VECTORS, attention=ATTENTION)
    references = [await extract_features(model, t) for t in REFERENCE_TRAJECTORIES]
    return SoapScorer(fit_soap_reference(references, config), config)


async def test_rescoring_moves_the_prediction_from_the_symptom_to_the_step_it_depends_on() -> None:
    scorer = await _scorer()
    model = FakeModel(VECTORS, attention=ATTENTION)
    attribution = await scorer.attribute(TARGET, model)
    # into 2: (.5·1 + .6·1) / max(1, 1.1) = 1.0 -> 0.5 + 0.6 = 1.1;  into 3: (.6·0 + .1·1) / 1 -> 1.06;
    # 5: no dependents -> 1.0;  into 1: (.5·.5 + .25·1 + .05·1) / 1 -> 0.33;  into 0: .55 / 2 -> 0.165
    assert (attribution.pred_step, attribution.pred_role) == (2, "Coder")
    assert attribution.role_valid and attribution.step_valid and not attribution.abstained
    ranked = attribution.output["ranked"]
    assert [entry["step"] for entry in ranked] == [2, 3, 5, 1, 0]
    assert [entry["score"] for entry in ranked] == pytest.approx([1.1, 1.06, 1.0, 0.33, 0.165])
    assert [entry["base"] for entry in ranked] == pytest.approx([0.5, 1.0, 1.0, 0.0, 0.0])
    assert [entry["agent"] for entry in ranked] == ["Coder", "Checker", "Reporter", "Searcher", "Planner"]
    # one pass: template 3 + task "Task: Fix the bug Steps:" 5 + six "[step k] Agent: x" of 4 tokens
    assert attribution.output["passes"] == 1 and len(model.calls) == 1
    assert attribution.output["tokens"] == 3 + 5 + 6 * 4
    assert attribution.output["windowed"] is False
    assert attribution.output["config"]["gamma"] == 0.6


async def test_without_rescoring_or_with_attention_from_another_layer_the_symptom_wins() -> None:
    model = FakeModel(VECTORS, attention=ATTENTION)
    base_only = SoapConfig(layer=2, band=Band(0, 2), attention_layers=(0,), rescoring="none")
    assert (await (await _scorer(base_only)).attribute(TARGET, model)).pred_step == 3
    silent_layer = SoapConfig(layer=2, band=Band(0, 2), attention_layers=(1,), window=None)
    assert (await (await _scorer(silent_layer)).attribute(TARGET, model)).pred_step == 3


async def test_a_windowed_target_reads_dependencies_only_inside_its_own_pass() -> None:
    # 20 tokens: template 3 + task 5 + three steps of 4 -> windows [0..2], [1..3], [2..4], [3..5]
    model = FakeModel(VECTORS, attention=ATTENTION, context_tokens=20)
    attribution = await (await _scorer()).attribute(TARGET, model)
    assert attribution.output["passes"] == 4 and attribution.output["windowed"] is True
    assert attribution.output["tokens"] == 4 * 20
    assert [len(call) for call in model.calls] == [4, 4, 4, 4]
    assert (
        model.calls[3][0].startswith("Task: Fix the bug") and model.calls[3][-1] == "[step 5] Reporter: f\n"
    )
    # weights now: 3: [0 1/3 2/3]; 4: [0 0 0 1]; 5: [0 0 0 1/3 2/3]
    # into 2: 2/3·1 -> 0.5 + 0.4 = 0.9;  into 3: (1·0 + 1/3·1) / max(1, 4/3) = 0.25 -> 1.15
    assert attribution.pred_step == 3
    assert attribution.output["ranked"][0]["score"] == pytest.approx(1.15)
    assert attribution.output["ranked"][1]["step"] == 5
    assert attribution.output["ranked"][2] == pytest.approx(
        {"step": 2, "score": 0.9, "base": 0.5, "agent": "Coder"}
    )


async def test_features_keep_each_targets_row_of_its_own_pass_and_the_task_apart() -> None:
    model = FakeModel(VECTORS, attention=ATTENTION, context_tokens=20)
    features = await extract_features(model, TARGET, layers=(2,))
    assert features.passes == 4
    np.testing.assert_array_equal(features.retained[5], [False, False, False, True, True, False])
    np.testing.assert_allclose(features.attention[0, 5], [0, 0, 0, 0.05, 0.1, 0])  # no self, no dropped steps
    np.testing.assert_allclose(features.task_attention[:, 5], [0.4, 0.4])
    np.testing.assert_allclose(features.representation(2)[3], [0, 0, 3, 0])
    with pytest.raises(KeyError, match="layer 1 was not kept"):
        features.representation(1)


async def test_shared_passes_give_every_step_exactly_what_its_own_prompt_gives() -> None:
    contents = ["one two", "three", "four five six", "seven", "eight nine", "ten", "eleven twelve", "x"]
    vectors = {text: [float(i), float(i % 3), 1.0] for i, text in enumerate(contents)}
    attention = {
        layer: {(i, j): 0.1 * (1 + (i * j + layer) % 4) for i in range(8) for j in range(i)}
        for layer in (0, 1)
    }
    trajectory = _trajectory("long", contents)
    results = {}
    calls = {}
    for sharing in ("grouped", "prefix", "none"):
        model = FakeModel(vectors, attention=attention, context_tokens=26, context_noise=0.01)
        results[sharing] = await extract_features(model, trajectory, sharing=sharing)
        calls[sharing] = len(model.calls)
    _, plan = plan_for(FakeModel(vectors, context_tokens=26), trajectory)
    assert plan.windowed and plan.starts[0] == 0 and plan.starts[-1] > 0
    assert calls["grouped"] < calls["prefix"] < calls["none"] == 8
    literal = results["none"]
    for sharing in ("grouped", "prefix"):
        shared = results[sharing]
        np.testing.assert_array_equal(shared.pooled, literal.pooled)
        np.testing.assert_array_equal(shared.attention, literal.attention)
        np.testing.assert_array_equal(shared.task_attention, literal.task_attention)
        np.testing.assert_array_equal(shared.retained, literal.retained)
        np.testing.assert_array_equal(shared.nll, literal.nll)
    # The fake is context-sensitive: one pass over everything (a bigger window) gives other windowed rows.
    unlimited = await extract_features(
        FakeModel(vectors, attention=attention, context_noise=0.01), trajectory, context_tokens=None
    )
    assert unlimited.passes == 1
    last = trajectory.n_steps - 1
    assert not np.allclose(unlimited.attention[:, last], literal.attention[:, last])
    np.testing.assert_array_equal(unlimited.pooled[:, 0], literal.pooled[:, 0])


async def test_the_limit_is_the_smaller_of_the_options_and_the_models() -> None:
    model = FakeModel(VECTORS, context_tokens=20)
    assert (await extract_features(model, TARGET, context_tokens=8192)).passes == 4
    assert (await extract_features(FakeModel(VECTORS), TARGET, context_tokens=20)).passes == 4
    assert (await extract_features(FakeModel(VECTORS), TARGET)).passes == 1


async def test_an_empty_trajectory_is_an_abstention_and_a_mismatched_reference_is_refused() -> None:
    scorer = await _scorer()
    empty = Trajectory(qid="empty", source="test", task="t", steps=(), sha256="0" * 64)
    attribution = await scorer.attribute(empty, FakeModel(VECTORS))
    assert attribution.abstained and attribution.pred_step is None
    with pytest.raises(ValueError, match="layer 2"):
        SoapScorer(scorer.reference, SoapConfig(layer=1, band=Band(0, 2), attention_layers=(0,)))
    with pytest.raises(ValueError, match="needs a fitted reference"):
        SoapScorer(None, CONFIG)
    too_deep = SoapScorer(scorer.reference, SoapConfig(layer=2, band=Band(0, 2), attention_layers=(5,)))
    with pytest.raises(ValueError, match="2 decoder layers"):
        await too_deep.attribute(TARGET, FakeModel(VECTORS))
