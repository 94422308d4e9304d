"""Every call of every method shows the task whole, on LongRCA records too (issue #16, item 1).

LongRCA records have no ``question``: the task is in the history (000 Sec. 3.2), and the loader derives it from the
opening step(s) by each source's profile (`rcarun.data.task`). The records here are the five source shapes of
``tests/data/longrca_shapes``, each padded to a long log — so that a binary-search half, an RCTA segment, a FALAT
verification or an ECHO milestone no longer holds step 0 whole — written in the release's format and read by the
loader. Every method runs against a scripted LLM that answers each request with a schema-valid answer and keeps
every request; each request's messages must hold the whole task text.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from helpers.longrca import SOURCES, write_padded
from helpers.scripted import ScriptedLLM
from rcarun.data import Trajectory, iter_dataset
from rcarun.methods import create_method
from rcarun.methods.context import TASK_CHAR_CAP
from rcarun.mock.answers import generate_value

LONG_STEPS = 160  # RCTA cuts at most 80 steps per segment; binary search halves 7 or 8 times

# (name, options): every method of the baselines and the wrappers around them, by its registry name.
OWN_METHODS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("all-at-once", {}),
    ("all-at-once", {"reading": "agentic"}),
    ("step-by-step", {}),
    ("binary-search", {}),
    ("echo", {}),
    ("echo", {"decoupled": True}),
    ("falat", {}),
    ("falat", {"reinstate_carriers": True}),
    ("self-consistency", {"samples": 2}),
    ("self-consistency", {"samples": 2, "base": "binary-search"}),
    ("judge-panel", {"judges": ["judge-a", "judge-b"]}),
    ("judge-panel", {"judges": ["judge-a", "judge-b"], "base": "falat"}),
)
# Methods whose prompts other changes own (RCTA, Continual Search, Passive Continuation): run here too, so that
# this test says whether they show the task in every call, with a message naming who owns the fix.
OTHER_METHODS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("rcta", {}),
    ("rcta/no-a1", {}),
    ("continual-search", {}),
    ("continual-search", {"reading": "inline"}),
    ("passive-continuation", {}),
)


@dataclass
class RecordingLLM(ScriptedLLM):
    """A `ScriptedLLM` on a named backbone whose other backbones share its answers and its request list."""

    name: str = "judge-a"

    @property
    def backbone(self) -> str:
        return self.name

    def for_backbone(self, name: str) -> RecordingLLM:
        return RecordingLLM(self.replies, self.context_window, self.chars_per_token, self.requests, name)


def _answer(request: dict[str, Any]) -> str:
    """A schema-valid answer, seeded by the request; step checks say "no" so that the walk covers the log."""
    if request["stage"] == "step_check":
        return json.dumps({"reason": "This step is fine.", "decisive_error": False})
    schema = request["schema"]
    if schema is None:
        return "No further change."
    rng = random.Random("\n".join(message.content or "" for message in request["messages"]))
    return json.dumps(generate_value(schema, rng))


def _recording_llm(context_window: int | None = None) -> RecordingLLM:
    return RecordingLLM(replies=_answer, context_window=context_window)


def _long_records(
    tmp_path: Path, n_steps: int = LONG_STEPS, filler_chars: int = 120
) -> dict[str, Trajectory]:
    """The five source shapes padded to ``n_steps`` steps, written as a LongRCA dataset and loaded back."""
    for source in SOURCES:
        write_padded(tmp_path / "longrca", source, n_steps, filler_chars)
    loaded = {r.trajectory.source: r.trajectory for r in iter_dataset(tmp_path / "longrca")}
    assert set(loaded) == set(SOURCES)
    return loaded


@pytest.fixture(scope="module")
def long_records(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Trajectory]:
    return _long_records(tmp_path_factory.mktemp("task"))


def _request_text(request: dict[str, Any]) -> str:
    return "\n".join(message.content or "" for message in request["messages"])


def _missing(requests: list[dict[str, Any]], task: str) -> list[str]:
    """``stage #index`` of every request whose messages do not hold the whole task."""
    return [f"{r['stage']} #{i}" for i, r in enumerate(requests) if task not in _request_text(r)]


def test_the_records_state_their_task_in_their_opening_steps(long_records: dict[str, Trajectory]) -> None:
    rules = {source: trajectory.task_source for source, trajectory in long_records.items()}
    assert rules == {
        "swe_bench_pro": "history[0]",
        "terminal_bench_2": "history[0]",
        "travelplanner": "history[0]",
        "vitabench": "history[0..1]",
        "webarena_verified": "history[0]",
    }
    for trajectory in long_records.values():
        assert trajectory.n_steps == LONG_STEPS
        assert trajectory.task.startswith(trajectory.steps[0].content.strip())  # step 0 stays in the log
        assert 200 < len(trajectory.task) < TASK_CHAR_CAP  # shown whole, never cut


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize(
    ("name", "options"), OWN_METHODS, ids=lambda v: json.dumps(v) if isinstance(v, dict) else v
)
async def test_every_call_shows_the_task(
    long_records: dict[str, Trajectory], name: str, options: dict[str, Any], source: str
) -> None:
    trajectory = long_records[source]
    llm = _recording_llm()
    attribution = await create_method(name, options=options).attribute(trajectory, llm)

    assert llm.requests, "the method made no call"
    assert _missing(llm.requests, trajectory.task) == []
    assert attribution.output  # it ran to a prediction, not into an exception


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize(
    ("name", "options"), OTHER_METHODS, ids=lambda v: json.dumps(v) if isinstance(v, dict) else v
)
async def test_every_call_of_rcta_and_continual_search_shows_the_task(
    long_records: dict[str, Trajectory], name: str, options: dict[str, Any], source: str
) -> None:
    trajectory = long_records[source]
    llm = _recording_llm()
    await create_method(name, options=options).attribute(trajectory, llm)

    missing = _missing(llm.requests, trajectory.task)
    assert missing == [], (
        f"{name} sent {len(missing)} of {len(llm.requests)} calls without the task ({', '.join(missing[:8])}); "
        "its prompts belong to the RCTA / Continual Search changes of issue #16 item 1, not to the baselines"
    )


async def test_the_calls_that_do_not_show_step_0_still_show_the_task(
    long_records: dict[str, Trajectory],
) -> None:
    """The check above is not vacuous: these calls show only a part of the log, or step 0 reduced."""
    trajectory = long_records["travelplanner"]
    step_0 = f"[step 0] {trajectory.steps[0].agent}: "

    # Binary search always taking the later half: only its first call shows step 0.
    llm = RecordingLLM(replies=lambda request: json.dumps({"reason": "r", "half": "later"}))
    await create_method("binary-search").attribute(trajectory, llm)
    assert [step_0 in r["user"] for r in llm.requests] == [True] + [False] * 6  # 160, 80, 40, ..., 2 steps
    assert all(f"Task:\n{trajectory.task}\n" in r["user"] for r in llm.requests)

    llm = _recording_llm()
    await create_method("falat").attribute(trajectory, llm)
    verifications = [r for r in llm.requests if r["stage"] == "verify"]
    assert verifications and all(
        f"[step 0] (message) {trajectory.steps[0].agent}" not in r["user"] for r in verifications
    )
    assert all(f"Task:\n{trajectory.task}\n" in r["user"] for r in llm.requests)

    llm = _recording_llm()
    await create_method("echo", options={"context": "focal", "focal": [100]}).attribute(trajectory, llm)
    assert all("[step 0 | L4 milestone]" in r["user"] for r in llm.requests)  # 15 words of the task at most
    assert all(f"Task:\n{trajectory.task}\n" in r["user"] for r in llm.requests)


@pytest.mark.parametrize(
    ("name", "stage"), [("all-at-once", "attribution"), ("step-by-step", "step_check"), ("falat", "locate")]
)
async def test_a_task_step_cut_to_fit_the_context_is_still_shown_whole(
    tmp_path: Path, name: str, stage: str
) -> None:
    """With a small context window the log's step contents are cut in the middle, step 0 among them; the task
    line is not (it is cut only beyond TASK_CHAR_CAP)."""
    trajectory = _long_records(tmp_path, n_steps=60, filler_chars=1500)["swe_bench_pro"]
    llm = _recording_llm(context_window=11_000)
    await create_method(name).attribute(trajectory, llm)

    logs = [r["user"].split("=== LOG START ===", 1)[1] for r in llm.requests if r["stage"] == stage]
    step_0_cut = [log for log in logs if trajectory.steps[0].content.strip() not in log]
    assert step_0_cut, "the context window was meant to cut the task step in the log"
    assert all("[step 0] " in log for log in step_0_cut)  # cut, not left out: its id stays
    assert _missing(llm.requests, trajectory.task) == []
