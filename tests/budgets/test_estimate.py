"""TokenEstimator: learns the tokenizer's ratio and leans towards overestimating."""

from __future__ import annotations

import random

from rcarun.backends import ChatMessage, PromptSize, Usage, prompt_size
from rcarun.budgets import TokenEstimator, estimated_usage, implausible_usage

ENGLISH = PromptSize(chars=4_000, utf8_bytes=4_000)
EMOJI = PromptSize(chars=1_000, utf8_bytes=4_000)


def test_starts_at_four_characters_per_token_plus_margin_rounding_up() -> None:
    assert TokenEstimator().estimate(4_000) == 1_050
    assert TokenEstimator(margin=0.0).estimate(4_001) == 1_001


def test_converges_on_a_denser_tokenizer_quickly() -> None:
    estimator = TokenEstimator()
    for _ in range(10):
        estimator.calibrate(30_000, 10_000)  # 3 bytes per token
    assert 3.0 <= estimator.bytes_per_token < 3.001
    # The true count is 10,000; the estimate sits the 5 % margin above it.
    assert 10_490 <= estimator.estimate(30_000) <= 10_500


def test_relaxes_slowly_towards_a_sparser_tokenizer() -> None:
    estimator = TokenEstimator(bytes_per_token=3.0)
    estimator.calibrate(50_000, 10_000)  # 5 bytes per token
    assert estimator.bytes_per_token < 3.2  # still overestimates tokens after one report


def test_noisy_reports_are_rarely_underestimated_and_never_by_much() -> None:
    rng = random.Random(3)
    estimator = TokenEstimator()
    errors = []
    for _ in range(500):
        chars = rng.randint(2_000, 200_000)
        true_tokens = round(chars / rng.gauss(3.5, 0.15))
        errors.append((estimator.estimate(chars) - true_tokens) / true_tokens)
        estimator.calibrate(chars, true_tokens)
    settled = errors[50:]
    assert sum(error < 0 for error in settled) / len(settled) < 0.1
    assert min(settled) > -0.08


def test_tiny_reports_dominated_by_template_overhead_are_ignored() -> None:
    estimator = TokenEstimator()
    estimator.calibrate(20, 15)
    assert estimator.bytes_per_token == 4.0 and estimator.samples == 0


def test_a_prompt_is_measured_in_characters_and_utf8_bytes() -> None:
    size = prompt_size(
        (ChatMessage("user", "ab 日本 🚀"),), ({"type": "function", "function": {"name": "é"}},)
    )
    spec = '[{"type":"function","function":{"name":"é"}}]'
    assert size == PromptSize(chars=7 + len(spec), utf8_bytes=3 + 6 + 1 + 4 + len(spec) + 1)


def test_a_budget_reserves_four_tokens_a_character_until_the_first_report_then_the_estimate() -> None:
    estimator = TokenEstimator()
    # Nothing known yet: the most a bill is believed to be, whatever the text.
    assert estimator.reservation(ENGLISH) == 16_000
    assert estimator.reservation(EMOJI) == 4_000
    estimator.calibrate(
        4_000, 2_000
    )  # the first report shows twice the guess: it replaces the prior outright
    assert estimator.bytes_per_token == 2.0
    assert estimator.reservation(ENGLISH) == estimator.estimate(4_000) == 2_100


def test_a_ratio_learned_on_english_holds_for_emoji_billed_per_byte() -> None:
    estimator = TokenEstimator()
    estimator.calibrate(ENGLISH.utf8_bytes, ENGLISH.utf8_bytes)  # a token a byte
    # 1,000 emoji are 4,000 bytes: billed 4,000 tokens at a token a byte, reserved with the margin above that.
    assert estimator.reservation(EMOJI) == 4_200


def test_without_a_bill_to_believe_the_prompt_is_charged_and_then_reserved_a_token_a_byte() -> None:
    estimator = TokenEstimator()
    assert estimator.unreported(ENGLISH) == 4_000 and estimator.unreported(EMOJI) == 4_000
    estimator.note_unreported()  # an answer without usage: later calls will be charged that, so reserve it
    assert estimator.reservation(ENGLISH) == 4_000
    assert estimator.reserved_output(1_000) == 1_000


def test_usage_no_bill_can_be_is_named_and_the_bill_that_can_be_is_not() -> None:
    def why(**usage: int) -> str | None:
        return implausible_usage(
            Usage(**usage),
            prompt=PromptSize(chars=1_000, utf8_bytes=1_000),
            messages=2,
            max_tokens=500,
            context_window=32_000,
        )

    assert why(prompt_tokens=300, completion_tokens=750) is None  # 1.5x the budget: over-reported, not absurd
    assert why(prompt_tokens=4_000) is None  # four tokens a character: believed
    assert why(prompt_tokens=10**20) is not None and "prompt_tokens" in why(prompt_tokens=10**20)  # type: ignore[operator]
    assert why(prompt_tokens=40_000) is not None  # more than the context window (and than 1,000 chars can be)
    assert "completion_tokens" in (why(prompt_tokens=300, completion_tokens=10**12) or "")


def test_a_missing_bill_is_estimated_conservatively_from_the_request_and_the_answer() -> None:
    estimator = TokenEstimator()
    stopped = estimated_usage(
        estimator,
        prompt=PromptSize(chars=8_000, utf8_bytes=8_000),
        answer_bytes=400,
        max_tokens=1_000,
        finish_reason="stop",
    )
    assert stopped == Usage(prompt_tokens=8_000, completion_tokens=105)
    cut = estimated_usage(
        estimator,
        prompt=PromptSize(chars=8_000, utf8_bytes=8_000),
        answer_bytes=400,
        max_tokens=1_000,
        finish_reason="length",
    )
    assert cut.completion_tokens == 1_000  # hidden reasoning cannot be seen: the whole budget is charged


def test_output_is_reserved_at_twice_its_budget_until_a_report_shows_how_far_past_it_the_backbone_bills() -> (
    None
):
    estimator = TokenEstimator()
    assert estimator.reserved_output(1_000) == 2_000  # billed up to twice the budget is believed
    estimator.calibrate_output(1_000, 300)  # within its budget: the budget is what a call may cost
    assert estimator.reserved_output(1_000) == 1_000
    estimator.calibrate_output(1_000, 1_500)  # billed past it: every later call may be too
    assert estimator.reserved_output(2_000) == 3_000
    estimator.calibrate_output(1_000, 500)
    assert estimator.reserved_output(2_000) == 3_000
