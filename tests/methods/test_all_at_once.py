"""All-at-once: prompt content, answer schema, strict validation and the context-window truncation policy."""

from __future__ import annotations

import json

import pytest

from rcarun.data import Step, Trajectory
from rcarun.errors import ConfigError
from rcarun.methods import Reply, ToolCall, create_method, registered_methods
from rcarun.methods.all_at_once import AllAtOnce, AllAtOnceOptions, answer_schema, render_log


def _trajectory(n: int = 4, content_len: int = 20) -> Trajectory:
    agents = ["Planner", "Coder", "Computer_terminal"]
    steps = tuple(
        Step(index=i, agent=agents[i % 3], role="assistant", content=f"step {i} " + "x" * content_len)
        for i in range(n)
    )
    return Trajectory(qid="demo/1", source="demo", task="Count the awnings.", steps=steps, sha256="0" * 64)


def test_registered_under_its_kebab_case_name() -> None:
    assert "all-at-once" in registered_methods()
    method = create_method("all-at-once", label="aao/no-numbers", options={"step_numbers": False})
    assert method.label == "aao/no-numbers"


def test_unknown_option_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown option"):
        create_method("all-at-once", options={"max_token": 10})


def test_schema_carries_role_enum_and_step_bounds() -> None:
    schema = answer_schema(_trajectory(7))
    assert schema["properties"]["responsible_role"]["enum"] == ["Planner", "Coder", "Computer_terminal"]
    assert schema["properties"]["root_step"] == {"type": "integer", "minimum": 0, "maximum": 6}
    assert set(schema["required"]) == {"reason", "responsible_role", "root_step"}


async def test_one_call_with_the_whole_log_and_a_valid_answer(scripted) -> None:  # type: ignore[no-untyped-def]
    trajectory = _trajectory(5)
    llm = scripted([json.dumps({"reason": "bad code", "responsible_role": "Coder", "root_step": 1})])
    attribution = await AllAtOnce("all-at-once", AllAtOnceOptions()).attribute(trajectory, llm)

    assert len(llm.requests) == 1
    request = llm.requests[0]
    assert request["stage"] == "attribution"
    assert request["max_tokens"] == 8000
    assert request["temperature"] == 0.0
    user = request["messages"][1].content
    for step in trajectory.steps:
        assert f"[step {step.index}] {step.agent}: {step.content}" in user
    assert "Count the awnings." in user
    assert '"maximum": 4' in user  # the schema is stated in the prompt too
    assert (attribution.pred_role, attribution.pred_step) == ("Coder", 1)
    assert attribution.role_valid and attribution.step_valid
    assert attribution.output["truncation"]["applied"] is False


@pytest.mark.parametrize(
    ("answer", "role_valid", "step_valid", "pred_step"),
    [
        ({"reason": "", "responsible_role": "Nobody", "root_step": 2}, False, True, 2),
        ({"reason": "", "responsible_role": "Coder", "root_step": 5}, True, False, 5),
        ({"reason": "", "responsible_role": "Coder", "root_step": -1}, True, False, -1),
        (
            {"reason": "", "responsible_role": "Coder", "root_step": "2"},
            True,
            True,
            2,
        ),  # read as the scorer does
        ({"reason": "", "responsible_role": "Coder", "root_step": "2.0"}, True, False, None),
        ({"reason": "", "responsible_role": "Coder", "root_step": True}, True, False, None),
        ({"reason": "", "responsible_role": "coder", "root_step": 2.0}, False, False, None),
        ({"reason": ""}, False, False, None),
    ],
)
async def test_invalid_fields_are_stored_as_invalid_not_repaired(  # type: ignore[no-untyped-def]
    scripted, answer, role_valid, step_valid, pred_step
) -> None:
    llm = scripted([json.dumps(answer)])
    attribution = await AllAtOnce("all-at-once", AllAtOnceOptions()).attribute(_trajectory(5), llm)
    assert attribution.role_valid is role_valid
    assert attribution.step_valid is step_valid
    assert attribution.pred_step == pred_step
    assert attribution.output["answer"] == answer


async def test_text_that_is_not_json_is_kept_as_an_invalid_answer(scripted) -> None:  # type: ignore[no-untyped-def]
    llm = scripted(["The Coder broke it at step 1."])
    attribution = await AllAtOnce("all-at-once", AllAtOnceOptions()).attribute(_trajectory(5), llm)
    assert attribution.pred_role is None and attribution.pred_step is None
    assert not attribution.role_valid and not attribution.step_valid
    assert attribution.output["raw_text"] == "The Coder broke it at step 1."
    assert "invalid_answer" in attribution.output


def test_original_rendering_has_no_step_numbers() -> None:
    log = render_log(_trajectory(3), step_numbers=False)
    assert log.splitlines()[0].startswith("Planner: step 0")
    assert "[step" not in log


async def test_truncation_keeps_every_step_and_fits_the_window(scripted) -> None:  # type: ignore[no-untyped-def]
    trajectory = _trajectory(40, content_len=4000)  # ~160k characters, ~40k tokens at 4 chars/token
    llm = scripted(
        [json.dumps({"reason": "", "responsible_role": "Coder", "root_step": 1})], context_window=16_000
    )
    method = AllAtOnce("all-at-once", AllAtOnceOptions(max_tokens=4000))
    attribution = await method.attribute(trajectory, llm)

    truncation = attribution.output["truncation"]
    assert truncation["applied"] is True and truncation["fits"] is True
    assert truncation["steps_cut"] == 40
    user = llm.requests[0]["messages"][1].content
    system = llm.requests[0]["messages"][0].content
    assert llm.estimate_tokens(user) + llm.estimate_tokens(system) + 4000 <= 16_000
    for step in trajectory.steps:
        assert f"[step {step.index}] {step.agent}: step {step.index}" in user
    assert "characters elided" in user


async def test_no_truncation_policy_sends_everything(scripted) -> None:  # type: ignore[no-untyped-def]
    trajectory = _trajectory(40, content_len=4000)
    llm = scripted(
        [json.dumps({"reason": "", "responsible_role": "Coder", "root_step": 1})], context_window=16_000
    )
    method = AllAtOnce("all-at-once", AllAtOnceOptions(truncation="none"))
    attribution = await method.attribute(trajectory, llm)
    assert attribution.output["truncation"]["applied"] is False
    assert "characters elided" not in llm.requests[0]["messages"][1].content


@pytest.mark.parametrize(
    ("include", "ground_truth", "expected_block"),
    [
        (False, "3 awnings", "Task:\nCount the awnings.\n\nAgents recorded in the log:"),
        (
            True,
            "3 awnings",
            "Task:\nCount the awnings.\nCorrect final answer: 3 awnings\n\nAgents recorded in the log:",
        ),
        (True, "", "Task:\nCount the awnings.\n\nAgents recorded in the log:"),
    ],
)
def test_ground_truth_line_only_when_asked_and_recorded(
    include: bool, ground_truth: str, expected_block: str
) -> None:
    base = _trajectory(3)
    trajectory = Trajectory(
        qid=base.qid,
        source=base.source,
        task=base.task,
        steps=base.steps,
        sha256=base.sha256,
        ground_truth=ground_truth,
    )
    method = create_method("all-at-once", options={"include_ground_truth": include})
    assert isinstance(method, AllAtOnce)
    messages, _ = method.build_messages(trajectory, _NoWindow())
    assert expected_block in messages[1].content
    assert ("Correct final answer" in messages[1].content) is (include and bool(ground_truth))


class _NoWindow:
    context_window = None

    def estimate_tokens(self, text: str) -> int:
        return len(text) // 4


# ------------------------------------------------------------------------------------------ agentic reading


def _tool_reply(*calls: ToolCall) -> Reply:
    return Reply(text="", parsed=None, parse_error=None, finish_reason="tool_calls", tool_calls=calls)


async def test_agentic_reading_reads_with_tools_and_records_them(scripted) -> None:  # type: ignore[no-untyped-def]
    trajectory = _trajectory(6)
    answer = json.dumps({"reason": "bad code", "responsible_role": "Coder", "root_step": 4})
    llm = scripted(
        [
            _tool_reply(
                ToolCall("a", "read_steps", '{"start": 3, "end": 4}'), ToolCall("b", "list_roles", "{}")
            ),
            _tool_reply(ToolCall("c", "read_steps", '{"start": 4, "end": 99}')),
            answer,
        ]
    )
    method = create_method("all-at-once", options={"reading": "agentic", "max_tool_calls": 5})
    attribution = await method.attribute(trajectory, llm)

    assert len(llm.requests) == 3
    user = llm.requests[0]["messages"][1].content
    assert "The log has 6 steps, numbered from 0 to 5" in user
    assert "at most 5 tool calls" in user
    assert "Count the awnings." in user
    assert all(step.content not in user for step in trajectory.steps)  # the log itself is not inlined
    assert '"maximum": 5' in user  # the answer schema is
    assert [spec["function"]["name"] for spec in llm.requests[0]["tools"]] == [
        "read_steps",
        "search",
        "list_roles",
    ]
    assert all(request["stage"] == "attribution" for request in llm.requests)
    assert (attribution.pred_role, attribution.pred_step) == ("Coder", 4)
    assert attribution.role_valid and attribution.step_valid
    output = attribution.output
    assert output["reading"] == "agentic"
    assert (output["calls"], output["tool_calls"], output["capped"]) == (3, 3, False)
    assert output["steps_read"] == [3, 4]
    assert output["evidence_tokens"] == 6  # one short text of two 3-token steps, counted whole
    assert [entry["name"] for entry in output["tool_log"]] == ["read_steps", "list_roles", "read_steps"]
    assert "outside the log" in output["tool_log"][2]["error"]
    assert output["max_result_chars"] == 12_000
    json.dumps(output)  # stored as JSON


async def test_agentic_reading_that_hits_the_cap_is_an_invalid_answer(scripted) -> None:  # type: ignore[no-untyped-def]
    llm = scripted(lambda request: _tool_reply(ToolCall(f"c{len(llm.requests)}", "list_roles", "{}")))
    method = create_method("all-at-once", options={"reading": "agentic", "max_tool_calls": 2})
    attribution = await method.attribute(_trajectory(4), llm)
    assert len(llm.requests) == 3
    assert llm.requests[2]["tool_choice"] == "none"
    assert attribution.pred_role is None and attribution.pred_step is None
    assert not attribution.role_valid and not attribution.step_valid
    assert attribution.output["capped"] is True
    assert "still called tools after its 2 tool calls" in attribution.output["invalid_answer"]
    assert attribution.error == (
        "tool-call cap reached: the model still called tools after its 2 tool calls were spent"
    )
    assert attribution.fallback is None


def test_agentic_result_size_follows_the_context_window(scripted) -> None:  # type: ignore[no-untyped-def]
    method = AllAtOnce("aao", AllAtOnceOptions(reading="agentic", max_tool_calls=10, max_tokens=1000))
    messages = method.build_agentic_messages(_trajectory(4))
    prompt_tokens = sum(int(len(m.content) / 4.0) + 1 for m in messages)
    small = scripted([], context_window=9000)
    assert method.result_chars(messages, small) == (9000 - 1000 - prompt_tokens) * 3 // 10
    assert method.result_chars(messages, scripted([], context_window=2000)) == 500
    assert method.result_chars(messages, scripted([], context_window=10**6)) == 12_000
    assert method.result_chars(messages, scripted([])) == 12_000


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"reading": "skim"},
            r"^all-at-once: reading: Input should be 'inline' or 'agentic' \(got 'skim'\)$",
        ),
        ({"reading": "agentic", "max_tool_calls": 0}, "max_tool_calls: Input should be greater than 0"),
        ({"max_tool_calls": True}, "max_tool_calls: Input should be a valid integer"),
        ({"max_tokens": "8000"}, "max_tokens: Input should be a valid integer"),
        ({"temperature": float("nan")}, "temperature: Input should be a finite number"),
        (
            {"reading": "agentic", "step_numbers": False},
            r"^all-at-once: reading='agentic' needs step_numbers=true",
        ),
    ],
)
def test_agentic_options_are_checked(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        create_method("all-at-once", options=options)


# --- unreadable answers: Attribution.error (never a fallback) ----------------------------------------------


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("The Coder broke it at step 1.", "Expecting value: line 1 column 1 (char 0)"),
        ("[1, 2]", "the answer is not a JSON object"),
        (
            json.dumps({"reason": "r", "responsible_role": "Coder", "root_step": "one"}),
            'root_step is not an integer: "one"',
        ),
        (json.dumps({"reason": "r", "root_step": 1}), "responsible_role is missing"),
        (
            json.dumps({"reason": "r", "responsible_role": 7, "root_step": None}),
            "responsible_role is not a string: 7; root_step is not an integer: null",
        ),
    ],
)
async def test_an_answer_that_cannot_be_read_carries_its_error(scripted, text: str, error: str) -> None:  # type: ignore[no-untyped-def]
    attribution = await AllAtOnce("all-at-once", AllAtOnceOptions()).attribute(
        _trajectory(), scripted([text])
    )
    assert attribution.error == error
    assert attribution.fallback is None


@pytest.mark.parametrize(
    "answer",
    [
        {"reason": "r", "responsible_role": "Coder", "root_step": 1},
        {"reason": "r", "responsible_role": "Coder", "root_step": " 1 "},  # a digit string is a step
        {
            "reason": "r",
            "responsible_role": "Nobody",
            "root_step": 99,
        },  # read, but invalid: validity, not error
    ],
)
async def test_an_answer_that_was_read_has_no_error(scripted, answer: dict[str, object]) -> None:  # type: ignore[no-untyped-def]
    llm = scripted([json.dumps(answer)])
    attribution = await AllAtOnce("all-at-once", AllAtOnceOptions()).attribute(_trajectory(), llm)
    assert attribution.error is None and attribution.fallback is None
    assert "invalid_answer" not in attribution.output
