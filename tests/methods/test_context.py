"""The shared context policy: the prompt budget, the smallest cut that fits, rendering and the output records."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from rcarun.data import Step, Trajectory
from rcarun.methods.context import (
    CONTEXT_MARGIN_TOKENS,
    Truncation,
    cut_middle,
    fit_prompt,
    ground_truth_line,
    prompt_token_budget,
    render_steps,
    truncation_summary,
)


@dataclass
class Counter:
    context_window: int | None
    chars_per_token: float = 4.0

    def estimate_tokens(self, text: str) -> int:
        return math.ceil(len(text) / self.chars_per_token)


def _steps(lengths: list[int]) -> tuple[Step, ...]:
    return tuple(
        Step(index=i, agent=f"A{i % 2}", role="assistant", content="y" * n) for i, n in enumerate(lengths)
    )


def _renderer(steps: tuple[Step, ...], calls: list[int | None]):  # type: ignore[no-untyped-def]
    def render(cap: int | None) -> str:
        calls.append(cap)
        note = "" if cap is None else "NOTE\n"
        return note + render_steps(steps, step_numbers=True, step_char_cap=cap)

    return render


def test_budget_subtracts_output_margin_and_system() -> None:
    counter = Counter(context_window=10_000)
    assert prompt_token_budget(counter, max_tokens=1000, system="s" * 400) == 10_000 - 1000 - 512 - 100
    assert CONTEXT_MARGIN_TOKENS == 512
    assert prompt_token_budget(Counter(context_window=None), max_tokens=1000, system="") is None


def test_unknown_window_none_policy_and_fitting_prompts_are_sent_whole() -> None:
    steps = _steps([4000, 4000])
    for counter, policy in (
        (Counter(None), "cap-steps"),
        (Counter(600), "none"),
        (Counter(100_000), "cap-steps"),
    ):
        calls: list[int | None] = []
        fitted = fit_prompt(
            _renderer(steps, calls),
            [4000, 4000],
            llm=counter,
            max_tokens=10,
            system="",
            policy=policy,
        )
        assert fitted.text == render_steps(steps, step_numbers=True)
        assert fitted.truncation == Truncation(policy=policy)
        assert calls == [None]  # no search when nothing is cut


@pytest.mark.parametrize(("window", "steps_cut"), [(1600, 2), (1250, 2), (1900, 2), (2100, 1), (700, 3)])
def test_cut_is_the_largest_cap_that_fits(window: int, steps_cut: int) -> None:
    steps = _steps([4000, 100, 2500, 30])
    lengths = [len(s.content) for s in steps]
    counter = Counter(context_window=window)
    allowed = window - 100 - CONTEXT_MARGIN_TOKENS - 0  # e.g. 988 tokens = 3952 characters for 1600
    calls: list[int | None] = []
    render = _renderer(steps, calls)
    fitted = fit_prompt(render, lengths, llm=counter, max_tokens=100, system="", policy="cap-steps")

    cap = fitted.truncation.step_char_cap
    assert cap is not None
    assert counter.estimate_tokens(render(cap)) <= allowed < counter.estimate_tokens(render(cap + 1))
    assert fitted.text == render(cap) and fitted.text.startswith("NOTE\n")
    assert fitted.truncation == Truncation(
        policy="cap-steps",
        applied=True,
        step_char_cap=cap,
        steps_cut=steps_cut,
        context_window=window,
        fits=True,
    )
    for step in steps:
        assert f"[step {step.index}] {step.agent}: " in fitted.text


def test_cap_zero_that_still_overflows_is_sent_and_flagged() -> None:
    steps = _steps([50] * 200)  # 200 step headers alone exceed the budget
    fitted = fit_prompt(
        _renderer(steps, []), [50] * 200, llm=Counter(800), max_tokens=100, system="", policy="cap-steps"
    )
    assert fitted.truncation.step_char_cap == 0
    assert fitted.truncation.steps_cut == 200
    assert fitted.truncation.fits is False
    assert fitted.truncation.as_output()["fits"] is False


def test_render_steps_and_cut_middle() -> None:
    steps = (
        Step(index=3, agent="Coder", role="assistant", content="abcdefghij"),
        Step(index=4, agent="Planner", role="user", content="short"),
    )
    assert render_steps(steps, step_numbers=True) == "[step 3] Coder: abcdefghij\n[step 4] Planner: short"
    assert render_steps(steps, step_numbers=False, step_char_cap=5) == (
        "Coder: ab [... 5 characters elided ...] hij\nPlanner: short"
    )
    assert cut_middle("abcdefghij", 4) == "ab [... 6 characters elided ...] ij"
    assert cut_middle("abcdefghij", 0) == " [... 10 characters elided ...] "


def test_ground_truth_line_only_when_asked_and_recorded() -> None:
    with_answer = Trajectory(
        qid="q", source="s", task="t", steps=_steps([1]), sha256="0" * 64, ground_truth="42"
    )
    without = Trajectory(qid="q", source="s", task="t", steps=_steps([1]), sha256="0" * 64)
    assert ground_truth_line(with_answer, True) == "Correct final answer: 42\n"
    assert ground_truth_line(with_answer, False) == ""
    assert ground_truth_line(without, True) == ""


def test_output_records() -> None:
    plain = Truncation(policy="cap-steps")
    cut = Truncation(policy="cap-steps", applied=True, step_char_cap=300, steps_cut=2, context_window=8000)
    tighter = Truncation(
        policy="cap-steps", applied=True, step_char_cap=120, steps_cut=5, context_window=8000
    )
    assert plain.as_output() == {"applied": False, "policy": "cap-steps"}
    assert list(cut.as_output()) == [
        "applied",
        "policy",
        "step_char_cap",
        "steps_cut",
        "context_window",
        "fits",
    ]
    assert truncation_summary("cap-steps", [plain, plain]) == {
        "policy": "cap-steps",
        "prompts": 2,
        "prompts_cut": 0,
    }
    assert truncation_summary("cap-steps", [plain, cut, tighter]) == {
        "policy": "cap-steps",
        "prompts": 3,
        "prompts_cut": 2,
        "min_step_char_cap": 120,
        "context_window": 8000,
        "all_fit": True,
    }
