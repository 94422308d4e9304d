"""Simulated tool calls: a seeded number of rounds per conversation, arguments within each function's schema."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest

from rcarun.mock import MockConfig, MockServer
from rcarun.mock.answers import generate_arguments, simulate_tool_calls

from .conftest import PostChat

Body = Callable[..., dict[str, Any]]

READ_STEPS: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "read_steps",
        "parameters": {
            "type": "object",
            "properties": {
                "start": {"type": "integer", "minimum": 0, "maximum": 7},
                "end": {"type": "integer", "minimum": 0, "maximum": 7},
                "mode": {"type": "string", "enum": ["full", "brief"]},
                "limit": {"type": "integer", "minimum": 1, "maximum": 3},
            },
            "required": ["start", "end", "mode"],
        },
    },
}
LIST_ROLES: dict[str, Any] = {
    "type": "function",
    "function": {"name": "list_roles", "parameters": {"type": "object", "properties": {}}},
}
ANSWER_SCHEMA = {"type": "object", "properties": {"step": {"type": "integer"}}, "required": ["step"]}


def tool_round(number: int) -> list[dict[str, Any]]:
    """One completed tool round: the assistant's call and the tool's answer."""
    call = {"id": f"c{number}", "type": "function", "function": {"name": "list_roles", "arguments": "{}"}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{number}", "content": "Planner"},
    ]


def conversation(user: str, rounds: int, before: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """``before``, a user question, then ``rounds`` completed tool rounds."""
    messages = [*(before or []), {"role": "user", "content": user}]
    for number in range(rounds):
        messages.extend(tool_round(number))
    return messages


def rounds_until_answer(
    user: str, rounds_max: int, *, before: list[dict[str, Any]] | None = None, model: str = "m"
) -> int:
    """How many tool rounds the simulator makes before answering, following its own calls."""
    for rounds in range(rounds_max + 2):
        body = {"messages": conversation(user, rounds, before), "tools": [LIST_ROLES]}
        if simulate_tool_calls(body, model=model, rounds_max=rounds_max, rng=random.Random(rounds)) is None:
            return rounds
    raise AssertionError("the simulator never stopped calling tools")


def test_rounds_are_a_seeded_draw_between_zero_and_the_maximum() -> None:
    counts = [rounds_until_answer(f"question {i}", 3) for i in range(60)]
    assert set(counts) == {0, 1, 2, 3}
    assert counts == [rounds_until_answer(f"question {i}", 3) for i in range(60)]
    assert {rounds_until_answer(f"question {i}", 0) for i in range(20)} == {0}


def test_rounds_before_the_last_user_message_do_not_count() -> None:
    earlier = conversation("older question", 3)
    assert {rounds_until_answer(f"question {i}", 3, before=earlier) for i in range(60)} == {0, 1, 2, 3}


def test_tool_choice_none_never_calls_and_required_always_does() -> None:
    for i in range(20):
        body = {"messages": conversation(f"q{i}", 0), "tools": [LIST_ROLES], "tool_choice": "none"}
        assert simulate_tool_calls(body, model="m", rounds_max=3, rng=random.Random(i)) is None
        body["tool_choice"] = "required"
        assert simulate_tool_calls(body, model="m", rounds_max=0, rng=random.Random(i))


def test_a_named_function_is_the_only_one_called() -> None:
    choice = {"type": "function", "function": {"name": "list_roles"}}
    body = {"messages": conversation("q", 0), "tools": [READ_STEPS, LIST_ROLES], "tool_choice": choice}
    for i in range(20):
        calls = simulate_tool_calls(body, model="m", rounds_max=0, rng=random.Random(i))
        assert calls is not None
        assert {call["function"]["name"] for call in calls} == {"list_roles"}


def test_calls_are_one_or_two_offered_functions_in_wire_shape() -> None:
    sizes = set()
    for i in range(200):
        body = {
            "messages": conversation(f"q{i}", 0),
            "tools": [READ_STEPS, LIST_ROLES],
            "tool_choice": "required",
        }
        calls = simulate_tool_calls(body, model="m", rounds_max=3, rng=random.Random(i))
        assert calls is not None
        sizes.add(len(calls))
        for call in calls:
            assert call["type"] == "function"
            assert call["id"].startswith("call_") and len(call["id"]) == 21
            assert call["function"]["name"] in {"read_steps", "list_roles"}
            json.loads(call["function"]["arguments"])
    assert sizes == {1, 2}


def test_arguments_honour_types_bounds_enums_and_required() -> None:
    parameters = READ_STEPS["function"]["parameters"]
    seen_limit = 0
    for i in range(300):
        arguments = generate_arguments(parameters, random.Random(i))
        assert {"start", "end", "mode"} <= set(arguments) <= {"start", "end", "mode", "limit"}
        for name in ("start", "end"):
            assert isinstance(arguments[name], int) and 0 <= arguments[name] <= 7
        assert arguments["mode"] in {"full", "brief"}
        if "limit" in arguments:
            seen_limit += 1
            assert 1 <= arguments["limit"] <= 3
    assert 90 < seen_limit < 210  # the optional argument is given about half the time
    assert generate_arguments(None, random.Random(0)) == {}
    assert generate_arguments({"type": "object"}, random.Random(0)) == {}


# -------------------------------------------------------------------------------------------- over HTTP


def tool_body(make_body: Body, user: str, **extra: Any) -> dict[str, Any]:
    return make_body(user, schema=ANSWER_SCHEMA, tools=[READ_STEPS, LIST_ROLES], temperature=0, **extra)


async def test_server_calls_tools_then_answers_with_the_schema(post_chat: PostChat, make_body: Body) -> None:
    async with MockServer(MockConfig(latency_s=0, tool_rounds_max=3, chars_per_token=4.0)) as server:
        system = [{"role": "system", "content": "You attribute failures in agent trajectories."}]
        user = next(
            f"q{i}"
            for i in range(100)
            if rounds_until_answer(f"q{i}", 3, before=system, model="sim-model") == 2
        )
        body = tool_body(make_body, user)
        rounds = 0
        while True:
            reply = await post_chat(server, body)
            assert reply.status == 200
            choice = reply.body["choices"][0]
            if choice["finish_reason"] != "tool_calls":
                break
            rounds += 1
            message = reply.message
            assert message["content"] is None
            calls = message["tool_calls"]
            text = "".join(c["function"]["name"] + c["function"]["arguments"] for c in calls)
            assert reply.body["usage"]["completion_tokens"] == -(-len(text) // 4)
            answers = [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls]
            body = {**body, "messages": [*body["messages"], message, *answers]}
        assert rounds == 2
        assert choice["finish_reason"] == "stop"
        assert isinstance(json.loads(reply.content)["step"], int)


async def test_server_charges_tool_specs_as_prompt_tokens(post_chat: PostChat, make_body: Body) -> None:
    async with MockServer(MockConfig(latency_s=0, tool_rounds_max=0)) as server:
        plain = await post_chat(server, make_body("q", schema=ANSWER_SCHEMA, temperature=0))
        offered = await post_chat(server, tool_body(make_body, "q"))
        spec_chars = len(json.dumps([READ_STEPS, LIST_ROLES], separators=(",", ":")))
        extra = offered.body["usage"]["prompt_tokens"] - plain.body["usage"]["prompt_tokens"]
        assert extra == -(-spec_chars // 4)
        assert offered.body["choices"][0]["finish_reason"] == "stop"


async def test_server_honours_tool_choice_none(post_chat: PostChat, make_body: Body) -> None:
    async with MockServer(MockConfig(latency_s=0, tool_rounds_max=3)) as server:
        for i in range(10):
            reply = await post_chat(server, tool_body(make_body, f"q{i}", tool_choice="none"))
            assert reply.body["choices"][0]["finish_reason"] == "stop"
            assert "tool_calls" not in reply.message


async def test_tool_calls_cut_by_the_budget_are_a_length_stop(post_chat: PostChat, make_body: Body) -> None:
    async with MockServer(MockConfig(latency_s=0)) as server:
        reply = await post_chat(server, tool_body(make_body, "q", tool_choice="required", max_tokens=2))
        choice = reply.body["choices"][0]
        assert choice["finish_reason"] == "length"
        assert "tool_calls" not in choice["message"]
        assert reply.body["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_tool_rounds_max_is_validated(bad: Any) -> None:
    with pytest.raises(ValueError, match="tool_rounds_max"):
        MockConfig(tool_rounds_max=bad)
