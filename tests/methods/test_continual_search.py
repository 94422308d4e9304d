"""Continual Search and Passive Continuation: the decision tree's prompts, the change rule, the turn records."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rcarun.data import Step, Trajectory
from rcarun.errors import ConfigError
from rcarun.methods import Reply, ToolCall, create_method
from rcarun.methods.continual_search import (
    SENTENCES,
    continuation_prompt,
    passive_prompt,
    quote_found,
)

_CONTENTS = [
    "Plan: search the city records for the awning count.",
    "I will call the API with the parameter year=2019 instead of 2021 as the task asked.",
    "exit code 0: 12 awnings found for 2019",
    "The count is 12, based on the records.",
    "Verified: 12 awnings.",
    "FINAL ANSWER: 12",
]


def _trajectory() -> Trajectory:
    agents = ["Planner", "Coder", "Computer_terminal"]
    steps = tuple(
        Step(index=i, agent=agents[i % 3], role="assistant", content=text) for i, text in enumerate(_CONTENTS)
    )
    return Trajectory(qid="demo/1", source="demo", task="Count the awnings.", steps=steps, sha256="0" * 64)


def _answer(role: str, step: int, quote: str | None = None) -> str:
    body: dict[str, Any] = {"reason": "r", "responsible_role": role, "root_step": step}
    if quote is not None:
        body["quote"] = quote
    return json.dumps(body)


@pytest.mark.parametrize(
    ("turn", "layout", "kind", "expected"),
    [
        (2, "whole", "single", ("opening.2", "trust.2", "search.single", "format.single")),
        (3, "whole", "single", ("opening.3", "trust.3", "search.single", "change.single", "format.single")),
        (4, "whole", "single", ("opening.4", "trust.4", "search.single", "change.single", "format.single")),
        (2, "whole", "list", ("opening.2", "trust.2", "search.list", "format.list")),
        (3, "whole", "list", ("opening.3", "trust.3", "search.list", "format.list")),
        (4, "whole", "list", ("opening.4", "trust.4", "search.list", "format.list")),
        (2, "pieces", "single", ("opening.2", "trust.2", "search.pieces.first", "format.single")),
        (
            3,
            "pieces",
            "single",
            ("opening.3", "trust.3", "search.pieces.later", "change.single", "format.single"),
        ),
        (4, "pieces", "list", ("opening.4", "trust.4", "search.pieces.later", "format.list")),
    ],
)
def test_decision_tree_assembles_each_branch_and_turn(
    turn: int, layout: Any, kind: Any, expected: Any
) -> None:
    prompt = continuation_prompt(
        turn, turns=4, layout=layout, answer_kind=kind, schema_text="{S}", unread_block="- steps 20-39"
    )
    assert prompt.keys == expected
    # Sentences come verbatim from the fixed set, in the order of the five parts.
    for key, sentence in prompt.parts:
        if key not in ("search.pieces.first", "search.pieces.later") and not key.startswith("format."):
            assert sentence == SENTENCES[key]
    assert prompt.text.endswith("```json\n{S}\n```")
    if expected[2] == "search.pieces.later":
        assert "- steps 20-39" in prompt.text


def test_pinned_prompt_of_the_who_and_when_branch_at_turn_three() -> None:
    prompt = continuation_prompt(3, turns=4, layout="whole", answer_kind="single", schema_text="{S}")
    assert prompt.text == (
        "Search again. The evidence you have not examined yet is the evidence most likely to change the answer.\n\n"
        "Your answer has survived one challenge. That shows it is consistent with what you read, not that "
        "nothing you have not read contradicts it.\n\n"
        "List the candidate causes you can find, including ones you dismissed. Test each candidate against the "
        "record: keep the earliest one that was never fixed afterwards and that still leads to the failure; "
        "discard a candidate that a later step corrected or that the failure does not depend on.\n\n"
        "You may change your answer only to an earlier cause, and only with an exact quote from the record that "
        'shows it. Copy the quote verbatim into "quote": a quote that does not appear in the record rejects the '
        'change and your previous answer stands. If you keep your answer, give "quote" as an empty string.\n\n'
        "Answer with one JSON object that matches this schema, and nothing else:\n```json\n{S}\n```"
    )


def test_turn_forms_follow_the_number_of_turns() -> None:
    assert continuation_prompt(3, turns=3, layout="whole", answer_kind="single", schema_text="").keys[0] == (
        "opening.4"  # the last turn gets the last-turn line
    )
    six = [
        continuation_prompt(t, turns=6, layout="whole", answer_kind="single", schema_text="")
        for t in (2, 5, 6)
    ]
    assert [p.keys[0] for p in six] == ["opening.2", "opening.3", "opening.4"]
    with pytest.raises(ValueError, match="from 2 to 4"):
        continuation_prompt(5, turns=4, layout="whole", answer_kind="single", schema_text="")


def test_passive_prompt_is_one_fixed_sentence_and_the_format() -> None:
    assert passive_prompt(schema_text="{S}").text == (
        "Reconsider your answer and verify it again.\n\n"
        "Answer with one JSON object that matches this schema, and nothing else:\n```json\n{S}\n```"
    )


def test_quote_found_needs_fifteen_characters_in_the_text() -> None:
    text = _CONTENTS[1]
    assert quote_found("parameter  YEAR=2019 instead", text)  # whitespace and case normalised
    assert not quote_found("year=2019", text)  # too short to be evidence
    assert not quote_found("the parameter year=2021 instead", text)
    assert not quote_found(None, text)


async def test_change_rule_accepts_an_earlier_cause_with_a_quote_from_that_step(scripted) -> None:  # type: ignore[no-untyped-def]
    trajectory = _trajectory()
    llm = scripted(
        [
            _answer("Planner", 3),  # turn 1 (all-at-once)
            _answer("Planner", 3, ""),  # turn 2: keeps it
            _answer("Coder", 1, "with the parameter year=2019 instead of 2021"),  # turn 3: earlier, quoted
            _answer("Coder", 1, ""),  # turn 4: keeps it
        ]
    )
    method = create_method("continual-search")
    result = await method.attribute(trajectory, llm)
    assert (result.pred_role, result.pred_step) == ("Coder", 1)
    turns = result.output["turns"]
    assert [(t["pred_step"], t["changed_from_prev"]) for t in turns] == [
        (3, False),
        (3, False),
        (1, True),
        (1, False),
    ]
    assert "move_rejected" not in turns[2]
    # One conversation: every turn resends the whole history and adds one prompt.
    assert [len(r["messages"]) for r in llm.requests] == [2, 4, 6, 8]
    assert [r["stage"] for r in llm.requests] == ["attribution"] + ["continuation"] * 3
    assert llm.requests[2]["messages"][-1].content.startswith(SENTENCES["opening.3"])
    assert llm.requests[2]["schema"]["required"] == ["reason", "responsible_role", "root_step", "quote"]


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (_answer("Coder", 1, "a sentence that is nowhere in the log"), "the quote is not found in step 1"),
        (
            _answer("Coder", 1, "12 awnings found for 2019"),
            "the quote is not found in step 1",
        ),  # step 2's text
        (
            _answer("Computer_terminal", 5, "FINAL ANSWER: 12 and more"),
            "not earlier than the standing step 3",
        ),
        ("not json at all", "invalid answer"),
    ],
)
async def test_change_rule_rejects_a_move_without_a_valid_quote(scripted, answer: str, reason: str) -> None:  # type: ignore[no-untyped-def]
    trajectory = _trajectory()
    llm = scripted([_answer("Planner", 3), _answer("Planner", 3, ""), answer])
    method = create_method("continual-search", options={"turns": 3})
    result = await method.attribute(trajectory, llm)
    assert (result.pred_role, result.pred_step) == ("Planner", 3)  # the standing answer stays
    last = result.output["turns"][-1]
    assert reason in last["move_rejected"] and last["changed_from_prev"] is False


async def test_turn_two_has_no_change_rule_and_stores_the_answer_as_given(scripted) -> None:  # type: ignore[no-untyped-def]
    trajectory = _trajectory()
    llm = scripted([_answer("Planner", 3), _answer("Computer_terminal", 5, "")])
    result = await create_method("continual-search", options={"turns": 2}).attribute(trajectory, llm)
    assert (result.pred_role, result.pred_step) == ("Computer_terminal", 5)
    assert result.output["turns"][1]["changed_from_prev"] is True


async def test_quote_scope_log_accepts_a_quote_from_anywhere(scripted) -> None:  # type: ignore[no-untyped-def]
    trajectory = _trajectory()
    llm = scripted(
        [_answer("Planner", 3), _answer("Planner", 3, ""), _answer("Coder", 1, "12 awnings found for 2019")]
    )
    options = {"turns": 3, "quote_scope": "log"}
    result = await create_method("continual-search", options=options).attribute(trajectory, llm)
    assert result.pred_step == 1


async def test_list_answers_predict_the_earliest_listed_failure(scripted) -> None:  # type: ignore[no-untyped-def]
    trajectory = _trajectory()
    listed = json.dumps(
        {
            "reason": "r",
            "failures": [
                {"responsible_role": "Planner", "root_step": 3, "quote": ""},
                {"responsible_role": "Coder", "root_step": 1, "quote": ""},
                {"responsible_role": "Coder", "root_step": 40, "quote": ""},  # out of range: ignored
            ],
        }
    )
    llm = scripted([_answer("Planner", 3), listed])
    method = create_method("continual-search", options={"turns": 2, "answer_kind": "list"})
    result = await method.attribute(trajectory, llm)
    assert (result.pred_role, result.pred_step) == ("Coder", 1)
    assert llm.requests[1]["messages"][-1].content.split("\n\n")[2] == SENTENCES["search.list"]


async def test_passive_continuation_sends_the_same_sentence_every_turn(scripted) -> None:  # type: ignore[no-untyped-def]
    trajectory = _trajectory()
    llm = scripted([_answer("Planner", 3), _answer("Coder", 4), _answer("Coder", 1)])
    result = await create_method("passive-continuation", options={"turns": 3}).attribute(trajectory, llm)
    prompts = {r["messages"][-1].content for r in llm.requests[1:]}
    assert len(prompts) == 1 and next(iter(prompts)).startswith("Reconsider your answer and verify it again.")
    # No change rule for the control: a later answer stands as given.
    assert (result.pred_role, result.pred_step) == ("Coder", 1)
    assert [t["changed_from_prev"] for t in result.output["turns"]] == [False, True, True]


async def test_inline_evidence_is_read_at_turn_one_only(scripted) -> None:  # type: ignore[no-untyped-def]
    trajectory = _trajectory()
    llm = scripted([_answer("Planner", 3), _answer("Planner", 3, ""), _answer("Planner", 3, "")])
    result = await create_method("continual-search", options={"turns": 3}).attribute(trajectory, llm)
    evidence = [t["evidence_tokens"] for t in result.output["turns"]]
    assert evidence[0] > sum(len(text.split()) for text in _CONTENTS) and evidence[1:] == [0, 0]


def test_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="turns must be an integer from 1 to 16"):
        create_method("continual-search", options={"turns": 0})
    with pytest.raises(ConfigError, match="one-shot method"):
        create_method("continual-search", options={"base": "self-consistency"})
    with pytest.raises(ConfigError, match="passive has one sentence"):
        create_method("passive-continuation", options={"answer_kind": "list"})
    with pytest.raises(ConfigError, match="unknown option"):
        create_method("continual-search", options={"turn": 3})


def _tool_reply(name: str, arguments: str, call_id: str) -> Reply:
    return Reply(
        text="",
        parsed=None,
        parse_error=None,
        finish_reason="tool_calls",
        tool_calls=(ToolCall(call_id, name, arguments),),
    )


def _final_reply(text: str) -> Reply:
    return Reply(text=text, parsed=json.loads(text), parse_error=None, finish_reason="stop")


async def test_agentic_reading_lists_unopened_pieces_and_counts_new_evidence(scripted) -> None:  # type: ignore[no-untyped-def]
    trajectory = _trajectory()
    llm = scripted(
        [
            _tool_reply("read_steps", '{"start": 0, "end": 1}', "c1"),  # turn 1 (agentic all-at-once)
            _final_reply(_answer("Planner", 3)),
            _tool_reply("read_steps", '{"start": 4, "end": 5}', "c2"),  # turn 2
            _tool_reply("read_steps", '{"start": 0, "end": 1}', "c3"),  # re-read: no new evidence
            _final_reply(_answer("Planner", 3, "")),
            _final_reply(_answer("Planner", 3, "")),  # turn 3: no tools
        ]
    )
    options = {"turns": 3, "reading": "agentic", "piece_steps": 2}
    result = await create_method("continual-search", options=options).attribute(trajectory, llm)
    turns = result.output["turns"]
    assert result.output["layout"] == "pieces"
    # Every call offered the reading tools; the conversation carries the tool exchanges forward.
    assert all(r["tools"] for r in llm.requests)
    turn2_prompt = llm.requests[2]["messages"][-1].content
    assert turn2_prompt.split("\n\n")[2].startswith("Derive the answer again from the start")
    turn3_prompt = llm.requests[5]["messages"][-1].content
    assert "Unopened so far:\n- steps 2-3\n" in turn3_prompt  # 0-1 read at turn 1, 4-5 at turn 2
    assert [t["steps_read"] for t in turns] == [2, 4, 4]
    assert turns[0]["evidence_tokens"] == sum(len(text.split()) for text in _CONTENTS[:2])
    assert turns[1]["evidence_tokens"] == sum(len(text.split()) for text in _CONTENTS[4:])
    assert turns[1]["tool_calls"] == 2 and turns[2]["evidence_tokens"] == 0
    assert turns[2]["evidence_total"] == turns[0]["evidence_tokens"] + turns[1]["evidence_tokens"]


async def test_agentic_turn_stops_at_the_tool_cap_and_keeps_the_standing_answer(scripted) -> None:  # type: ignore[no-untyped-def]
    trajectory = _trajectory()
    runaway = [_tool_reply("read_steps", '{"start": 0, "end": 0}', f"c{i}") for i in range(4)]
    llm = scripted([_final_reply(_answer("Planner", 3)), *runaway])
    options = {"turns": 3, "reading": "agentic", "max_tool_calls": 1}
    llm.replies = [_final_reply(_answer("Planner", 3)), *runaway]
    result = await create_method("continual-search", options=options).attribute(trajectory, llm)
    turns = result.output["turns"]
    assert turns[1]["capped"] is True and "still called tools" in turns[1]["invalid_answer"]
    assert turns[2]["capped"] is True
    # Turn 2 has no change rule: its invalid answer stands; turn 3's rule rejects the "move" and it stays invalid.
    assert (turns[1]["pred_step"], turns[2]["pred_step"]) == (None, None)
    assert (
        result.error
        == "tool-call cap reached: the model still called tools after its 1 tool calls were spent"
    )


# --- unreadable answers and the change rule: Attribution.error / fallback -------------------------------------

PROSE = "I don't know the answer to that."
NOT_JSON = "Expecting value: line 1 column 1 (char 0)"


async def test_accepted_answers_have_no_error_and_no_fallback(scripted) -> None:  # type: ignore[no-untyped-def]
    llm = scripted(
        [
            _answer("Planner", 3),
            _answer("Planner", 3, ""),
            _answer("Coder", 1, "with the parameter year=2019 instead of 2021"),
        ]
    )
    result = await create_method("continual-search", options={"turns": 3}).attribute(_trajectory(), llm)
    assert result.pred_step == 1
    assert result.error is None and result.fallback is None


async def test_a_rejected_move_keeps_the_standing_answer_by_rule(scripted) -> None:  # type: ignore[no-untyped-def]
    llm = scripted(
        [
            _answer("Planner", 3),
            _answer("Planner", 3, ""),
            PROSE,
            _answer("Coder", 1, "nowhere at all, really"),
        ]
    )
    result = await create_method("continual-search").attribute(_trajectory(), llm)
    assert (result.pred_role, result.pred_step) == ("Planner", 3)
    assert result.error is None  # the standing answer (turn 2's) was read
    assert result.fallback == (
        "continual search: change rule rejected the model's new answer at the 2 turn(s) after turn 2, whose "
        "answer stands (paper's rule)"
    )


@pytest.mark.parametrize(
    ("turn1", "turn2", "error"),
    [
        (PROSE, _answer("Coder", 1, ""), None),  # a readable later answer replaces an unreadable turn 1
        (_answer("Planner", 3), PROSE, NOT_JSON),  # turn 2 has no change rule: its unreadable answer stands
        (
            _answer("Planner", 3),
            json.dumps({"reason": "r", "responsible_role": "Coder", "root_step": "1"}),
            'root_step is not an integer: "1"',
        ),
    ],
)
async def test_the_error_is_that_of_the_answer_that_stands(
    scripted, turn1: str, turn2: str, error: str | None
) -> None:  # type: ignore[no-untyped-def]
    for name in ("continual-search", "passive-continuation"):
        llm = scripted([turn1, turn2])
        result = await create_method(name, options={"turns": 2}).attribute(_trajectory(), llm)
        assert result.error == error, name
        assert result.fallback is None


async def test_a_standing_turn_one_keeps_the_base_methods_error(scripted) -> None:  # type: ignore[no-untyped-def]
    result = await create_method("continual-search", options={"turns": 1}).attribute(
        _trajectory(), scripted([PROSE])
    )
    assert result.error == NOT_JSON and result.fallback is None
    # Unreadable again and again: turn 2's answer stands (no rule at turn 2), turn 3 proposes no move.
    llm = scripted([PROSE, PROSE, PROSE])
    result = await create_method("continual-search", options={"turns": 3}).attribute(_trajectory(), llm)
    assert result.error == NOT_JSON and result.fallback is None


async def test_a_base_method_without_a_continuable_call_passes_on_its_error_and_fallback(scripted) -> None:  # type: ignore[no-untyped-def]
    method = create_method("continual-search", options={"base": "binary-search", "turns": 2})
    result = await method.attribute(_trajectory(), scripted(lambda request: PROSE))
    assert "no_continuation" in result.output
    assert result.error == f"no bisect answer was clear (3 of 3); first: {NOT_JSON}"
    assert result.fallback == (
        "binary search: unclear verdict at 3 of 3 halvings, half chosen at random (published rule)"
    )
