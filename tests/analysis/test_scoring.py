"""LongRCA scoring rules on small cases worked out by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from rcarun.analysis.scoring import (
    LONGRCA_FULL_POPULATIONS,
    AbstentionRule,
    Expected,
    ItemScore,
    LengthPartition,
    Metrics,
    Prediction,
    by_length_group,
    by_source,
    length_groups,
    macro,
    parse_step,
    pooled,
    post_stratified,
    score_items,
    summarize,
)


def _exp(
    qid: str,
    *,
    source: str = "a",
    n_steps: int = 100,
    ref_role: str = "X",
    ref_step: int = 50,
    roles: frozenset[str] | None = None,
) -> Expected:
    return Expected(
        qid=qid, source=source, n_steps=n_steps, ref_role=ref_role, ref_step=ref_step, roles=roles
    )


def _one(
    expected: Expected,
    prediction: Prediction | None,
    *,
    keep_handoff: bool = False,
    abstentions: AbstentionRule = "fields",
) -> ItemScore:
    predictions = {} if prediction is None else {expected.qid: prediction}
    [score] = score_items([expected], predictions, keep_handoff=keep_handoff, abstentions=abstentions)
    return score


# --- the step rule ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        (3, 3),
        (0, 0),
        (-1, -1),
        ("3", 3),
        (" 12 ", 12),
        ("+4", 4),
        ("-1", -1),
        ("abc", None),
        ("3.5", None),
        ("", None),
        ("1e3", None),
        ("٣", None),  # an Arabic-Indic digit: int() would take it, the ASCII rule does not
        (3.5, None),
        (3.0, None),  # JSON 3.0 is a float, never an int
        (None, None),
        (True, None),
        (False, None),
        ([3], None),
    ],
)
def test_parse_step_accepts_only_ints_and_integer_strings(value: object, parsed: int | None) -> None:
    assert parse_step(value) == parsed


@pytest.mark.parametrize("step", ["abc", 3.5, None, True, "3.5", -1, 100, 101])
def test_unparseable_or_out_of_range_step_fails_both_step_metrics_but_not_the_role(step: object) -> None:
    # n_steps = 100, so valid steps are 0..99: -1 and 100 are out of range. True would be 1 if bools counted.
    score = _one(_exp("q", ref_step=1), Prediction(role="X", step=step))
    assert score.predicted
    assert not score.step_valid
    assert not score.step_exact
    assert not score.step_pm5
    assert score.abs_err is None
    assert score.role_correct  # role and step are scored independently
    assert not score.joint_exact
    assert not score.covered


def test_last_step_is_in_range_and_first_step_too() -> None:
    last = _one(_exp("q", n_steps=10, ref_step=9), Prediction(role="X", step=9))
    first = _one(_exp("q", n_steps=10, ref_step=9), Prediction(role="X", step="0"))
    assert (last.step_valid, last.step_exact, last.abs_err) == (True, True, 0)
    assert (first.step_valid, first.step_exact, first.abs_err) == (True, False, 9)


@pytest.mark.parametrize(
    ("step", "err", "within"),
    [(55, 5, True), (45, 5, True), (56, 6, False), (44, 6, False), (50, 0, True), (51, 1, True)],
)
def test_step_within_5_boundary(step: int, err: int, within: bool) -> None:
    score = _one(_exp("q", ref_step=50), Prediction(role="X", step=step))
    assert score.abs_err == err
    assert score.step_pm5 is within
    assert score.step_exact is (err == 0)
    assert score.joint_pm5 is within


def test_string_step_is_parsed_and_scored() -> None:
    score = _one(_exp("q", ref_step=7), Prediction(role="X", step=" 7 "))
    assert score.step_exact and score.step_valid and score.abs_err == 0


# --- roles -----------------------------------------------------------------------------------------------


def test_handoff_reference_matches_its_sender_unless_handoffs_are_kept() -> None:
    expected = _exp("q", ref_role="DiagnostAgent (-> ActionAgent)")
    prediction = Prediction(role="DiagnostAgent", step=50)
    assert _one(expected, prediction).role_correct
    assert not _one(expected, prediction, keep_handoff=True).role_correct
    # the full handoff form matches under both rules
    full = Prediction(role="diagnostagent  (-> ActionAgent)", step=50)
    assert _one(expected, full).role_correct
    assert _one(expected, full, keep_handoff=True).role_correct


def test_unicode_arrow_handoff_suffix_is_stripped_too() -> None:
    assert _one(_exp("q", ref_role="Planner (→ Coder)"), Prediction(role="planner", step=0)).role_correct


def test_other_parentheticals_survive() -> None:
    assert not _one(_exp("q", ref_role="Planner (Review)"), Prediction(role="Planner", step=0)).role_correct
    assert not _one(_exp("q", ref_role="Planner"), Prediction(role="Planner (Review)", step=0)).role_correct


@pytest.mark.parametrize(
    ("predicted", "reference"),
    [
        ("  ｐｌａｎｎｅｒ   Agent ", "Planner Agent"),  # NFKC folds full-width letters; whitespace collapses
        ("STRASSE", "Straße"),  # casefold, not lower(): "ß" folds to "ss"
        ("planner\tagent", "Planner Agent"),
    ],
)
def test_role_normalisation(predicted: str, reference: str) -> None:
    assert _one(_exp("q", ref_role=reference), Prediction(role=predicted, step=0)).role_correct


@pytest.mark.parametrize("role", [None, "", "   ", "(-> X)"])
def test_empty_roles_are_never_correct_or_valid(role: str | None) -> None:
    # "(-> X)" is nothing but a handoff suffix: once it is stripped nothing is left
    score = _one(_exp("q", ref_role="X"), Prediction(role=role, step=50))
    assert score.step_valid
    assert not score.role_correct
    assert not score.role_valid
    assert not score.covered


# --- coverage, missing and abstained -------------------------------------------------------------------


def test_coverage_checks_the_recorded_role_set_when_known() -> None:
    roles = frozenset({"Planner", "DiagnostAgent (-> ActionAgent)"})
    expected = _exp("q", ref_role="Planner", roles=roles)
    unknown_role = _one(expected, Prediction(role="Coder", step=50))
    wrong_but_recorded = _one(expected, Prediction(role="diagnostagent", step=50))  # handoff stripped
    assert (unknown_role.role_valid, unknown_role.covered, unknown_role.step_valid) == (False, False, True)
    assert (wrong_but_recorded.role_valid, wrong_but_recorded.covered) == (True, True)
    assert not wrong_but_recorded.role_correct
    # under the ablation rule the handoff form is a different name: the bare sender is not recorded
    kept = _one(expected, Prediction(role="diagnostagent", step=50), keep_handoff=True)
    assert not kept.role_valid


def test_coverage_without_a_role_set_only_needs_a_nonempty_role() -> None:
    score = _one(_exp("q", ref_role="X"), Prediction(role="Anyone", step=50))
    assert score.role_valid and score.covered and not score.role_correct


def test_abstained_prediction_is_all_errors_under_the_component_rule() -> None:
    # App. L.1, component conditions: role and step would both be right; the abstention makes every target an
    # error, and the step is no valid output (nothing for the MAE).
    score = _one(_exp("q"), Prediction(role="X", step=50, abstained=True), abstentions="error")
    assert score.predicted and score.abstained
    assert not any(
        (
            score.role_correct,
            score.step_valid,
            score.step_exact,
            score.step_pm5,
            score.covered,
            score.joint_pm5,
        )
    )
    assert score.abs_err is None and score.step is None


def test_abstained_prediction_keeps_its_fields_under_the_main_rule() -> None:
    # Sec. 5.1 / App. L.1, main comparisons: the role and step an abstaining output gives are scored, each
    # field on its own (here the step is out of range: an error for both step targets, not for the role);
    # an abstaining output is never covered.
    right = _one(_exp("q"), Prediction(role="X", step=50, abstained=True))
    assert (right.role_correct, right.step_exact, right.joint_exact, right.abs_err) == (True, True, True, 0)
    assert right.abstained and right.step == 50 and not right.covered
    half = _one(_exp("q"), Prediction(role="X", step=500, abstained=True))
    assert (half.role_correct, half.step_valid, half.step_pm5, half.abs_err) == (True, False, False, None)
    missing = _one(_exp("q"), Prediction(role=None, step=None, abstained=True))
    assert not (missing.role_correct or missing.step_valid or missing.covered)
    # and the aggregate follows: one abstention with right fields among two trajectories
    expected = [_exp("q1"), _exp("q2")]
    predictions = {"q1": Prediction("X", 50, abstained=True), "q2": Prediction("X", 50)}
    assert pooled(score_items(expected, predictions)).step_acc == 1.0
    assert pooled(score_items(expected, predictions, abstentions="error")).step_acc == 0.5
    with pytest.raises(ValueError, match="abstentions must be one of"):
        score_items(expected, predictions, abstentions="drop")  # type: ignore[arg-type]


def test_coverage_takes_the_methods_own_verdict_where_it_stores_one() -> None:
    # App. L.1: coverage is the condition's validation checks (RCTA's stored `covered`: recorded role, step
    # validity, chain structure, cited handoff evidence); the scorer's two checks stand in only without one.
    expected = _exp("q", roles=frozenset({"X"}))
    failed_chain = _one(expected, Prediction(role="X", step=50, covered=False))
    assert (failed_chain.covered, failed_chain.covered_by_method, failed_chain.step_exact) == (
        False,
        True,
        True,
    )
    vouched = _one(expected, Prediction(role="X", step=50, covered=True))
    assert vouched.covered and vouched.covered_by_method
    scorer = _one(expected, Prediction(role="X", step=50))
    assert scorer.covered and not scorer.covered_by_method
    # a method's verdict never covers an abstention, under either rule
    for rule in ("fields", "error"):
        abstained = _one(
            expected, Prediction(role="X", step=50, abstained=True, covered=True), abstentions=rule
        )
        assert not abstained.covered and abstained.covered_by_method


def test_missing_prediction_stays_in_every_denominator() -> None:
    expected = [_exp("q1"), _exp("q2")]
    scores = score_items(expected, {"q1": Prediction(role="X", step=50), "other": Prediction("X", 1)})
    assert [score.qid for score in scores] == ["q1", "q2"]
    assert not scores[1].predicted
    metrics = pooled(scores)
    # 1 of 2 right on every target: the missing one counts as wrong, not as absent
    assert metrics.n == 2
    assert (metrics.agent_acc, metrics.step_acc, metrics.step_pm5, metrics.coverage) == (0.5, 0.5, 0.5, 0.5)
    assert metrics.valid_step_n == 1
    assert metrics.root_mae == 0.0


def test_duplicate_expected_qid_is_rejected() -> None:
    with pytest.raises(ValueError, match="q1"):
        score_items([_exp("q1"), _exp("q1")], {})


def test_expected_checks_its_own_label() -> None:
    with pytest.raises(ValueError):
        _exp("q", n_steps=10, ref_step=10)
    with pytest.raises(ValueError):
        _exp("q", n_steps=0, ref_step=0)


# --- aggregates on three sources of unequal size ---------------------------------------------------------
#
# a (4 trajectories, n_steps 100, reference X@50):
#   a1 X@50  role ✓ exact ✓ ±5 ✓ err 0
#   a2 Y@53  role ✗ exact ✗ ±5 ✓ err 3
#   a3 X@70  role ✓ exact ✗ ±5 ✗ err 20
#   a4 missing
#   agent 2/4, step 1/4, ±5 2/4, joint_exact 1/4 (a1), joint_pm5 1/4 (a1; a2 has the wrong role),
#   coverage 3/4, MAE (0+3+20)/3 = 23/3, valid 3
# b (2 trajectories, n_steps 10, reference Y@2):
#   b1 Y@2   all ✓, err 0
#   b2 Y@"x" role ✓, step invalid, not covered
#   agent 1, step 1/2, ±5 1/2, joint 1/2 and 1/2, coverage 1/2, MAE 0, valid 1
# c (1 trajectory, n_steps 30, reference Z@0):
#   c1 W@10  role ✗, err 10 (covered: no role set is known)
#   agent 0, step 0, ±5 0, joints 0, coverage 1, MAE 10, valid 1


def _three_sources() -> list[ItemScore]:
    expected = [
        *(_exp(f"a{i}", source="a") for i in range(1, 5)),
        _exp("b1", source="b", n_steps=10, ref_role="Y", ref_step=2),
        _exp("b2", source="b", n_steps=10, ref_role="Y", ref_step=2),
        _exp("c1", source="c", n_steps=30, ref_role="Z", ref_step=0),
    ]
    predictions = {
        "a1": Prediction("X", 50),
        "a2": Prediction("Y", 53),
        "a3": Prediction("X", 70),
        "b1": Prediction("Y", 2),
        "b2": Prediction("Y", "x"),
        "c1": Prediction("W", 10),
    }
    return score_items(expected, predictions)


def _assert_metrics(actual: Metrics, expected: Metrics) -> None:
    assert actual.n == expected.n
    assert actual.valid_step_n == expected.valid_step_n
    for name in ("agent_acc", "step_acc", "step_pm5", "joint_exact", "joint_pm5", "coverage", "root_mae"):
        want = getattr(expected, name)
        got = getattr(actual, name)
        assert got == (None if want is None else pytest.approx(want)), name


def test_by_source_metrics() -> None:
    per_source = by_source(_three_sources())
    assert list(per_source) == ["a", "b", "c"]
    _assert_metrics(per_source["a"], Metrics(4, 2 / 4, 1 / 4, 2 / 4, 1 / 4, 1 / 4, 23 / 3, 3 / 4, 3))
    _assert_metrics(per_source["b"], Metrics(2, 1.0, 1 / 2, 1 / 2, 1 / 2, 1 / 2, 0.0, 1 / 2, 1))
    _assert_metrics(per_source["c"], Metrics(1, 0.0, 0.0, 0.0, 0.0, 0.0, 10.0, 1.0, 1))


def test_pooled_weights_trajectories_equally_with_the_source_weighted_mae() -> None:
    # n = 7: agent (2+2+0)/7, step (1+1+0)/7, ±5 (2+1+0)/7, joint_exact (1+1+0)/7, joint_pm5 (1+1+0)/7,
    # coverage (3+1+1)/7. MAE (App. L.1): (4·23/3 + 2·0 + 1·10)/7 = (122/3)/7 = 122/21 ≈ 5.810, not the
    # plain mean over the 5 valid steps (0+3+20+0+10)/5 = 6.6.
    _assert_metrics(
        pooled(_three_sources()), Metrics(7, 4 / 7, 2 / 7, 3 / 7, 2 / 7, 2 / 7, 122 / 21, 5 / 7, 5)
    )


def test_macro_is_the_unweighted_mean_of_source_scores() -> None:
    # agent (1/2+1+0)/3 = 1/2, step (1/4+1/2+0)/3 = 1/4, ±5 (1/2+1/2+0)/3 = 1/3, joints (1/4+1/2+0)/3 = 1/4,
    # coverage (3/4+1/2+1)/3 = 3/4, MAE (23/3+0+10)/3 = 53/9; n and valid_step_n are totals.
    _assert_metrics(macro(_three_sources()), Metrics(7, 1 / 2, 1 / 4, 1 / 3, 1 / 4, 1 / 4, 53 / 9, 3 / 4, 5))


def test_post_stratified_uses_population_weights() -> None:
    # weights a 100/1000, b 300/1000, c 600/1000:
    # agent .1·.5 + .3·1 + .6·0 = .35; step .1·.25 + .3·.5 = .175; ±5 .1·.5 + .3·.5 = .2;
    # joints .1·.25 + .3·.5 = .175; coverage .1·.75 + .3·.5 + .6·1 = .825; MAE .1·23/3 + .3·0 + .6·10 = 203/30
    metrics = post_stratified(_three_sources(), {"a": 100, "b": 300, "c": 600})
    _assert_metrics(metrics, Metrics(7, 0.35, 0.175, 0.2, 0.175, 0.175, 203 / 30, 0.825, 5))


def test_pooled_equals_post_stratification_on_its_own_counts() -> None:
    scores = _three_sources()
    _assert_metrics(post_stratified(scores, {"a": 4, "b": 2, "c": 1}), pooled(scores))


def test_macro_equals_pooled_with_equal_source_sizes_except_for_mae() -> None:
    # Sec. 5.1: with equal quotas pooled accuracy equals Macro-5; MAE need not (valid counts differ).
    # a: a1 err 0, a2 err 10 (MAE 5); b: b1 err 4, b2 invalid (MAE 4).
    # pooled MAE = (2·5 + 2·4)/4 = 4.5 = macro MAE (equal N_b), but the plain mean is (0+10+4)/3 = 14/3.
    expected = [
        _exp("a1", source="a"),
        _exp("a2", source="a"),
        _exp("b1", source="b"),
        _exp("b2", source="b"),
    ]
    predictions = {
        "a1": Prediction("X", 50),
        "a2": Prediction("X", 60),
        "b1": Prediction("Q", 54),
        "b2": Prediction("X", None),
    }
    scores = score_items(expected, predictions)
    pooled_metrics, macro_metrics = pooled(scores), macro(scores)
    assert pooled_metrics.agent_acc == macro_metrics.agent_acc == 0.75
    assert pooled_metrics.step_acc == macro_metrics.step_acc == 0.25
    assert pooled_metrics.root_mae == pytest.approx(4.5)
    assert macro_metrics.root_mae == pytest.approx(4.5)


def test_sources_without_valid_steps_leave_the_mae_and_weights_renormalise() -> None:
    # a: errors 2 and 4 (MAE 3, N 2); b: 3 trajectories, no valid step; c: error 9 (N 1).
    # (2·3 + 1·9)/(2+1) = 5. Dividing by all 6 trajectories would give 2.5.
    expected = [
        _exp("a1", source="a"),
        _exp("a2", source="a"),
        *(_exp(f"b{i}", source="b") for i in range(3)),
        _exp("c1", source="c"),
    ]
    predictions = {
        "a1": Prediction("X", 52),
        "a2": Prediction("X", 46),
        "b0": Prediction("X", "abc"),
        "b1": Prediction("X", 100),
        "c1": Prediction("X", 59),
    }
    scores = score_items(expected, predictions)
    assert pooled(scores).root_mae == pytest.approx(5.0)
    assert macro(scores).root_mae == pytest.approx((3 + 9) / 2)
    assert by_source(scores)["b"].root_mae is None
    # post-stratified: weights a 1, b 5, c 2 → (1·3 + 2·9)/(1+2) = 7
    assert post_stratified(scores, {"a": 1, "b": 5, "c": 2}).root_mae == pytest.approx(7.0)


def test_mae_is_none_without_any_valid_step() -> None:
    scores = score_items([_exp("a1"), _exp("b1", source="b")], {"a1": Prediction("X", -1)})
    assert pooled(scores).root_mae is None
    assert macro(scores).root_mae is None
    assert pooled(scores).valid_step_n == 0


def test_post_stratified_rejects_mismatched_populations() -> None:
    scores = _three_sources()
    with pytest.raises(ValueError, match=r"without a population.*'c'"):
        post_stratified(scores, {"a": 1, "b": 1})
    with pytest.raises(ValueError, match=r"without any scores.*'d'"):
        post_stratified(scores, {"a": 1, "b": 1, "c": 1, "d": 1})
    with pytest.raises(ValueError, match="positive"):
        post_stratified(scores, {"a": 1, "b": 0, "c": 1})


def test_empty_scores_cannot_be_aggregated() -> None:
    for aggregate in (pooled, macro):
        with pytest.raises(ValueError):
            aggregate([])


def test_summarize_collects_the_aggregates() -> None:
    scores = _three_sources()
    summary = summarize(scores, {"a": 100, "b": 300, "c": 600})
    assert summary.pooled == pooled(scores)
    assert summary.macro == macro(scores)
    assert summary.per_source == by_source(scores)
    assert summary.post_stratified is not None
    assert summary.post_stratified.agent_acc == pytest.approx(0.35)
    assert summarize(scores).post_stratified is None


def test_full_populations_are_the_papers() -> None:
    assert sum(LONGRCA_FULL_POPULATIONS.values()) == 1140
    assert sorted(LONGRCA_FULL_POPULATIONS.values()) == [42, 108, 128, 177, 685]


# --- length groups -------------------------------------------------------------------------------------


def _sizes(partition: LengthPartition) -> list[int]:
    return [group.size for group in partition.groups]


def test_length_groups_keep_a_concentration_together() -> None:
    # 12 trajectories, k = 3, target size 4. Six share length 10, so group 1 holds at least those six.
    # Group 1 = {10}: the six singletons 20..25 split 3/3 → (6-4)² + 1 + 1 = 6.
    # Group 1 = {10, 20} (7): (7-4)² = 9 alone is already worse. So [10..10] [20..22] [23..25].
    lengths = {f"t{i}": 10 for i in range(6)} | {f"u{i}": 20 + i for i in range(6)}
    partition = length_groups(lengths, k=3)
    assert [(group.low, group.high) for group in partition.groups] == [(10, 10), (20, 22), (23, 25)]
    assert partition.boundaries == (10, 22)  # each group's inclusive upper length
    assert partition.groups[0].qids == tuple(f"t{i}" for i in range(6))
    assert partition.groups[2].qids == ("u3", "u4", "u5")
    assert partition.group_index("u1") == 1


def test_length_groups_follow_the_paper_reading_of_a_boundary() -> None:
    # Shaped like the paper's data: 145 below 63, 145 at exactly 63, then 850 spread above (k = 4, target 285).
    # Cutting after 63 gives a first group of 290 ≈ 285; cutting before 63 gives 145. The paper reports a
    # 290-trajectory first group for k = 4 and the boundary "63", so a boundary closes its group.
    lengths = {f"s{i}": 10 + i % 50 for i in range(145)}
    lengths |= {f"m{i}": 63 for i in range(145)}
    lengths |= {f"l{i}": 64 + i for i in range(850)}
    partition = length_groups(lengths, k=4)
    assert partition.groups[0].size == 290
    assert partition.boundaries[0] == 63
    # 850 singletons in three groups: 283/283/284 or similar; the earliest optimal cuts are taken
    assert _sizes(partition)[1:] == [283, 283, 284]


def test_length_ties_take_the_earliest_boundaries() -> None:
    # lengths 1, 2, 3, k = 2 (target 1.5): {1}|{2,3} and {1,2}|{3} both cost 0.25 + 0.25
    partition = length_groups({"a": 1, "b": 2, "c": 3}, k=2)
    assert partition.boundaries == (1,)
    assert _sizes(partition) == [1, 2]


def test_fewer_distinct_lengths_than_groups() -> None:
    partition = length_groups({"a": 5, "b": 5, "c": 7}, k=5)
    assert [(group.low, group.high, group.qids) for group in partition.groups] == [
        (5, 5, ("a", "b")),
        (7, 7, ("c",)),
    ]
    assert partition.boundaries == (5,)
    assert partition.k == 5


def test_one_group() -> None:
    partition = length_groups({"a": 3, "b": 9}, k=1)
    assert [(group.low, group.high) for group in partition.groups] == [(3, 9)]
    assert partition.boundaries == ()


def test_length_groups_reject_bad_input() -> None:
    with pytest.raises(ValueError):
        length_groups({}, k=2)
    with pytest.raises(ValueError):
        length_groups({"a": 1}, k=0)
    with pytest.raises(ValueError):
        length_groups({"a": 1.5}, k=2)  # type: ignore[dict-item]


def _brute_force(lengths: dict[str, int], k: int) -> tuple[tuple[int, ...], list[int]]:
    """The optimal boundaries (smallest tuple among ties) and group sizes, trying every set of cuts."""
    counts = Counter(lengths.values())
    distinct = sorted(counts)
    total = len(lengths)
    groups = min(k, len(distinct))
    best: tuple[float, tuple[int, ...], list[int]] | None = None
    for cuts in itertools.combinations(range(1, len(distinct)), groups - 1):
        edges = [0, *cuts, len(distinct)]
        sizes = [sum(counts[length] for length in distinct[lo:hi]) for lo, hi in itertools.pairwise(edges)]
        cost = sum((size - total / k) ** 2 for size in sizes)
        boundaries = tuple(distinct[hi - 1] for hi in edges[1:-1])
        candidate = (cost, boundaries, sizes)
        if best is None or (cost < best[0] - 1e-9) or (abs(cost - best[0]) <= 1e-9 and boundaries < best[1]):
            best = candidate
    assert best is not None
    return best[1], best[2]


def test_length_groups_match_brute_force_on_random_inputs() -> None:
    rng = random.Random(20240531)
    for _ in range(300):
        n = rng.randint(1, 18)
        spread = rng.randint(1, 12)
        lengths = {f"q{i}": rng.randint(1, spread) for i in range(n)}
        k = rng.randint(1, 6)
        boundaries, sizes = _brute_force(lengths, k)
        partition = length_groups(lengths, k=k)
        assert partition.boundaries == boundaries, (lengths, k)
        assert _sizes(partition) == sizes, (lengths, k)
        # every trajectory lands in the group whose bounds hold its length
        for group in partition.groups:
            assert all(group.low <= lengths[qid] <= group.high for qid in group.qids)
        assert sum(_sizes(partition)) == n


def test_by_length_group_scores_each_group() -> None:
    # group [10..10]: s1 exact, s2 wrong step (err 3) → step 1/2; group [20..20]: l1 missing → 0;
    # group [30..30]: nobody scored (a subset run on a shared partition) → None
    partition = length_groups({"s1": 10, "s2": 10, "l1": 20, "x1": 30}, k=3)
    expected = [
        _exp("s1", n_steps=10, ref_step=5),
        _exp("s2", n_steps=10, ref_step=5),
        _exp("l1", n_steps=20, ref_step=5),
    ]
    scores = score_items(expected, {"s1": Prediction("X", 5), "s2": Prediction("X", 8)})
    rows = by_length_group(scores, partition)
    assert [(row.group.low, row.group.high) for row in rows] == [(10, 10), (20, 20), (30, 30)]
    first, second, third = (row.metrics for row in rows)
    assert first is not None and second is not None
    assert (first.n, first.step_acc, first.root_mae) == (2, 0.5, 1.5)
    assert (second.n, second.step_acc, second.agent_acc, second.root_mae) == (1, 0.0, 0.0, None)
    assert third is None


def test_by_length_group_rejects_scores_outside_the_partition() -> None:
    partition = length_groups({"a": 10}, k=2)
    scores = score_items([_exp("b", n_steps=10, ref_step=1)], {})
    with pytest.raises(ValueError, match="'b'"):
        by_length_group(scores, partition)
