"""TokenEstimator: learns the tokenizer's ratio and leans towards overestimating."""

from __future__ import annotations

import random

from rcarun.budgets import TokenEstimator


def test_starts_at_four_characters_per_token_plus_margin_rounding_up() -> None:
    assert TokenEstimator().estimate(4_000) == 1_050
    assert TokenEstimator(margin=0.0).estimate(4_001) == 1_001


def test_converges_on_a_denser_tokenizer_quickly() -> None:
    estimator = TokenEstimator()
    for _ in range(10):
        estimator.calibrate(30_000, 10_000)  # 3 characters per token
    assert 3.0 <= estimator.chars_per_token < 3.001
    # The true count is 10,000; the estimate sits the 5 % margin above it.
    assert 10_490 <= estimator.estimate(30_000) <= 10_500


def test_relaxes_slowly_towards_a_sparser_tokenizer() -> None:
    estimator = TokenEstimator(chars_per_token=3.0)
    estimator.calibrate(50_000, 10_000)  # 5 characters per token
    assert estimator.chars_per_token < 3.2  # still overestimates tokens after one report


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
    assert estimator.chars_per_token == 4.0 and estimator.samples == 0
