"""`rcarun estimate`: call structure per method on a tiny config, shared stages, USD, and the demo comparison.

The comparison runs the estimate on the embedded demo's config and sets it against the demo's results.db
(`demo_db`, run once per session): measured tokens are the `calls` rows the provider saw (status != 'cached';
rate-limited and failed attempts carry no tokens), so retries after length stops count and cache hits do not.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from helpers.sweeps import make_config, rows
from rcarun.cli import main
from rcarun.cli.estimate import Comparison, demo_estimate_config
from rcarun.data import bundled_sample_path, iter_dataset
from rcarun.methods import create_method, registered_methods
from rcarun.methods.step_by_step import StepByStepOptions, estimate_calls_and_prompt_tokens
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import SweepConfig, run_sweep
from rcarun.runner.dryrun import EstimatingLLM, Tally
from rcarun.runner.estimate import EstimateRow, SweepEstimate, estimate_sweep

_URL = "http://127.0.0.1:9/v1"


def _config(
    methods: list[dict[str, Any]],
    *,
    realizations: int = 1,
    prices: dict[str, float] | None = None,
    stages: dict[str, Any] | None = None,
    backbone: dict[str, Any] | None = None,
) -> SweepConfig:
    return SweepConfig.model_validate(
        {
            "sweep": {"dataset": str(bundled_sample_path()), "realizations": realizations},
            "methods": methods,
            "backbones": {
                "b": {
                    "provider": "simulated",
                    "model": "m",
                    "base_url": _URL,
                    **({"prices": prices} if prices else {}),
                    **(backbone or {}),
                }
            },
            "stages": stages or {},
        }
    )


def _row(estimate: SweepEstimate, method: str) -> EstimateRow:
    return next(row for row in estimate.rows if row.method == method)


@pytest.fixture(scope="module")
def step_counts() -> list[int]:
    return [record.trajectory.n_steps for record in iter_dataset(bundled_sample_path())]


def test_all_at_once_makes_one_call_per_item(step_counts: list[int]) -> None:
    estimate = estimate_sweep(_config([{"name": "all-at-once"}], realizations=3), samples=2)
    row = _row(estimate, "all-at-once")
    assert row.trajectories == len(step_counts) == 10
    assert row.calls_expected == row.calls_max == 10 * 3
    assert row.attempts_expected == 30
    assert row.prompt_tokens_expected > 0
    # One realization estimated and multiplied: the totals are multiples of 3.
    assert row.prompt_tokens_expected % 3 == 0


def test_binary_search_stays_within_log2_of_the_steps(step_counts: list[int]) -> None:
    estimate = estimate_sweep(_config([{"name": "binary-search"}]), samples=3)
    row = _row(estimate, "binary-search")
    bound = sum(math.ceil(math.log2(n)) for n in step_counts if n > 1)
    assert 0 < row.calls_expected <= row.calls_max <= bound


def test_step_by_step_reports_the_no_early_stop_bound(step_counts: list[int]) -> None:
    estimate = estimate_sweep(_config([{"name": "step-by-step"}]), samples=3)
    row = _row(estimate, "step-by-step")
    assert row.calls_max == sum(step_counts)
    assert row.calls_expected < row.calls_max  # random verdicts stop the walk early
    assert row.prompt_tokens_worst > row.prompt_tokens_expected


def test_a_method_the_answers_do_not_steer_has_a_one_point_prompt_range() -> None:
    row = _row(estimate_sweep(_config([{"name": "all-at-once"}]), samples=4), "all-at-once")
    assert row.chance_range is not None
    assert row.chance_range.prompt_tokens == (row.prompt_tokens_expected,) * 2
    # The answers' own lengths are drawn, so the output tokens still spread around their mean.
    low, high = row.chance_range.output_tokens
    assert low < row.output_tokens_expected < high


def test_step_by_step_chance_range_brackets_the_expected_figure_and_needs_two_samples() -> None:
    config = _config([{"name": "step-by-step"}], prices={"input_per_mtok": 1.0, "output_per_mtok": 1.0})
    estimate = estimate_sweep(config, samples=8)
    row = _row(estimate, "step-by-step")
    assert row.chance_range is not None
    low, high = row.chance_range.prompt_tokens
    assert low < row.prompt_tokens_expected < high <= row.prompt_tokens_worst
    assert row.chance_range.usd[0] < row.usd_expected < row.chance_range.usd[1]
    assert estimate.method_ranges["step-by-step"] == row.chance_range  # one backbone: the same draws
    single = estimate_sweep(config, samples=1)
    assert _row(single, "step-by-step").chance_range is None
    assert single.method_ranges == {} and single.usd_range is None


def test_the_expected_figure_carries_its_sampling_error_which_shrinks_with_samples() -> None:
    config = _config([{"name": "step-by-step"}, {"name": "all-at-once"}])
    few, many = estimate_sweep(config, samples=4), estimate_sweep(config, samples=64)
    assert _row(few, "all-at-once").prompt_tokens_expected_se == 0.0
    assert _row(estimate_sweep(config, samples=1), "step-by-step").prompt_tokens_expected_se is None
    few_se = _row(few, "step-by-step").prompt_tokens_expected_se
    many_se = _row(many, "step-by-step").prompt_tokens_expected_se
    assert few_se is not None and many_se is not None
    assert 0 < many_se < few_se / 2  # about 1/sqrt(16) of it: the spread per dry run is the same
    # The estimate of 4 samples sits within a few standard errors of the estimate of 64.
    gap = abs(
        _row(few, "step-by-step").prompt_tokens_expected - _row(many, "step-by-step").prompt_tokens_expected
    )
    assert gap < 4 * few_se


def test_realizations_repeat_a_draw_so_the_range_scales_with_them() -> None:
    one = _row(estimate_sweep(_config([{"name": "step-by-step"}]), samples=8), "step-by-step")
    three = _row(
        estimate_sweep(_config([{"name": "step-by-step"}], realizations=3), samples=8), "step-by-step"
    )
    assert one.chance_range is not None and three.chance_range is not None
    for ours, theirs in zip(one.chance_range.prompt_tokens, three.chance_range.prompt_tokens, strict=True):
        assert theirs == pytest.approx(3 * ours, abs=3)


def test_two_backbones_answer_independently_so_their_joint_range_is_narrower_than_the_sum() -> None:
    config = _config([{"name": "step-by-step"}])
    twin = config.backbones["b"]
    config = config.model_copy(update={"backbones": {"b": twin, "c": twin}})
    estimate = estimate_sweep(config, samples=16)
    b, c = _row(estimate, "step-by-step"), estimate.rows[1]
    assert c.backbone == "c"
    # Identical settings, other answers: a backbone seeds its answers by its name, as the simulator by model.
    assert b.prompt_tokens_expected != c.prompt_tokens_expected
    assert b.chance_range is not None and c.chance_range is not None
    joint = estimate.method_ranges["step-by-step"].prompt_tokens
    assert joint[0] > b.chance_range.prompt_tokens[0] + c.chance_range.prompt_tokens[0]
    assert joint[1] < b.chance_range.prompt_tokens[1] + c.chance_range.prompt_tokens[1]


def test_rcta_makes_m_plus_two_calls_plus_validation_retries() -> None:
    estimate = estimate_sweep(_config([{"name": "rcta"}]), samples=2)
    row = _row(estimate, "rcta")
    config = _config([{"name": "rcta"}])
    trajectories = [record.trajectory for record in iter_dataset(config.sweep.dataset)]
    # Stage I (summary, outline) is 2 calls; Stage II has one call per segment (m >= 1) and a few retries.
    assert 3 * len(trajectories) <= row.calls_expected <= row.calls_max
    assert row.shared_calls == 0


def test_shared_rcta_stage_is_counted_once_across_conditions() -> None:
    alone = _row(estimate_sweep(_config([{"name": "rcta/no-a1"}]), samples=2), "rcta/no-a1")
    # The component study: full RCTA at the ablation settings, as every condition (App. H).
    study = [{"name": "rcta", "options": {"preset": "ablation"}}, {"name": "rcta/no-a1"}]
    both = estimate_sweep(_config(study), samples=2)
    rcta, ablation = _row(both, "rcta"), _row(both, "rcta/no-a1")
    # The ablation's Stage I (a summary per segment and the outline: at least 2 per trajectory) is what rcta
    # already sent; everything else it pays for itself.
    assert ablation.shared_calls >= 2 * 10
    assert ablation.calls_expected == alone.calls_expected - ablation.shared_calls
    assert ablation.prompt_tokens_expected < alone.prompt_tokens_expected
    assert rcta.shared_calls == 0


def test_usd_is_tokens_times_the_price() -> None:
    prices = {"input_per_mtok": 2.0, "cached_input_per_mtok": 0.5, "output_per_mtok": 8.0}
    row = _row(estimate_sweep(_config([{"name": "all-at-once"}], prices=prices), samples=1), "all-at-once")
    expected = (row.prompt_tokens_expected * 2.0 + row.output_tokens_expected * 8.0) / 1e6
    worst = (row.prompt_tokens_worst * 2.0 + row.output_tokens_worst * 8.0) / 1e6
    assert row.usd_expected == pytest.approx(expected)
    assert row.usd_worst == pytest.approx(worst)
    assert row.usd_per_trajectory == pytest.approx(expected / 10)


def test_declared_reasoning_follows_the_length_retries() -> None:
    config = _config(
        [{"name": "all-at-once", "options": {"max_tokens": 1024}}],
        stages={"attribution": {"length_retries": 1, "length_cap": 65_536}},
    )
    plain = _row(estimate_sweep(config, samples=1), "all-at-once")
    thinking = _row(estimate_sweep(config, samples=1, reasoning_tokens={"b": 1500}), "all-at-once")
    # 1,500 reasoning tokens overrun 1,024: every call is sent twice (1,024 wasted, then 1,500 + the answer).
    assert thinking.attempts_expected == 2 * plain.attempts_expected == 20
    assert thinking.prompt_tokens_expected == 2 * plain.prompt_tokens_expected
    assert thinking.output_tokens_expected == plain.output_tokens_expected + 10 * (1024 + 1500)
    # Worst case: 1,024 then 2,048 on every call, the prompt twice.
    assert plain.output_tokens_worst == thinking.output_tokens_worst == 10 * (1024 + 2048)


def test_cli_prints_json_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "sweep.toml"
    config.write_text(
        f"""
[sweep]
dataset = "{bundled_sample_path()}"

[[methods]]
name = "all-at-once"

[backbones.b]
provider = "simulated"
model = "m"
base_url = "{_URL}"
prices = {{ input_per_mtok = 1.0, output_per_mtok = 1.0 }}
"""
    )
    assert main(["estimate", "--config", str(config), "--json", "--samples", "1"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [(row["backbone"], row["method"], row["calls_expected"]) for row in payload["rows"]] == [
        ("b", "all-at-once", 10)
    ]
    assert main(["estimate", "--config", str(config), "--reasoning-tokens", "nope"]) == 2


# -- the demo ------------------------------------------------------------------------------------------------


def _estimate_against(db: Path, *flags: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(["estimate", "--against", str(db), *flags])
    return status, out.getvalue()


@pytest.fixture(scope="module")
def demo_against(demo_db: Path) -> dict[str, Any]:
    """``rcarun estimate --against`` the demo's results.db, as JSON (the table is printed, for -s).

    Measured tokens are the attempts the providers saw (cache hits excluded; retries after length stops
    included); a request several methods shared (RCTA's Stage I, the turn Continual Search and Passive
    Continuation open with) is charged to the first of them in config order, as the estimate charges it.
    """
    status, text = _estimate_against(demo_db, "--json")
    assert status == 0
    document: dict[str, Any] = json.loads(text)
    for c in document["against"]["comparisons"]:  # for -s: the per-method lines of the table
        if c["backbone"] is None:
            print(
                f"{c['method']:<22} prompt {c['prompt_error']:+.1%}  output {c['output_error']:+.1%}  in range {c['in_range']}"
            )
    return document


@pytest.fixture(scope="module")
def demo_comparison(demo_against: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per method over the four backbones."""
    return {c["method"]: c for c in demo_against["against"]["comparisons"] if c["backbone"] is None}


def test_estimate_matches_the_demo_prompt_tokens_within_15_percent(
    demo_comparison: dict[str, dict[str, Any]],
) -> None:
    # SOAP runs forward passes on a local model: no tokens billed, nothing estimated.
    assert set(demo_comparison) == set(registered_methods()) - {"soap"}
    for method, comparison in demo_comparison.items():
        assert comparison["items_measured"] == comparison["items_estimated"] == 4 * 10 * 2
        if method == "step-by-step":
            continue  # one draw of where 50 walks stop: see the next test and scripts/estimate_calibration.py
        assert abs(comparison["prompt_error"]) <= 0.15, (method, comparison["prompt_error"])


def test_the_demo_step_by_step_verdicts_follow_the_stop_model(demo_db: Path) -> None:
    """The demo's step checks say "yes" about as often as the dry runs' answers do, so its walks stop where
    the estimate's stop model has them stop.

    The dry runs draw ``decisive_error`` with the simulator's own generator (a fair coin), so the share of
    "yes" over every check the demo made is about 0.5 (0.45 here: three backbones repeat their walks across
    realizations and sim-kimi's sampled answers move it by about 0.015 from run to run). A check that never
    says "yes" (malformed, cut short) or a walk that stops without one would pull it away. The total does not
    follow: the demo's longest walks fell on its most expensive trajectory (hand_crafted/14), and of 30 draws
    of this sweep (scripts/estimate_calibration.py) the demo's prompt total is the largest; tokens given where
    each walk stopped are checked below.
    """
    with sqlite3.connect(demo_db) as connection:
        outputs = [
            json.loads(text)
            for (text,) in connection.execute(
                "SELECT output_json FROM predictions WHERE method = 'step-by-step'"
            )
        ]
    verdicts = [check["verdict"] for output in outputs for check in output["checks"]]
    assert len(outputs) == 4 * 10 * 2
    assert abs(verdicts.count("yes") / len(verdicts) - 0.5) <= 0.15, (verdicts.count("yes"), len(verdicts))


def test_a_comparison_reads_its_error_and_range() -> None:
    def compared(prompt_range: tuple[int, int] | None, measured: int) -> Comparison:
        return Comparison(None, "m", 20, 20, 1_100, measured, 50, 40, 1.0, 0.0, prompt_range)

    assert compared((900, 1_300), 1_000).prompt_error == pytest.approx(0.10)
    assert compared((900, 1_300), 1_000).in_range is True
    assert compared((1_050, 1_300), 1_000).in_range is False
    assert compared((1_100, 1_100), 1_000).in_range is None  # one point: the answers do not move the calls
    assert compared(None, 1_000).in_range is None
    assert compared(None, 1_000).output_error == pytest.approx(0.25)
    assert compared(None, 1_000).usd_error is None  # a run that cost nothing: no ratio (and JSON has no inf)


def test_estimate_against_a_missing_database_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["estimate", "--against", str(tmp_path / "none.db"), "--samples", "1"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"rcarun: {tmp_path / 'none.db'}: no such results database (run the sweep first)"
    )


class _Counter:
    """The estimate's expected token model: the backbone's chars per token (no margin), its context window."""

    def __init__(self, chars_per_token: float, context_window: int | None) -> None:
        self._chars_per_token = chars_per_token
        self.context_window = context_window

    def estimate_tokens(self, text: str) -> int:
        return math.ceil(len(text) / self._chars_per_token)


def test_step_by_step_prompt_tokens_match_the_demo_given_where_each_walk_stopped(demo_db: Path) -> None:
    """The token model on the walks the demo made: each walk's measured length, the estimate's prompt sizes.

    The demo's verdicts are the simulator's coin flips, identical across a backbone's realizations, so its
    step-by-step total is one draw of a quadratic, heavy-tailed quantity; the dry runs' mean is the
    expectation. Conditioning on each walk's length checks the prompts themselves.
    """
    config = demo_estimate_config()
    trajectories = {record.trajectory.qid: record.trajectory for record in iter_dataset(config.sweep.dataset)}
    with sqlite3.connect(demo_db) as connection:
        walks = connection.execute(
            "SELECT backbone, qid, SUM(attempt = 1), SUM(prompt_tokens > 0), SUM(prompt_tokens) FROM calls "
            "WHERE method = 'step-by-step' AND status != 'cached' GROUP BY backbone, qid, realization"
        ).fetchall()
    estimated = measured = 0.0
    for backbone, qid, calls, paid, prompt in walks:
        settings = config.backbones[backbone]
        counter = _Counter(settings.chars_per_token, settings.context_window)
        walk = estimate_calls_and_prompt_tokens(
            trajectories[qid], counter, StepByStepOptions(max_steps=calls)
        )
        assert walk.calls == calls
        estimated += walk.prompt_tokens * paid / calls  # a length retry sends the same prompt again
        measured += prompt
    error = (estimated - measured) / measured
    print(f"step-by-step given each walk's length: prompt error {error:+.1%}")
    assert abs(error) <= 0.15


# -- one plan for the sweep and its dry run ----------------------------------------------------------------


async def test_the_dry_run_plans_the_request_the_sweep_sends(tmp_path: Path) -> None:
    """The sweep's session and the estimate's dry run plan a call alike: for every trajectory the dry run's
    request has the hash, the first budget (here the stage table's) and the cache key (here shareable: no
    method in it) of the request the sweep sent first."""
    db = tmp_path / "results.db"
    stages = {"attribution": {"max_tokens": 1500, "shareable": True}}
    async with MockServer(MockConfig(latency_s=0.0)) as server:
        config = make_config({"sim": {"base_url": server.base_url}}, stages=stages)
        await run_sweep(config, db_path=db, run_name="plan", show_progress=False)
    sent = {
        qid: (sha, key, max_tokens)
        for qid, sha, key, max_tokens in rows(
            db, "SELECT qid, request_sha256, cache_key, max_tokens FROM calls WHERE attempt = 1"
        )
    }
    method = create_method("all-at-once", label="all-at-once", options={})
    planned = {}
    for record in iter_dataset(bundled_sample_path()):
        llm = EstimatingLLM(
            config.backbones["sim"],
            name="sim",
            stages=config.stages,
            method_label=method.label,
            shareable_stages=method.shareable_stages,
            budgeted_stages=frozenset(method.stage_budgets),
            shared=set(),
            tally=Tally(),
        )
        await method.attribute(record.trajectory, llm)
        (plan,) = llm.plans
        request = plan.at(plan.first_budget)
        planned[record.trajectory.qid] = (request.sha256, request.key, request.request.max_tokens)
    assert len(sent) == 10
    assert planned == sent
    assert {max_tokens for _, _, max_tokens in sent.values()} == {1500}
