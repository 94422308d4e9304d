"""RCTA segmentation: each boundary rule at its threshold, rule order, caps, overlap, coverage, the post-pass."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from rcarun.data import Step, Trajectory, load_trajectory_file, natural_sort_key
from rcarun.methods.rcta.enrich import EnrichedStep, enrich
from rcarun.methods.rcta.segment import (
    MAX_CHARS,
    MAX_STEPS,
    Segment,
    SegmentationConfig,
    segment,
    split_oversized,
)

Spec = tuple[str, str] | tuple[str, str, str]  # (agent, content) or (agent, content, chat role)


def _pad(text: str, size: int) -> str:
    """`text` followed by filler up to exactly `size` characters (no rule reads the filler)."""
    assert len(text) <= size
    return text + "." * (size - len(text))


def _steps(specs: Sequence[Spec]) -> tuple[EnrichedStep, ...]:
    steps = tuple(
        Step(i, spec[0], spec[2] if len(spec) == 3 else "assistant", spec[1]) for i, spec in enumerate(specs)
    )
    return enrich(Trajectory("t", "test", "", steps, "0" * 64))


def _sized(agent: str, sizes: Sequence[int]) -> list[Spec]:
    return [(agent, "." * size) for size in sizes]


def _shape(segments: Sequence[Segment]) -> list[tuple[tuple[int, ...], str]]:
    return [(seg.step_ids, seg.cut_reason) for seg in segments]


def _check_partition(segments: Sequence[Segment], n_steps: int, overlap: int = 5) -> None:
    """Every step is an own step exactly once, in order; ids are renumbered; overlap is the previous tail."""
    assert [sid for seg in segments for sid in seg.step_ids] == list(range(n_steps))
    assert [seg.segment_id for seg in segments] == list(range(len(segments)))
    assert segments[0].overlap_ids == ()
    for before, seg in itertools.pairwise(segments):
        assert seg.overlap_ids == before.step_ids[max(0, before.n_steps - overlap) :]
        assert seg.valid_ids.isdisjoint(seg.overlap_ids)
    for seg in segments:
        assert seg.step_ids == tuple(range(seg.step_ids[0], seg.step_ids[-1] + 1))
        assert seg.char_count == sum(step.content_len for step in seg.steps)


# Eight executor steps of 1,250 characters: exactly 8 steps and 10,000 characters.
EIGHT = [1250] * 8


# --- (a) finish_signal ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sizes", "cut"),
    [
        (EIGHT, True),  # 8 steps, 10,000 chars: both minimums just met
        ([1250] * 7 + [1249], False),  # 9,999 chars
        ([1500] * 6 + [1000], False),  # 7 steps, 10,000 chars
    ],
)
def test_finish_signal(sizes: list[int], cut: bool) -> None:
    specs = [*_sized("ActionAgent", sizes[:-1]), ("ActionAgent", _pad("finish(done)", sizes[-1]))]
    specs.append(("ActionAgent", "next"))
    steps = _steps(specs)
    assert steps[len(sizes) - 1].action_type == "finish"
    got = segment(steps)
    n = len(specs)
    if cut:
        assert _shape(got) == [(tuple(range(8)), "finish_signal"), ((8,), "end_of_trace")]
    else:
        assert _shape(got) == [(tuple(range(n)), "end_of_trace")]
    _check_partition(got, n)


def test_finish_signal_needs_the_last_step_to_be_the_finish() -> None:
    specs = [
        ("ActionAgent", _pad("finish(x)", 1250)),
        *_sized("ActionAgent", [1250] * 7),
        ("ActionAgent", ""),
    ]
    assert _shape(segment(_steps(specs))) == [(tuple(range(9)), "end_of_trace")]


# --- (b) verifier_signal_change -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "size", "second", "cut"),
    [
        ("VERDICT: PASS", 10_000, "VERDICT: FAIL", True),  # one step is enough: no step minimum
        ("VERDICT: FAIL", 10_000, "VERDICT: PASS", True),
        ("VERDICT: PASS", 9_999, "VERDICT: FAIL", False),  # 10k chars just not met
        ("VERDICT: PASS", 10_000, "VERDICT: PASS", False),  # no flip
        ("VERDICT: PASS", 10_000, "no verdict yet", False),  # the incoming step has no signal
    ],
)
def test_verifier_signal_change(first: str, size: int, second: str, cut: bool) -> None:
    steps = _steps([("JudgeAgent", _pad(first, size)), ("JudgeAgent", second)])
    expected = (
        [((0,), "verifier_signal_change"), ((1,), "end_of_trace")] if cut else [((0, 1), "end_of_trace")]
    )
    assert _shape(segment(steps)) == expected


def test_verifier_signal_change_compares_with_the_last_signal_in_the_segment() -> None:
    specs: list[Spec] = [
        ("Computer_terminal", "tests passed", "user"),
        ("Computer_terminal", "tests failed", "user"),
        ("ActionAgent", "." * 10_000),  # no signal: the segment's last signal stays FAIL
        ("Computer_terminal", "2 tests failed", "user"),  # FAIL after FAIL: no cut
        ("Computer_terminal", "all tests passed", "user"),  # PASS after FAIL: cut
    ]
    got = segment(_steps(specs))
    assert _shape(got) == [((0, 1, 2, 3), "verifier_signal_change"), ((4,), "end_of_trace")]
    assert got[0].verifier_signals == ("PASS", "FAIL", "FAIL")
    assert got[0].role_classes == ("terminal", "executor")
    assert got[1].verifier_signals == ("PASS",)


# --- (c) agent_shift --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sizes", "incoming", "cut"),
    [
        (EIGHT, ("DiagnostAgent (-> ActionAgent)", "run it"), True),  # planner delegate after executors
        (EIGHT, ("DiagnostAgent", "finish(now)"), True),  # a finish action counts too
        ([1250] * 7 + [1249], ("DiagnostAgent (-> ActionAgent)", "run it"), False),  # 9,999 chars
        ([1500] * 6 + [1000], ("DiagnostAgent (-> ActionAgent)", "run it"), False),  # 7 steps
        (EIGHT, ("ActionAgent (-> JudgeAgent)", "check it"), False),  # a delegate of the same class
        (EIGHT, ("DiagnostAgent", "a plan"), False),  # class change without delegate/finish
    ],
)
def test_agent_shift(sizes: list[int], incoming: tuple[str, str], cut: bool) -> None:
    steps = _steps([*_sized("ActionAgent", sizes), incoming])
    n = len(sizes)
    expected = (
        [(tuple(range(n)), "agent_shift"), ((n,), "end_of_trace")]
        if cut
        else [(tuple(range(n + 1)), "end_of_trace")]
    )
    assert _shape(segment(steps)) == expected


# --- (d) max_length, (e) max_steps, (f) soft_agent_shift_at_target ---------------------------------------


@pytest.mark.parametrize(("second", "cut"), [(16_001, True), (16_000, False)])
def test_max_length(second: int, cut: bool) -> None:
    got = segment(_steps(_sized("ActionAgent", [16_000, second])))
    expected = [((0,), "max_length"), ((1,), "end_of_trace")] if cut else [((0, 1), "end_of_trace")]
    assert _shape(got) == expected
    assert [seg.char_count for seg in got] == ([16_000, 16_001] if cut else [32_000])


@pytest.mark.parametrize(("n", "n_segments"), [(80, 1), (81, 2)])
def test_max_steps(n: int, n_segments: int) -> None:
    got = segment(_steps(_sized("ActionAgent", [1] * n)))
    assert len(got) == n_segments
    assert got[0].n_steps == 80
    if n_segments == 2:
        assert _shape(got) == [(tuple(range(80)), "max_steps"), ((80,), "end_of_trace")]
    _check_partition(got, n)


@pytest.mark.parametrize(
    ("size", "incoming", "cut"),
    [
        (
            24_000,
            "DiagnostAgent",
            True,
        ),  # target reached, class changes (no delegate needed, 1 step is enough)
        (23_999, "DiagnostAgent", False),  # target just not reached
        (24_000, "Action_Expert", False),  # another name of the same class
    ],
)
def test_soft_agent_shift_at_target(size: int, incoming: str, cut: bool) -> None:
    got = segment(_steps([("ActionAgent", "." * size), (incoming, "short")]))
    expected = (
        [((0,), "soft_agent_shift_at_target"), ((1,), "end_of_trace")] if cut else [((0, 1), "end_of_trace")]
    )
    assert _shape(got) == expected


# --- rule order -------------------------------------------------------------------------------------------------


def test_finish_signal_beats_max_length() -> None:
    specs = [
        *_sized("ActionAgent", [1250] * 7),
        ("ActionAgent", _pad("finish()", 1250)),
        ("ActionAgent", "." * 30_000),
    ]
    assert segment(_steps(specs))[0].cut_reason == "finish_signal"


def test_verifier_signal_change_beats_agent_shift_and_max_length() -> None:
    specs: list[Spec] = [
        *_sized("ActionAgent", [1250] * 7),
        ("Computer_terminal", _pad("tests passed", 1250), "user"),
        # verifier class after terminal, a delegate, 8 steps, 10k chars: (b), (c) and (d) all hold.
        ("JudgeAgent (-> ActionAgent)", _pad("VERDICT: FAIL", 30_000)),
    ]
    steps = _steps(specs)
    assert (steps[8].action_type, steps[8].verifier_signal) == ("delegate", "FAIL")
    assert segment(steps)[0].cut_reason == "verifier_signal_change"


def test_agent_shift_beats_max_length() -> None:
    specs = [*_sized("ActionAgent", EIGHT), ("DiagnostAgent (-> ActionAgent)", "." * 30_000)]
    assert segment(_steps(specs))[0].cut_reason == "agent_shift"


def test_max_length_beats_max_steps() -> None:
    got = segment(_steps(_sized("ActionAgent", [100] * 80 + [24_001])))
    assert _shape(got) == [(tuple(range(80)), "max_length"), ((80,), "end_of_trace")]


def test_max_steps_beats_soft_agent_shift() -> None:
    got = segment(_steps([*_sized("ActionAgent", [300] * 80), ("DiagnostAgent", "x")]))
    assert got[0].char_count == 24_000
    assert _shape(got) == [(tuple(range(80)), "max_steps"), ((80,), "end_of_trace")]


# --- caps, oversized steps, overlap --------------------------------------------------------------------------


def test_hard_cap_excludes_overlap() -> None:
    got = segment(_steps(_sized("ActionAgent", [20_000, 12_000, 20_000, 12_000])))
    assert _shape(got) == [((0, 1), "max_length"), ((2, 3), "end_of_trace")]
    assert (got[1].overlap_ids, got[1].char_count) == ((0, 1), MAX_CHARS)  # 76,000 with the overlap


def test_a_single_oversized_step_is_its_own_segment() -> None:
    got = segment(_steps(_sized("ActionAgent", [100, 40_000, 100])))
    assert _shape(got) == [((0,), "max_length"), ((1,), "max_length"), ((2,), "end_of_trace")]
    assert [seg.char_count for seg in got] == [100, 40_000, 100]
    # The overlap comes from the previous segment only: one step after a lone oversized step.
    assert [seg.overlap_ids for seg in got] == [(), (0,), (1,)]
    assert _shape(segment(_steps(_sized("ActionAgent", [40_000, 1])))) == [
        ((0,), "max_length"),
        ((1,), "end_of_trace"),
    ]


def test_overlap_is_exactly_five_and_not_valid() -> None:
    got = segment(_steps(_sized("ActionAgent", [1] * 170)))
    assert [seg.step_ids for seg in got] == [tuple(range(80)), tuple(range(80, 160)), tuple(range(160, 170))]
    assert [seg.overlap_ids for seg in got] == [(), (75, 76, 77, 78, 79), (155, 156, 157, 158, 159)]
    assert got[1].valid_ids == frozenset(range(80, 160))
    assert 79 not in got[1].valid_ids and 80 in got[1].valid_ids
    assert [step.step_id for step in got[2].overlap_steps] == [155, 156, 157, 158, 159]
    assert [seg.char_count for seg in got] == [80, 80, 10]  # overlap never counts
    _check_partition(got, 170)


def test_overlap_is_shorter_when_the_previous_segment_is() -> None:
    config = SegmentationConfig(max_steps=3)
    got = segment(_steps(_sized("ActionAgent", [1] * 7)), config=config)
    assert [seg.step_ids for seg in got] == [(0, 1, 2), (3, 4, 5), (6,)]
    assert [seg.overlap_ids for seg in got] == [(), (0, 1, 2), (3, 4, 5)]


def test_config_changes_the_limits() -> None:
    config = SegmentationConfig(max_chars=100, max_steps=4, overlap_steps=2)
    got = segment(_steps(_sized("ActionAgent", [10] * 6 + [95, 10])), config=config)
    assert _shape(got) == [
        ((0, 1, 2, 3), "max_steps"),
        ((4, 5), "max_length"),
        ((6,), "max_length"),
        ((7,), "end_of_trace"),
    ]
    assert [seg.overlap_ids for seg in got] == [(), (2, 3), (4, 5), (6,)]
    no_overlap = segment(
        _steps(_sized("ActionAgent", [1] * 9)), config=SegmentationConfig(max_steps=4, overlap_steps=0)
    )
    assert [seg.overlap_ids for seg in no_overlap] == [(), (), ()]
    with pytest.raises(ValueError, match="max_chars"):
        SegmentationConfig(max_chars=0)
    with pytest.raises(ValueError, match="overlap_steps"):
        SegmentationConfig(overlap_steps=-1)


def test_coverage_and_numbering_on_a_mixed_trajectory() -> None:
    specs: list[Spec] = [("human", "Fix the bug.", "user")]
    for round_ in range(30):
        specs += [
            ("DiagnostAgent (-> ActionAgent)", "." * (900 + round_)),
            ("ActionAgent", "```bash\npytest\n```" + "." * 2000),
            ("Computer_terminal", ("tests failed" if round_ % 3 else "tests passed") + "." * 3000, "user"),
            ("DiagnostAgent (-> JudgeAgent)", "check"),
            ("JudgeAgent", "VERDICT: FAIL" if round_ % 2 else "VERDICT: PASS"),
        ]
    specs.append(("ActionAgent", "finish(done)"))
    got = segment(_steps(specs))
    _check_partition(got, len(specs))
    assert len(got) >= 5
    assert all(seg.n_steps <= MAX_STEPS and seg.char_count <= MAX_CHARS for seg in got)
    assert got[-1].cut_reason == "end_of_trace"


def test_empty_and_unordered_input() -> None:
    assert segment(()) == ()
    steps = _steps(_sized("ActionAgent", [1, 1]))
    with pytest.raises(ValueError, match="strictly increasing"):
        segment((steps[1], steps[0]))


# --- the post-pass ----------------------------------------------------------------------------------------------


def test_split_oversized_halves_multi_step_segments_once_and_renumbers() -> None:
    steps = _steps(_sized("ActionAgent", [10, 10, 10, 20_000, 20_000, 20_000, 20_000, 20_000, 40_000]))
    first = Segment.from_steps(4, steps[:3], (), "max_length")
    too_big = Segment.from_steps(9, steps[3:8], steps[:3], "max_length")  # 100,000 chars in 5 steps
    alone = Segment.from_steps(11, steps[8:], steps[3:8], "end_of_trace")
    got = split_oversized([first, too_big, alone])
    assert _shape(got) == [
        ((0, 1, 2), "max_length"),
        ((3, 4), "split_in_half_left"),
        ((5, 6, 7), "split_in_half_right"),
        ((8,), "end_of_trace"),
    ]
    assert [seg.segment_id for seg in got] == [0, 1, 2, 3]
    assert [seg.overlap_ids for seg in got] == [(), (0, 1, 2), (3, 4), (3, 4, 5, 6, 7)]
    assert [seg.char_count for seg in got] == [30, 40_000, 60_000, 40_000]  # split once, not recursively


def test_split_oversized_right_overlap_is_the_left_tail() -> None:
    steps = _steps(_sized("ActionAgent", [6_000] * 12))
    got = split_oversized([Segment.from_steps(0, steps, (), "end_of_trace")])
    assert [seg.step_ids for seg in got] == [tuple(range(6)), tuple(range(6, 12))]
    assert got[1].overlap_ids == (1, 2, 3, 4, 5)


def test_split_oversized_never_changes_segment_output() -> None:
    # Rule (d) runs before every append, so no multi-step segment can exceed the cap.
    got = segment(_steps(_sized("ActionAgent", [31_999, 1, 1, 32_000, 5, 40_000])))
    assert split_oversized(got) == got
    assert [(seg.n_steps, seg.char_count) for seg in got] == [
        (2, 32_000),
        (1, 1),
        (1, 32_000),
        (1, 5),
        (1, 40_000),
    ]
    assert split_oversized([replace(seg, segment_id=7) for seg in got]) == got


# --- Who&When hand_crafted ------------------------------------------------------------------------------------


def test_who_and_when_hand_crafted(who_and_when: Path) -> None:
    files = sorted((who_and_when / "hand_crafted").glob("*.json"), key=lambda p: natural_sort_key(p.name))
    counts: list[int] = []
    oversized: list[tuple[str, int, int]] = []
    for file in files:
        trajectory = load_trajectory_file(file, "hand_crafted").trajectory
        enriched = enrich(trajectory)
        got = segment(enriched)
        _check_partition(got, trajectory.n_steps)
        for seg in got:
            assert seg.n_steps <= MAX_STEPS
            assert len(seg.overlap_ids) <= 5
            if seg.char_count > MAX_CHARS:
                assert seg.n_steps == 1
                oversized.append((file.stem, seg.step_ids[0], seg.char_count))
        for rich, step in zip((s for seg in got for s in seg.steps), trajectory.steps, strict=True):
            assert rich.delegate_target == (step.handoff.recipient if step.handoff is not None else None)
        counts.append(len(got))
    assert len(counts) == 20
    assert (min(counts), max(counts), sum(counts)) == (1, 7, 60)
    assert [len(oversized), oversized[0][0], oversized[0][2]] == [1, "20", 69_487]
