"""Output budgets: doubling after a length stop, clamped by cap, model output and context; first-attempt clamp."""

from __future__ import annotations

import pytest

from rcarun.budgets import clamp_to_context, next_length_budget
from rcarun.errors import ContextOverflow


def test_doubles_when_nothing_else_binds() -> None:
    assert (
        next_length_budget(4_096, model_max_output=None, context_window=None, prompt_tokens=10_000) == 8_192
    )


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"cap": 6_000}, 6_000),
        ({"model_max_output": 5_000}, 5_000),
        ({"context_window": 32_768, "prompt_tokens": 26_768}, 6_000),
    ],
)
def test_the_tightest_bound_wins(kwargs: dict[str, int], expected: int) -> None:
    arguments = {"model_max_output": None, "context_window": None, "prompt_tokens": 0, **kwargs}
    assert next_length_budget(4_096, **arguments) == expected  # type: ignore[arg-type]


def test_default_cap_is_the_papers_65536() -> None:
    assert next_length_budget(40_000, model_max_output=None, context_window=None, prompt_tokens=0) == 65_536
    assert next_length_budget(65_536, model_max_output=None, context_window=None, prompt_tokens=0) is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"cap": 4_096},
        {"model_max_output": 4_000},
        {"context_window": 8_192, "prompt_tokens": 4_096},  # exactly no room to grow
        {"context_window": 8_192, "prompt_tokens": 8_000},
    ],
)
def test_no_growth_means_no_retry(kwargs: dict[str, int]) -> None:
    arguments = {"model_max_output": None, "context_window": None, "prompt_tokens": 0, **kwargs}
    assert next_length_budget(4_096, **arguments) is None  # type: ignore[arg-type]


def test_clamp_leaves_a_budget_that_fits() -> None:
    assert (
        clamp_to_context(4_096, context_window=None, prompt_tokens_estimate=1, model_max_output=None) == 4_096
    )
    assert (
        clamp_to_context(4_096, context_window=None, prompt_tokens_estimate=1, model_max_output=2_048)
        == 2_048
    )


def test_clamp_to_the_room_the_prompt_leaves_minus_the_safety_margin() -> None:
    budget = clamp_to_context(
        16_384, context_window=32_768, prompt_tokens_estimate=30_000, model_max_output=None, safety_tokens=100
    )
    assert budget == 32_768 - 30_000 - 100


def test_clamp_raises_context_overflow_when_the_prompt_alone_fills_the_context() -> None:
    with pytest.raises(ContextOverflow):
        clamp_to_context(1_024, context_window=32_768, prompt_tokens_estimate=32_700, model_max_output=None)
