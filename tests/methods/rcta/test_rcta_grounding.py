"""RCTA quote grounding: the 15-character substring rule, the 80% word rule and the normalisation."""

from __future__ import annotations

import pytest

from rcarun.methods.rcta.grounding import (
    GroundingDetail,
    grounding_detail,
    normalize_quote_text,
    quote_is_grounded,
    quote_words,
)

SOURCE = "Please open the config file now and run migrate_db before the tests."


def test_normalisation() -> None:
    assert normalize_quote_text("  Open\tTHE \n\n Config,  File!  ") == "open the config, file!"
    assert normalize_quote_text("Straße") == "straße"  # lower, not casefold
    assert normalize_quote_text(" \n ") == ""


def test_quote_words() -> None:
    assert quote_words("Run the TESTS, then Tests again: migrate_db v2_x abc 9data naïve") == frozenset(
        {"tests", "then", "again", "migrate_db", "v2_x", "data"}
    )


def test_substring_at_exactly_15_characters() -> None:
    assert len("open the config") == 15
    assert grounding_detail("open the config", SOURCE) == GroundingDetail(
        grounded=True,
        rule="substring",
        quote_chars=15,
        substring=True,
        quote_words=2,
        shared_words=2,
        word_share=1.0,
    )
    # 14 characters: a substring but too short, and too few words for the word rule.
    assert grounding_detail("open the confi", SOURCE) == GroundingDetail(
        grounded=False,
        rule=None,
        quote_chars=14,
        substring=True,
        quote_words=2,
        shared_words=1,
        word_share=0.5,
    )
    # The length is the normalised one: padding whitespace does not count.
    assert not quote_is_grounded("   open   the confi   ", SOURCE)
    assert quote_is_grounded("   OPEN \n the   CONFIG  ", SOURCE)


def test_case_and_whitespace_are_normalised_on_both_sides() -> None:
    source = "Step 1:\n    Run   THE\tmigration script\n"
    assert grounding_detail("run the migration", source).rule == "substring"
    assert grounding_detail("RUN the\n\nMIGRATION script", source).rule == "substring"


def test_punctuation_is_kept() -> None:
    source = "Run the tests, then deploy."
    assert quote_is_grounded("run the tests, then deploy", source)
    detail = grounding_detail("run the tests then deploy", source)
    # Not a substring (the comma), and only 3 words of 4+ characters: tests, then, deploy.
    assert (detail.grounded, detail.substring, detail.quote_words, detail.shared_words) == (
        False,
        False,
        3,
        3,
    )


def test_word_rule_at_the_80_percent_boundary() -> None:
    source = "alpha bravo charlie delta echo foxtrot"  # six words of 4+ characters
    four_of_five = "delta, alpha; bravo / charlie and zulu"  # order and punctuation do not matter for words
    detail = grounding_detail(four_of_five, source)
    assert detail == GroundingDetail(
        grounded=True,
        rule="words",
        quote_chars=len(four_of_five),
        substring=False,
        quote_words=5,
        shared_words=4,
        word_share=0.8,
    )
    three_of_four = "alpha bravo charlie zulu"
    assert grounding_detail(three_of_four, source) == GroundingDetail(
        grounded=False,
        rule=None,
        quote_chars=24,
        substring=False,
        quote_words=4,
        shared_words=3,
        word_share=0.75,
    )
    four_of_six = "zulu-free: charlie alpha echo bravo"  # 'zulu' and 'free' are words too
    assert (grounding_detail(four_of_six, source).quote_words, quote_is_grounded(four_of_six, source)) == (
        6,
        False,
    )
    assert quote_is_grounded("charlie alpha echo bravo", source)  # 4 of 4, not contiguous in the source


def test_word_rule_counts_distinct_whole_words() -> None:
    source = "the parser handles tokens and offsets"
    # A repeated word counts once: {parser, handles, tokens, zulu} -> 3 of 4 = 0.75.
    assert grounding_detail("parser parser parser handles tokens zulu", source).word_share == 0.75
    # Whole words only: 'token' and 'offset' do not occur in 'tokens' and 'offsets'.
    detail = grounding_detail("parser handles token offset", source)
    assert (detail.shared_words, detail.quote_words, detail.grounded) == (2, 4, False)


def test_fewer_than_four_long_words_needs_the_substring() -> None:
    source = "use the cache and skip the network"
    quote = "skip cache, use network"  # 3 long words, all present, not a substring
    detail = grounding_detail(quote, source)
    assert (detail.quote_words, detail.shared_words, detail.grounded) == (3, 3, False)


@pytest.mark.parametrize("quote", ["", "   ", "\n"])
def test_empty_quote_is_never_grounded(quote: str) -> None:
    assert grounding_detail(quote, SOURCE) == GroundingDetail(
        grounded=False,
        rule=None,
        quote_chars=0,
        substring=False,
        quote_words=0,
        shared_words=0,
        word_share=None,
    )


def test_substring_is_tried_before_words() -> None:
    quote = "please open the config file"
    detail = grounding_detail(quote, SOURCE)
    assert (detail.rule, detail.quote_words, detail.shared_words, detail.word_share) == (
        "substring",
        4,
        4,
        1.0,
    )
    assert grounding_detail("Please open the config file", "").grounded is False
