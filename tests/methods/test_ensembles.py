"""Self-consistency and the judge panel: the vote and its tie rules, numbered draws, per-judge backbones."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from rcarun.data import Step, Trajectory
from rcarun.errors import BadRequest, ConfigError
from rcarun.methods import Attribution, Message, Reply, create_method, home_backbone
from rcarun.methods.ensembles import JudgePanelOptions, SelfConsistencyOptions
from rcarun.methods.voting import majority, vote


def _trajectory(n: int = 6) -> Trajectory:
    agents = ["Planner", "Coder", "Computer_terminal"]
    steps = tuple(
        Step(index=i, agent=agents[i % 3], role="assistant", content=f"step {i} content") for i in range(n)
    )
    return Trajectory(qid="demo/1", source="demo", task="Count the awnings.", steps=steps, sha256="0" * 64)


def _answer(role: str | None, step: int | None, trajectory: Trajectory) -> Attribution:
    return Attribution(
        pred_role=role,
        pred_step=step,
        role_valid=role in trajectory.agents,
        step_valid=isinstance(step, int) and 0 <= step < trajectory.n_steps,
    )


def _json(role: str, step: int) -> str:
    return json.dumps({"reason": "r", "responsible_role": role, "root_step": step})


def test_majority_counts_and_breaks_ties_by_first_voter_or_smallest() -> None:
    assert majority([3, 1, 1, 3, 2]) == (3, True)  # 3 and 1 tie at two votes; 3 was voted first
    assert majority([3, 1, 1, 3, 2], prefer_smallest=True) == (1, True)
    assert majority([2, 5, 5]) == (5, False)
    assert majority([]) == (None, False)


def test_vote_per_field_ignores_invalid_fields_and_keeps_tallies() -> None:
    trajectory = _trajectory()
    answers = [
        _answer("Coder", 4, trajectory),
        _answer("Planner", 2, trajectory),
        _answer("Nobody", 2, trajectory),  # invalid role: its step still votes
        _answer("Coder", 99, trajectory),  # invalid step: its role still votes
        None,  # a failed voter
    ]
    ballot = vote(trajectory, answers)
    assert (ballot.attribution.pred_role, ballot.attribution.pred_step) == ("Coder", 2)
    assert ballot.role_votes == {"Coder": 2, "Planner": 1}
    assert ballot.step_votes == {4: 1, 2: 2}
    assert not ballot.role_tied and not ballot.step_tied
    assert ballot.attribution.role_valid and ballot.attribution.step_valid


def test_vote_tie_rules() -> None:
    trajectory = _trajectory()
    answers = [_answer("Coder", 4, trajectory), _answer("Planner", 1, trajectory)]
    first = vote(trajectory, answers).attribution
    assert (first.pred_role, first.pred_step) == ("Coder", 4)
    earliest = vote(trajectory, answers, tie_break="earliest-step").attribution
    assert (earliest.pred_role, earliest.pred_step) == ("Coder", 1)  # role ties still go to the first voter


def test_vote_with_no_valid_field_has_no_winner() -> None:
    trajectory = _trajectory()
    ballot = vote(trajectory, [_answer("Nobody", 77, trajectory)])
    assert ballot.attribution.pred_role is None and ballot.attribution.pred_step is None
    assert not ballot.attribution.role_valid and not ballot.attribution.abstained


async def test_self_consistency_draws_numbered_samples_at_its_temperature(scripted) -> None:  # type: ignore[no-untyped-def]
    trajectory = _trajectory()
    answers = iter([_json("Coder", 4), _json("Planner", 1), _json("Coder", 1), _json("Coder", 4)])
    llm = scripted(lambda request: next(answers))
    method = create_method("self-consistency", options={"samples": 4, "temperature": 0.9})
    result = await method.attribute(trajectory, llm)
    assert sorted(r["sample"] for r in llm.requests) == [0, 1, 2, 3]
    assert {r["temperature"] for r in llm.requests} == {0.9}
    # Same prompt in every draw: only the sample number tells them apart (so the cache keeps them apart).
    assert len({r["messages"][1].content for r in llm.requests}) == 1
    assert (result.pred_role, result.pred_step) == ("Coder", 4)  # steps 4 and 1 tie 2-2; sample 0 said 4
    assert result.output["vote"]["step_tied"] is True
    assert [s["pred_step"] for s in result.output["samples"]] == [4, 1, 1, 4]


async def test_digit_string_steps_vote_as_integers(scripted) -> None:  # type: ignore[no-untyped-def]
    # A JSON-mode provider may answer "4": every voter reads it as step 4, as the scorer would.
    texts = iter(
        json.dumps({"reason": "r", "responsible_role": "Coder", "root_step": step})
        for step in ("4", 4, " 4", "1")
    )
    result = await create_method("self-consistency").attribute(
        _trajectory(), scripted(lambda request: next(texts))
    )
    assert [s["pred_step"] for s in result.output["samples"]] == [4, 4, 4, 1]
    assert (result.pred_step, result.step_valid, result.error) == (4, True, None)
    assert result.output["vote"]["step_votes"] == {"4": 3, "1": 1}


def test_self_consistency_options_are_checked() -> None:
    with pytest.raises(
        ConfigError, match=r"^self-consistency: samples: .*greater than or equal to 2 \(got 1\)"
    ):
        create_method("self-consistency", options={"samples": 1})
    with pytest.raises(ConfigError, match=r"^self-consistency: temperature: .*greater than 0 \(got 0\)"):
        create_method("self-consistency", options={"temperature": 0})
    # An integer temperature is a number: read as the float it means.
    assert SelfConsistencyOptions.from_mapping({"temperature": 1}).temperature == 1.0
    with pytest.raises(ConfigError, match="base: unknown method 'nope'"):
        create_method("self-consistency", options={"base": "nope"})
    with pytest.raises(ConfigError, match="base: all-at-once: unknown option"):
        create_method("self-consistency", options={"base_options": {"bogus": 1}})
    with pytest.raises(ConfigError, match="single-judge method"):
        create_method("self-consistency", options={"base": "judge-panel"})


@dataclass
class PanelLLM:
    """One scripted answer per backbone; every request kept with the backbone it went to."""

    answers: Mapping[str, str | Exception]
    name: str = "a"
    context_window: int | None = None
    requests: list[tuple[str, str]] = field(default_factory=list)

    @property
    def backbone(self) -> str:
        return self.name

    def for_backbone(self, name: str) -> PanelLLM:
        if name not in self.answers:
            raise ConfigError(f"no backbone {name!r}")
        return PanelLLM(self.answers, name, self.context_window, self.requests)

    def estimate_tokens(self, text: str) -> int:
        return len(text) // 4 + 1

    async def chat(self, messages: Sequence[Message], *, stage: str, **kwargs: Any) -> Reply:
        self.requests.append((self.name, stage))
        answer = self.answers[self.name]
        if isinstance(answer, Exception):
            raise answer
        try:
            parsed, error = json.loads(answer), None
        except json.JSONDecodeError as exc:
            parsed, error = None, str(exc)
        return Reply(text=answer, parsed=parsed, parse_error=error, finish_reason="stop")


async def test_judge_panel_asks_each_judge_on_its_backbone_and_votes_in_judge_order() -> None:
    trajectory = _trajectory()
    llm = PanelLLM({"a": _json("Coder", 4), "b": _json("Planner", 1), "c": _json("Planner", 4)})
    panel = create_method("judge-panel", options={"judges": ["b", "a", "c"]})
    assert home_backbone(panel) == "b"
    result = await panel.attribute(trajectory, llm)
    assert sorted(llm.requests) == [("a", "attribution"), ("b", "attribution"), ("c", "attribution")]
    assert (result.pred_role, result.pred_step) == ("Planner", 4)
    assert [j["judge"] for j in result.output["judges"]] == ["b", "a", "c"]


async def test_judge_panel_votes_without_a_failed_judge_and_fails_when_all_fail() -> None:
    trajectory = _trajectory()
    panel = create_method("judge-panel", options={"judges": ["a", "b", "c"]})
    llm = PanelLLM({"a": BadRequest("context too long"), "b": _json("Planner", 1), "c": _json("Planner", 1)})
    result = await panel.attribute(trajectory, llm)
    assert (result.pred_role, result.pred_step) == ("Planner", 1)
    assert "BadRequest: context too long" in result.output["judges"][0]["error"]
    failing = PanelLLM({name: BadRequest(f"refused by {name}") for name in "abc"})
    with pytest.raises(BadRequest, match="refused by a"):
        await panel.attribute(trajectory, failing)


def test_judge_panel_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="at least two different backbones"):
        create_method("judge-panel", options={"judges": ["a"]})
    with pytest.raises(ConfigError, match="at least two different backbones"):
        create_method("judge-panel", options={"judges": ["a", "a"]})
    with pytest.raises(ConfigError, match=r"^judge-panel: judges: .*valid tuple \(got 'a,b'\)"):
        create_method("judge-panel", options={"judges": "a,b"})
    with pytest.raises(ConfigError, match=r"^judge-panel: judges\.1: .*at least 1 character"):
        create_method("judge-panel", options={"judges": ["a", ""]})
    with pytest.raises(ConfigError, match=r"^judge-panel: tie_break: "):
        create_method("judge-panel", options={"judges": ["a", "b"], "tie_break": "coin"})
    with pytest.raises(ConfigError, match=r"^judge-panel: base: all-at-once: unknown option"):
        create_method("judge-panel", options={"judges": ["a", "b"], "base_options": {"bogus": 1}})
    assert JudgePanelOptions.from_mapping({"judges": ["a", "b"]}).judges == ("a", "b")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("samples", "4"),
        ("samples", True),
        ("samples", 4.0),
        ("temperature", float("inf")),
        ("temperature", "0.7"),
        ("base_options", ["reading"]),
        ("sample", 4),
    ],
)
def test_mistyped_self_consistency_options_are_refused_naming_the_option(option: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"^self-consistency: .*{option}"):
        create_method("self-consistency", options={option: value})


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("judges", "a"),
        ("judges", [1, 2]),
        ("judges", [True, False]),
        ("judges", [1.0, 2.0]),
        ("base", 7),
        ("tie_break", True),
        ("judge", ["a", "b"]),
    ],
)
def test_mistyped_judge_panel_options_are_refused_naming_the_option(option: str, value: object) -> None:
    options = {"judges": ["a", "b"], option: value}
    with pytest.raises(ConfigError, match=rf"^judge-panel: .*{option}"):
        create_method("judge-panel", options=options)


# --- unreadable answers and tie rules: Attribution.error / fallback -------------------------------------------

PROSE = "I don't know the answer to that."


def _by_sample(*answers: str):  # type: ignore[no-untyped-def]
    return lambda request: answers[request["sample"]]


async def test_self_consistency_without_a_readable_draw_is_an_error(scripted) -> None:  # type: ignore[no-untyped-def]
    method = create_method("self-consistency")
    result = await method.attribute(_trajectory(), scripted(_by_sample(*[PROSE] * 4)))
    assert result.pred_role is None and result.pred_step is None
    assert (
        result.error
        == "no sample answer could be read (4 of 4); first: Expecting value: line 1 column 1 (char 0)"
    )
    assert result.fallback is None
    assert [s["answer_error"] for s in result.output["samples"]] == [
        "Expecting value: line 1 column 1 (char 0)"
    ] * 4


async def test_self_consistency_with_some_readable_draws_has_no_error(scripted) -> None:  # type: ignore[no-untyped-def]
    llm = scripted(_by_sample(PROSE, _json("Coder", 4), PROSE, _json("Coder", 4)))
    result = await create_method("self-consistency").attribute(_trajectory(), llm)
    assert (result.pred_role, result.pred_step) == ("Coder", 4)
    assert result.error is None and result.fallback is None


async def test_self_consistency_names_the_tie_rule_that_decided(scripted) -> None:  # type: ignore[no-untyped-def]
    llm = scripted(_by_sample(_json("Coder", 4), _json("Planner", 1), _json("Planner", 1), _json("Coder", 4)))
    result = await create_method("self-consistency").attribute(_trajectory(), llm)
    assert (result.pred_role, result.pred_step) == ("Coder", 4)
    assert result.error is None
    assert result.fallback == (
        "vote: role tie broken by first sample, step tie broken by first sample (tie rule 'first-voter')"
    )
    earliest = create_method("self-consistency", options={"tie_break": "earliest-step"})
    llm = scripted(_by_sample(_json("Coder", 4), _json("Planner", 1), _json("Planner", 1), _json("Coder", 4)))
    result = await earliest.attribute(_trajectory(), llm)
    assert result.pred_step == 1
    assert result.fallback == (
        "vote: role tie broken by first sample, step tie broken by earliest step (tie rule 'earliest-step')"
    )


async def test_self_consistency_passes_on_its_draws_fallbacks(scripted) -> None:  # type: ignore[no-untyped-def]
    method = create_method("self-consistency", options={"base": "binary-search", "samples": 2})
    result = await method.attribute(_trajectory(), scripted(lambda request: PROSE))
    assert result.pred_step is not None  # both draws made the same seeded choice
    assert result.error is not None and result.error.startswith(
        "no sample answer could be read (2 of 2); first: no bisect answer was clear (3 of 3)"
    )
    assert result.fallback == (
        "2 of 2 samples decided in part by a rule, first: binary search: unclear verdict at 3 of 3 halvings, "
        "half chosen at random (published rule)"
    )


async def test_judge_panel_error_needs_every_judge_unreadable() -> None:
    trajectory = _trajectory()
    panel = create_method("judge-panel", options={"judges": ["a", "b", "c"]})
    some = await panel.attribute(
        trajectory, PanelLLM({"a": PROSE, "b": _json("Planner", 1), "c": _json("Planner", 1)})
    )
    assert (some.pred_role, some.pred_step) == ("Planner", 1)
    assert some.error is None and some.fallback is None
    none = await panel.attribute(trajectory, PanelLLM({"a": PROSE, "b": PROSE, "c": BadRequest("refused")}))
    assert (
        none.error
        == "no judge answer could be read (2 of 2); first: Expecting value: line 1 column 1 (char 0)"
    )
