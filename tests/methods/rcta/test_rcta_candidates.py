"""RCTA candidate pooling (App. H): tag priorities, first matching tag, recovered noise, ties, the cap, merging,
and the two sources of hints — local summaries and the outline's phases (abstract, Sec. 4.1; summary App. F)."""

from __future__ import annotations

import pytest

from rcarun.data import Step, Trajectory
from rcarun.methods.rcta.candidates import OUTLINE_SUPPORTING_IDS, base_priority, pool_candidates
from rcarun.methods.rcta.schemas import (
    FailureSignal,
    LocalSummary,
    Outline,
    Phase,
    StepProposal,
    fallback_outline,
)


def _trajectory(n_steps: int) -> Trajectory:
    steps = tuple(Step(i, "ActionAgent", "assistant", f"step {i}") for i in range(n_steps))
    return Trajectory("t__001", "test", "task", steps, "0" * 64)


def _summary(segment_id: int, *proposals: tuple[int, tuple[str, ...], str]) -> LocalSummary:
    return LocalSummary(
        segment_id=segment_id,
        step_range=None,
        segment_goal="",
        key_events=(),
        proposals=tuple(StepProposal(step_id, tags, note) for step_id, tags, note in proposals),
        verifier_findings=(),
        uncertainties=(),
    )


@pytest.mark.parametrize(
    ("tags", "base", "priority"),
    [
        (("possible_manifestation",), 0, 0),
        (("possible_root",), 1, 1),
        (("terminal_context",), 2, 2),
        (("other",), 3, 3),
        (("possible_manifestation", "recovered_noise"), 0, 3),
        (("possible_root", "recovered_noise"), 1, 4),
        (("terminal_context", "recovered_noise"), 2, 5),
        (("other", "recovered_noise"), 3, 6),
        (("recovered_noise",), 3, 6),  # no category tag: "other candidates"
        (("made_up_tag",), 3, 3),
    ],
)
def test_priority_per_tag(tags: tuple[str, ...], base: int, priority: int) -> None:
    pool = pool_candidates([_summary(0, (4, tags, ""))], _trajectory(10))
    (candidate,) = pool.candidates
    assert (candidate.base_priority, candidate.priority) == (base, priority)
    assert candidate.recovered_noise is ("recovered_noise" in tags)


@pytest.mark.parametrize(
    ("tags", "expected"),
    [
        (("other", "possible_root"), 1),
        (("terminal_context", "possible_manifestation"), 0),
        (("other", "terminal_context"), 2),
        (("possible_root", "possible_manifestation", "other"), 0),
    ],
)
def test_first_matching_tag_in_priority_order_wins_whatever_the_answer_order(
    tags: tuple[str, ...], expected: int
) -> None:
    assert base_priority(tags) == expected


def test_recovered_noise_adds_three_once_even_when_several_merged_hints_carry_it() -> None:
    summaries = [
        _summary(0, (5, ("possible_root", "recovered_noise"), "")),
        _summary(1, (5, ("recovered_noise",), ""), (6, ("possible_root",), "")),
    ]
    pool = pool_candidates(summaries, _trajectory(10))
    assert [(c.step_id, c.priority) for c in pool.candidates] == [(6, 1), (5, 4)]


def test_noise_on_one_hint_penalises_the_merged_candidate_and_reorders() -> None:
    # Step 2 would come first as a manifestation; a recovered-noise hint from another segment pushes it to 3,
    # behind the terminal context at step 8 (2) and tied with step 1 (other, 3) which wins on the lower id.
    summaries = [
        _summary(0, (2, ("possible_manifestation",), ""), (1, ("other",), "")),
        _summary(1, (2, ("recovered_noise",), ""), (8, ("terminal_context",), "")),
    ]
    pool = pool_candidates(summaries, _trajectory(10))
    assert pool.ids == (8, 1, 2)


def test_ties_are_broken_by_ascending_step_id() -> None:
    summaries = [
        _summary(
            0, (9, ("other",), ""), (2, ("other",), ""), (5, ("other",), ""), (7, ("possible_root",), "")
        )
    ]
    pool = pool_candidates(summaries, _trajectory(10))
    assert pool.ids == (7, 2, 5, 9)


def test_hundred_proposals_keep_the_eighty_with_best_priority_then_lowest_id() -> None:
    # ids 50..99 are manifestations (priority 0), ids 0..49 are "other" (priority 3).
    proposals = [(i, ("possible_manifestation",) if i >= 50 else ("other",), "") for i in range(100)]
    pool = pool_candidates([_summary(0, *proposals)], _trajectory(120))
    assert len(pool.candidates) == 80
    assert pool.ids == (*range(50, 100), *range(30))
    assert tuple(c.step_id for c in pool.overflow) == tuple(range(30, 50))
    assert pool.base_ids == (*range(30), *range(50, 100))
    assert pool.n_proposals == 100


def test_cap_is_a_parameter() -> None:
    proposals = [(i, ("other",), "") for i in range(10)]
    assert pool_candidates([_summary(0, *proposals)], _trajectory(10), cap=3).ids == (0, 1, 2)


def test_ids_not_in_the_trajectory_are_dropped_after_the_cap() -> None:
    summaries = [
        _summary(0, (42, ("possible_manifestation",), ""), (-1, ("possible_manifestation",), "")),
        _summary(1, (3, ("possible_root",), ""), (4, ("other",), "")),
    ]
    pool = pool_candidates(summaries, _trajectory(10), cap=3)
    # -1 and 42 rank first and take two of the three slots, then are dropped (excerpts exist only for real ids).
    assert pool.ids == (3,)
    assert pool.dropped == (-1, 42)
    assert tuple(c.step_id for c in pool.overflow) == (4,)


def test_dedup_merges_distinct_tags_sources_and_notes_in_first_seen_order() -> None:
    summaries = [
        _summary(0, (7, ("possible_root",), "wrong unit"), (3, ("other",), "")),
        _summary(1, (7, ("possible_manifestation", "possible_root"), "copied"), (7, ("other",), "copied")),
        _summary(2, (7, ("possible_root",), "")),
    ]
    pool = pool_candidates(summaries, _trajectory(10))
    assert pool.ids == (7, 3)
    merged = pool.candidates[0]
    assert merged.tags == ("possible_root", "possible_manifestation", "other")
    assert merged.proposed_by == ("local:0", "local:1", "local:2")
    assert merged.source == "summary"
    assert merged.notes == ("wrong unit", "copied")
    assert (merged.base_priority, merged.priority) == (0, 0)
    assert pool.n_proposals == 5


def test_no_summaries_give_an_empty_pool() -> None:
    pool = pool_candidates([], _trajectory(5))
    assert (pool.ids, pool.dropped, pool.overflow, pool.n_proposals) == ((), (), (), 0)


# --- the outline as a second source -------------------------------------------------------------------------


def _phase(
    phase_id: int | None, signals: tuple[tuple[tuple[int, ...], str, str], ...], supporting: tuple[int, ...]
) -> Phase:
    return Phase(
        phase_id=phase_id,
        step_range=None,
        phase_goal=f"goal {phase_id}",
        involved_agents=(),
        sub_phases=(),
        failure_signals=tuple(FailureSignal(text, ids, severity) for ids, text, severity in signals),
        supporting_step_ids=supporting,
    )


def _outline(*phases: Phase) -> Outline:
    return Outline(phases, (), readable=True)


def test_outline_failure_signals_and_first_three_supporting_ids_are_candidates() -> None:
    outline = _outline(
        _phase(1, (((2, 4), "wrong unit", "high"),), (0, 1, 2, 3, 9)),
        _phase(2, (), (8, 6, 7, 5)),
    )
    pool = pool_candidates([], _trajectory(12), outline=outline)
    # failure signals 2, 4; supporting ids: the first three of each phase (0, 1, 2 and 8, 6, 7), never 3, 9, 5
    assert OUTLINE_SUPPORTING_IDS == 3
    assert pool.base_ids == (0, 1, 2, 4, 6, 7, 8)
    assert pool.n_outline_hints == 2 + 3 + 3 and pool.n_proposals == 0
    assert {c.source for c in pool.candidates} == {"outline"}
    # outline hints carry no tag: "other candidates", priority 3, ties by ascending id
    assert {(c.tags, c.base_priority, c.priority) for c in pool.candidates} == {((), 3, 3)}
    assert pool.ids == (0, 1, 2, 4, 6, 7, 8)
    by_id = {c.step_id: c for c in pool.candidates}
    assert by_id[2].proposed_by == ("outline:1",)
    assert by_id[2].notes == (
        "outline phase 1 failure signal (high): wrong unit",
        "supports outline phase 1: goal 1",
    )
    assert by_id[8].notes == ("supports outline phase 2: goal 2",)


def test_a_step_from_both_sources_merges_and_keeps_the_summary_tags() -> None:
    summaries = [_summary(0, (5, ("possible_root",), "bad rate"), (6, ("other",), ""))]
    outline = _outline(_phase(3, (((5, 9), "rate", "medium"),), ()))
    pool = pool_candidates(summaries, _trajectory(10), outline=outline)
    by_id = {c.step_id: c for c in pool.candidates}
    assert (by_id[5].source, by_id[6].source, by_id[9].source) == ("both", "summary", "outline")
    assert by_id[5].proposed_by == ("local:0", "outline:3")
    assert by_id[5].tags == ("possible_root",) and by_id[5].priority == 1
    assert by_id[5].notes == ("bad rate", "outline phase 3 failure signal (medium): rate")
    assert pool.ids == (5, 6, 9)  # root 1, then the two "other candidates" by id
    assert pool.base_ids_from("summary") == (5, 6)
    assert pool.base_ids_from("outline") == (5, 9)
    assert (pool.n_proposals, pool.n_outline_hints) == (2, 2)


def test_outline_hints_share_the_eighty_cap_under_the_documented_priorities() -> None:
    # 79 summary manifestations (priority 0) and an outline with 3 untagged ids: only the lowest outline id fits.
    summaries = [_summary(0, *[(i, ("possible_manifestation",), "") for i in range(79)])]
    outline = _outline(_phase(1, (((95, 90, 85), "late failure", "high"),), ()))
    pool = pool_candidates(summaries, _trajectory(100), outline=outline)
    assert len(pool.candidates) == 80
    assert pool.ids[-1] == 85 and pool.candidates[-1].source == "outline"
    assert tuple(c.step_id for c in pool.overflow) == (90, 95)


def test_an_outline_hint_outside_the_trajectory_is_dropped_after_the_cap() -> None:
    pool = pool_candidates([], _trajectory(5), outline=_outline(_phase(1, (((3, 40), "x", "low"),), ())))
    assert pool.ids == (3,) and pool.dropped == (40,)


def test_a_phase_without_id_is_named_by_its_position() -> None:
    outline = _outline(_phase(None, (), (4,)), _phase(None, (((1,), "", ""),), ()))
    pool = pool_candidates([], _trajectory(5), outline=outline)
    by_id = {c.step_id: c for c in pool.candidates}
    assert by_id[4].proposed_by == ("outline:1",) and by_id[1].proposed_by == ("outline:2",)
    assert by_id[1].notes == ("outline phase 2 failure signal",)  # no severity, no description


def test_the_fallback_outline_adds_no_candidates() -> None:
    summaries = [_summary(0, (2, ("possible_root",), ""))]
    summaries[0] = LocalSummary(0, (0, 4), "goal", (), summaries[0].proposals, (), ())
    pool = pool_candidates(summaries, _trajectory(5), outline=fallback_outline(summaries))
    assert pool.base_ids == (2,) and pool.n_outline_hints == 0
    assert pool.base_ids_from("outline") == ()
