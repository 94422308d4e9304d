"""Continual Search and Passive Continuation: the decision tree's prompts, the change rule as a prompt sentence
whose observance is recorded (never enforced), agentic reading by default, the task in every call."""

from __future__ import annotations

import json
from typing import Any

import pytest

from helpers.scripted import ScriptedLLM
from rcarun.data import Step, Trajectory
from rcarun.errors import ConfigError
from rcarun.methods import Reply, ToolCall, create_method
from rcarun.methods.context import task_text
from rcarun.methods.continual_search import (
    SENTENCES,
    ContinualSearchOptions,
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

# 003 App. B.2.2: "The answer may then move only to an earlier cause that the judge supports with an exact quote."
RULE = "Your answer may move only to an earlier cause that you support with an exact quote."

INLINE = {"reading": "inline"}


def _trajectory(task: str = "Count the awnings.") -> Trajectory:
    agents = ["Planner", "Coder", "Computer_terminal"]
    steps = tuple(
        Step(index=i, agent=agents[i % 3], role="assistant", content=text) for i, text in enumerate(_CONTENTS)
    )
    return Trajectory(qid="demo/1", source="demo", task=task, steps=steps, sha256="0" * 64)


def _answer(role: str, step: int, quote: str | None = None, reason: str = "r") -> str:
    body: dict[str, Any] = {"reason": reason, "responsible_role": role, "root_step": step}
    if quote is not None:
        body["quote"] = quote
    return json.dumps(body)


@pytest.mark.parametrize(
    ("turn", "layout", "kind", "expected"),
    [
        (2, "whole", "single", ("opening.2", "trust.2", "search.single", "format.single")),
        (
            3,
            "whole",
            "single",
            ("opening.3", "trust.3", "search.single", "change.single", "format.single"),
        ),
        (
            4,
            "whole",
            "single",
            ("opening.4", "trust.4", "search.single", "change.single", "format.single"),
        ),
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
        if key not in ("search.pieces.first", "search.pieces.later", "format.single", "format.list"):
            assert sentence == SENTENCES[key]
    assert prompt.text.endswith("```json\n{S}\n```")
    if expected[2] == "search.pieces.later":
        assert "- steps 20-39" in prompt.text


def test_the_change_rule_is_the_papers_one_sentence() -> None:
    assert SENTENCES["change.single"] == RULE
    with_field = continuation_prompt(
        3, turns=4, layout="whole", answer_kind="single", schema_text="{S}", quote_field=True
    )
    assert RULE in with_field.text.split("\n\n")
    assert with_field.keys[-3:] == ("change.single", "format.quote", "format.single")
    # By default the rule sentence is all part 4 adds; the format is the benchmark's (003 App. B.2.2).
    bare = continuation_prompt(3, turns=4, layout="whole", answer_kind="single", schema_text="{S}")
    assert bare.keys[-2:] == ("change.single", "format.single")
    # Nothing in any prompt claims that a change is checked or rejected.
    for text in (with_field.text, bare.text):
        assert "reject" not in text.lower() and "stands" not in text.lower()


def test_pinned_prompt_of_the_who_and_when_branch_at_turn_three_with_the_quote_field() -> None:
    prompt = continuation_prompt(
        3, turns=4, layout="whole", answer_kind="single", schema_text="{S}", quote_field=True
    )
    assert prompt.text == (
        "Search again. The evidence you have not examined yet is the evidence most likely to change the answer.\n\n"
        "Your answer has survived one challenge. That shows it is consistent with what you read, not that "
        "nothing you have not read contradicts it.\n\n"
        "List the candidate causes you can find, including ones you dismissed. Test each candidate against the "
        "record: keep the earliest one that was never fixed afterwards and that still leads to the failure; "
        "discard a candidate that a later step corrected or that the failure does not depend on.\n\n"
        f"{RULE}\n\n"
        'Put the exact quote that supports a changed answer in "quote", copied verbatim from the record; if you '
        'keep your answer, give "quote" as an empty string.\n\n'
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


# --- the change rule: asked for in the prompt, observance recorded, the answer always kept ---------------------


async def test_a_move_that_follows_the_rule_is_recorded_as_followed(scripted: type[ScriptedLLM]) -> None:
    trajectory = _trajectory()
    llm = scripted(
        [
            _answer("Planner", 3),  # turn 1 (all-at-once)
            _answer("Planner", 3),  # turn 2: keeps it (no rule, the benchmark's schema)
            _answer("Coder", 1, "with the parameter year=2019 instead of 2021"),  # turn 3: earlier, quoted
            _answer("Coder", 1, ""),  # turn 4: keeps it
        ]
    )
    options = {**INLINE, "quote_field": True}
    result = await create_method("continual-search", options=options).attribute(trajectory, llm)
    assert (result.pred_role, result.pred_step) == ("Coder", 1)
    turns = result.output["turns"]
    assert [(t["pred_step"], t["changed_from_prev"], t["changed_from_turn1"]) for t in turns] == [
        (3, False, False),
        (3, False, False),
        (1, True, True),
        (1, False, True),
    ]
    assert "change_rule" not in turns[1]  # turn 2 has no rule
    assert turns[2]["change_rule"] == {
        "changed": True,
        "followed": True,
        "earlier": True,
        "quote_in_step": True,
        "quote_in_log": True,
    }
    assert turns[3]["change_rule"] == {"changed": False, "followed": True}
    assert result.output["change_rule"] == {"applies_at": [3, 4], "changed_at": [3], "broken_at": []}
    assert result.error is None and result.fallback is None
    # One conversation: every turn resends the whole history and adds one prompt.
    assert [len(r["messages"]) for r in llm.requests] == [2, 4, 6, 8]
    assert [r["stage"] for r in llm.requests] == ["attribution"] + ["continuation"] * 3
    assert llm.requests[2]["messages"][-1].content.startswith(SENTENCES["opening.3"])
    # "quote" joins the schema only where the prompt carries the rule; turn 2 keeps the benchmark's schema.
    assert llm.requests[1]["schema"]["required"] == ["reason", "responsible_role", "root_step"]
    assert llm.requests[2]["schema"]["required"] == ["reason", "responsible_role", "root_step", "quote"]


@pytest.mark.parametrize(
    ("answer", "given", "broken", "error"),
    [
        (
            _answer("Coder", 1, "a sentence that is nowhere in the log"),
            ("Coder", 1),
            ["no quote of at least 15 characters is found in the chosen step"],
            None,
        ),
        (
            _answer("Coder", 1, "12 awnings found for 2019"),  # step 2's text, not step 1's
            ("Coder", 1),
            ["no quote of at least 15 characters is found in the chosen step"],
            None,
        ),
        (
            _answer("Computer_terminal", 5, "FINAL ANSWER: 12"),
            ("Computer_terminal", 5),
            ["step 5 is later than the previous step 3, not earlier"],
            None,
        ),
        (
            _answer("Coder", 3, "The count is 12, based on the records."),  # a role-only change
            ("Coder", 3),
            ["step 3 is the same step as the previous step 3, not earlier"],
            None,
        ),
        (
            _answer("Coder", 40, ""),
            ("Coder", 40),
            [
                "the new root_step is not a step of the log",
                "no quote of at least 15 characters is found in the chosen step",
            ],
            None,
        ),
        (
            "not json at all",
            (None, None),
            ["the answer could not be read: Expecting value: line 1 column 1 (char 0)"],
            "Expecting value: line 1 column 1 (char 0)",
        ),
    ],
)
async def test_an_answer_that_breaks_the_rule_is_kept_as_given_and_flagged(
    scripted: type[ScriptedLLM], answer: str, given: tuple[Any, Any], broken: list[str], error: str | None
) -> None:
    llm = scripted([_answer("Planner", 3), _answer("Planner", 3), answer])
    method = create_method("continual-search", options={"turns": 3, "quote_field": True, **INLINE})
    result = await method.attribute(_trajectory(), llm)
    assert (result.pred_role, result.pred_step) == given  # never the earlier answer
    last = result.output["turns"][-1]
    assert (last["pred_role"], last["pred_step"]) == given and last["changed_from_prev"] is True
    assert last["change_rule"]["followed"] is False and last["change_rule"]["broken"] == broken
    assert result.output["change_rule"]["broken_at"] == [3]
    assert result.error == error and result.fallback is None


async def test_quote_scope_decides_which_place_counts(scripted: type[ScriptedLLM]) -> None:
    for scope, followed in (("step", False), ("log", True)):
        llm = scripted(
            [_answer("Planner", 3), _answer("Planner", 3), _answer("Coder", 1, "12 awnings found for 2019")]
        )
        options = {"turns": 3, "quote_scope": scope, "quote_field": True, **INLINE}
        result = await create_method("continual-search", options=options).attribute(_trajectory(), llm)
        rule = result.output["turns"][-1]["change_rule"]
        assert result.pred_step == 1  # kept either way
        assert (rule["followed"], rule["quote_in_step"], rule["quote_in_log"]) == (followed, False, True)


async def test_by_default_every_turn_keeps_the_benchmark_schema_and_quotes_are_read_in_the_reason(
    scripted: type[ScriptedLLM],
) -> None:
    # 003 App. B.2.2: "All turns retain the benchmark's original output schema".
    reason = 'Step 1 says "the parameter year=2019 instead of 2021", against the task.'
    answers = [
        _answer("Planner", 3),
        _answer("Planner", 3),
        _answer("Coder", 1, reason=reason),
        _answer("Coder", 1),
    ]
    llm = scripted(answers)
    result = await create_method("continual-search", options=INLINE).attribute(_trajectory(), llm)
    assert len(llm.requests) == 4
    assert all(r["schema"]["required"] == ["reason", "responsible_role", "root_step"] for r in llm.requests)
    assert all(SENTENCES["format.quote"] not in r["user"] for r in llm.requests)
    assert (
        result.output["turns"][2]["change_rule"]["followed"] is True
    )  # turn 3: the quote read in its reason
    assert result.output["change_rule"]["broken_at"] == []


async def test_turn_two_has_no_change_rule_and_stores_the_answer_as_given(
    scripted: type[ScriptedLLM],
) -> None:
    llm = scripted([_answer("Planner", 3), _answer("Computer_terminal", 5)])
    result = await create_method("continual-search", options={"turns": 2}).attribute(_trajectory(), llm)
    assert (result.pred_role, result.pred_step) == ("Computer_terminal", 5)
    assert result.output["turns"][1]["changed_from_prev"] is True
    assert "change_rule" not in result.output


async def test_list_answers_predict_the_earliest_listed_failure(scripted: type[ScriptedLLM]) -> None:
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
    llm = scripted([_answer("Planner", 3), listed, listed])
    method = create_method("continual-search", options={"turns": 3, "answer_kind": "list", **INLINE})
    result = await method.attribute(_trajectory(), llm)
    assert (result.pred_role, result.pred_step) == ("Coder", 1)
    assert llm.requests[1]["messages"][-1].content.split("\n\n")[2] == SENTENCES["search.list"]
    assert "change_rule" not in result.output  # no rule for list answers


async def test_passive_continuation_sends_the_same_sentence_every_turn(scripted: type[ScriptedLLM]) -> None:
    llm = scripted([_answer("Planner", 3), _answer("Coder", 4), _answer("Coder", 1)])
    result = await create_method("passive-continuation", options={"turns": 3}).attribute(_trajectory(), llm)
    prompts = {r["messages"][-1].content for r in llm.requests[1:]}
    assert len(prompts) == 1 and next(iter(prompts)).startswith("Reconsider your answer and verify it again.")
    assert RULE not in next(iter(prompts))
    assert all(r["schema"]["required"] == ["reason", "responsible_role", "root_step"] for r in llm.requests)
    # No change rule for the control: every answer stands as given.
    assert (result.pred_role, result.pred_step) == ("Coder", 1)
    assert [t["changed_from_prev"] for t in result.output["turns"]] == [False, True, True]
    assert "change_rule" not in result.output


async def test_inline_evidence_is_read_at_turn_one_only(scripted: type[ScriptedLLM]) -> None:
    llm = scripted([_answer("Planner", 3), _answer("Planner", 3), _answer("Planner", 3, "")])
    result = await create_method("continual-search", options={"turns": 3, **INLINE}).attribute(
        _trajectory(), llm
    )
    assert result.output["reading"] == "inline" and all(r["tools"] is None for r in llm.requests)
    evidence = [t["evidence_tokens"] for t in result.output["turns"]]
    assert evidence[0] > sum(len(text.split()) for text in _CONTENTS) and evidence[1:] == [0, 0]


def test_options_are_checked() -> None:
    with pytest.raises(
        ConfigError, match=r"^continual-search: turns: .*greater than or equal to 1 \(got 0\)"
    ):
        create_method("continual-search", options={"turns": 0})
    with pytest.raises(ConfigError, match=r"^continual-search: turns: .*less than or equal to 16 \(got 17\)"):
        create_method("continual-search", options={"turns": 17})
    with pytest.raises(ConfigError, match="one-shot method"):
        create_method("continual-search", options={"base": "self-consistency"})
    with pytest.raises(ConfigError, match="passive has one sentence"):
        create_method("passive-continuation", options={"answer_kind": "list"})
    with pytest.raises(ConfigError, match="passive has one sentence"):
        create_method("passive-continuation", options={"quote_field": False})
    with pytest.raises(ConfigError, match=r"^passive-continuation: base: all-at-once: unknown option"):
        create_method("passive-continuation", options={"base_options": {"bogus": 1}})
    with pytest.raises(ConfigError, match=r"^continual-search: quote_field: .*valid boolean"):
        create_method("continual-search", options={"quote_field": "yes"})
    with pytest.raises(ConfigError, match=r"^continual-search: unknown option\(s\) \['turn'\]"):
        create_method("continual-search", options={"turn": 3})
    # The two methods share the options model; passive accepts what does not shape Continual Search's prompts.
    passive = ContinualSearchOptions.from_mapping(
        {"turns": 2, "reading": "inline"}, name="passive-continuation"
    )
    assert (passive.turns, passive.reading, passive.layout) == (2, "inline", "whole")


@pytest.mark.parametrize("name", ["continual-search", "passive-continuation"])
@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("turns", "4"),
        ("turns", True),
        ("turns", 4.0),
        ("max_tokens", 2048.0),
        ("max_tool_calls", "24"),
        ("base", ["all-at-once"]),
        ("base_options", "reading=inline"),
        ("stage", ""),
        ("turn", 3),
    ],
)
def test_mistyped_options_are_refused_naming_the_option(name: str, option: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"^{name}: .*{option}"):
        create_method(name, options={option: value})


# --- reading: agentic by default, inline as an option -----------------------------------------------------------


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


@pytest.mark.parametrize("name", ["continual-search", "passive-continuation"])
async def test_the_default_judge_reads_the_log_with_tools(scripted: type[ScriptedLLM], name: str) -> None:
    llm = scripted(
        [
            _tool_reply("read_steps", '{"start": 0, "end": 2}', "c1"),  # turn 1: all-at-once, agentic
            _final_reply(_answer("Planner", 3)),
            _tool_reply("search", '{"pattern": "year=20\\\\d\\\\d"}', "c2"),  # turn 2
            _final_reply(_answer("Coder", 1)),
        ]
    )
    result = await create_method(name, options={"turns": 2}).attribute(_trajectory(), llm)
    assert result.output["reading"] == "agentic" and result.output["turn1"]["reading"] == "agentic"
    # The log is never inlined: the judge asked for steps 0-2 and searched; every call offered the tools.
    assert all(r["tools"] for r in llm.requests)
    assert _CONTENTS[4] not in llm.requests[0]["user"]
    turns = result.output["turns"]
    assert turns[0]["steps_read"] == 3 and turns[1]["tool_calls"] == 1
    assert turns[1]["tool_log"][0]["name"] == "search" and turns[1]["tool_log"][0]["steps"] == [1]
    assert (result.pred_role, result.pred_step) == ("Coder", 1)
    # A single trajectory is one artifact (the paper's Who&When branch), also when read with tools.
    assert result.output["layout"] == "whole"


async def test_pieces_layout_lists_unopened_pieces_and_counts_new_evidence(
    scripted: type[ScriptedLLM],
) -> None:
    llm = scripted(
        [
            _tool_reply("read_steps", '{"start": 0, "end": 1}', "c1"),  # turn 1 (agentic all-at-once)
            _final_reply(_answer("Planner", 3)),
            _tool_reply("read_steps", '{"start": 4, "end": 5}', "c2"),  # turn 2
            _tool_reply("read_steps", '{"start": 0, "end": 1}', "c3"),  # re-read: no new evidence
            _final_reply(_answer("Planner", 3)),
            _final_reply(_answer("Planner", 3, "")),  # turn 3: no tools
        ]
    )
    options = {"turns": 3, "layout": "pieces", "piece_steps": 2}
    result = await create_method("continual-search", options=options).attribute(_trajectory(), llm)
    turns = result.output["turns"]
    assert result.output["layout"] == "pieces"
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


def test_layout_auto_follows_the_reading() -> None:
    assert create_method("continual-search", options={"layout": "auto"})._layout() == "pieces"  # type: ignore[attr-defined]
    inline = create_method("continual-search", options={"layout": "auto", **INLINE})
    assert inline._layout() == "whole"  # type: ignore[attr-defined]


async def test_a_capped_last_turn_is_the_prediction_with_its_error(scripted: type[ScriptedLLM]) -> None:
    runaway = [_tool_reply("read_steps", '{"start": 0, "end": 0}', f"c{i}") for i in range(4)]
    llm = scripted([_final_reply(_answer("Planner", 3)), *runaway])
    options = {"turns": 3, "max_tool_calls": 1}
    result = await create_method("continual-search", options=options).attribute(_trajectory(), llm)
    turns = result.output["turns"]
    assert turns[1]["capped"] is True and "still called tools" in turns[1]["invalid_answer"]
    assert turns[2]["capped"] is True
    # Unreadable answers stand as given: no earlier answer takes their place.
    assert (turns[1]["pred_step"], turns[2]["pred_step"], result.pred_step) == (None, None, None)
    assert turns[2]["change_rule"]["followed"] is False
    assert (
        result.error
        == "tool-call cap reached: the model still called tools after its 1 tool calls were spent"
    )


# --- the task instruction in every call --------------------------------------------------------------------------

TASK = (
    "Find how many awnings the city of Springfield recorded in 2021. Use the official city records API; report "
    "a single integer and nothing else."
)


@pytest.mark.parametrize("name", ["continual-search", "passive-continuation"])
@pytest.mark.parametrize("reading", ["agentic", "inline"])
async def test_every_request_shows_the_task(scripted: type[ScriptedLLM], name: str, reading: str) -> None:
    # A LongRCA record has no `question`; the loader sets `task` from its history. Every call must show it.
    trajectory = _trajectory(task=TASK)
    llm = scripted(
        [
            _answer("Planner", 3),
            _tool_reply("read_steps", '{"start": 0, "end": 5}', "c1"),
            _answer("Planner", 3),
            _answer("Coder", 1, ""),
            _answer("Coder", 1, ""),
        ]
        if reading == "agentic"
        else [_answer("Planner", 3)] * 4
    )
    result = await create_method(name, options={"reading": reading}).attribute(trajectory, llm)
    assert len(result.output["turns"]) == 4 and len(llm.requests) >= 4
    shown = task_text(trajectory)
    assert shown == TASK
    for request in llm.requests:
        assert any(shown in m.content for m in request["messages"] if m.role == "user"), request["stage"]


# --- unreadable answers and fallbacks: Attribution.error / fallback ---------------------------------------------

PROSE = "I don't know the answer to that."
NOT_JSON = "Expecting value: line 1 column 1 (char 0)"


async def test_an_unreadable_last_answer_is_the_prediction(scripted: type[ScriptedLLM]) -> None:
    llm = scripted(
        [_answer("Planner", 3), _answer("Planner", 3), PROSE, _answer("Coder", 1, "nowhere at all")]
    )
    result = await create_method("continual-search", options=INLINE).attribute(_trajectory(), llm)
    # Turn 3 was unreadable and turn 4 broke the rule: the prediction is turn 4's answer as given.
    assert (result.pred_role, result.pred_step) == ("Coder", 1)
    assert result.error is None and result.fallback is None
    assert result.output["change_rule"] == {"applies_at": [3, 4], "changed_at": [3, 4], "broken_at": [3, 4]}
    llm = scripted([_answer("Planner", 3), _answer("Planner", 3), _answer("Planner", 3, ""), PROSE])
    result = await create_method("continual-search", options=INLINE).attribute(_trajectory(), llm)
    assert (result.pred_role, result.pred_step) == (None, None)
    assert result.error == NOT_JSON and result.fallback is None


@pytest.mark.parametrize(
    ("turn1", "turn2", "error"),
    [
        (PROSE, _answer("Coder", 1), None),  # a readable later answer replaces an unreadable turn 1
        (_answer("Planner", 3), PROSE, NOT_JSON),
        (
            _answer("Planner", 3),
            json.dumps({"reason": "r", "responsible_role": "Coder", "root_step": "one"}),
            'root_step is not an integer: "one"',
        ),
    ],
)
async def test_the_error_is_that_of_the_last_answer(
    scripted: type[ScriptedLLM], turn1: str, turn2: str, error: str | None
) -> None:
    for name in ("continual-search", "passive-continuation"):
        llm = scripted([turn1, turn2])
        result = await create_method(name, options={"turns": 2, **INLINE}).attribute(_trajectory(), llm)
        assert result.error == error, name
        assert result.fallback is None


async def test_a_digit_string_step_is_read_as_all_at_once_reads_it(scripted: type[ScriptedLLM]) -> None:
    digits = json.dumps({"reason": "r", "responsible_role": "Coder", "root_step": "1", "quote": ""})
    llm = scripted([_answer("Planner", 3), _answer("Planner", 3), digits])
    result = await create_method("continual-search", options={"turns": 3, **INLINE}).attribute(
        _trajectory(), llm
    )
    assert (result.pred_step, result.step_valid, result.error) == (1, True, None)
    assert result.output["turns"][-1]["change_rule"]["earlier"] is True


async def test_a_lone_turn_one_keeps_the_base_methods_error(scripted: type[ScriptedLLM]) -> None:
    result = await create_method("continual-search", options={"turns": 1, **INLINE}).attribute(
        _trajectory(), scripted([PROSE])
    )
    assert result.error == NOT_JSON and result.fallback is None


async def test_a_base_method_without_a_continuable_call_passes_on_its_error_and_fallback(
    scripted: type[ScriptedLLM],
) -> None:
    method = create_method("continual-search", options={"base": "binary-search", "turns": 2})
    result = await method.attribute(_trajectory(), scripted(lambda request: PROSE))
    assert "no_continuation" in result.output
    assert result.error == f"no bisect answer was clear (3 of 3); first: {NOT_JSON}"
    assert result.fallback == (
        "binary search: unclear verdict at 3 of 3 halvings, half chosen at random (published rule)"
    )
