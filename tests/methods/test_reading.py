"""The agentic reading toolkit: each tool, every kind of bad call, the 13-gram ledger and the tool loop's cap."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rcarun.data import Step, Trajectory
from rcarun.methods import Message, Reply, ToolCall
from rcarun.methods.reading import EvidenceLedger, TrajectoryReader, converse_with_tools

from .conftest import ScriptedLLM

CONTENTS = [
    "Plan: search the archive for the 2019 report, then count the awnings.",
    "Searching the archive (query: awnings 2019) returned three documents.",
    "Error: the archive returned HTTP 503; retrying with the cached copy.",
    "The cached copy says 12 awnings; reporting 12 as the final answer.",
    "Done.",
]
AGENTS = ["Planner", "WebSurfer", "WebSurfer", "Planner", "Planner"]


def trajectory(contents: list[str] | None = None, agents: list[str] | None = None) -> Trajectory:
    contents = contents or CONTENTS
    agents = agents or AGENTS
    steps = tuple(
        Step(index=i, agent=agents[i % len(agents)], role="assistant", content=text)
        for i, text in enumerate(contents)
    )
    return Trajectory(qid="t/1", source="demo", task="Count the awnings.", steps=steps, sha256="0" * 64)


def call(name: str, arguments: Any, call_id: str = "c1") -> ToolCall:
    return ToolCall(call_id, name, arguments if isinstance(arguments, str) else json.dumps(arguments))


# ------------------------------------------------------------------------------------------------ the tools


def test_specs_are_openai_functions_with_the_logs_step_bounds() -> None:
    specs = TrajectoryReader(trajectory()).tool_specs()
    assert [spec["function"]["name"] for spec in specs] == ["read_steps", "search", "list_roles"]
    assert all(spec["type"] == "function" for spec in specs)
    read = specs[0]["function"]["parameters"]
    assert read["required"] == ["start", "end"]
    for bound in ("start", "end"):
        assert (read["properties"][bound]["minimum"], read["properties"][bound]["maximum"]) == (0, 4)
    search = specs[1]["function"]["parameters"]
    assert search["required"] == ["pattern"]
    assert search["properties"]["max_hits"]["maximum"] == 50
    assert specs[2]["function"]["parameters"]["properties"] == {}


def test_read_steps_returns_the_range_and_marks_it_read() -> None:
    reader = TrajectoryReader(trajectory())
    result = reader.run(call("read_steps", {"start": 1, "end": 2}))
    assert result.error is None
    assert result.content == f"[step 1] WebSurfer: {CONTENTS[1]}\n[step 2] WebSurfer: {CONTENTS[2]}"
    assert result.steps == (1, 2)
    assert result.text_read == f"{CONTENTS[1]}\n{CONTENTS[2]}"
    assert reader.steps_read == {1, 2}
    reader.run(call("read_steps", {"start": 4, "end": 4}))
    assert reader.steps_read == {1, 2, 4}


def test_read_steps_stops_at_the_result_limit_and_says_where_to_continue() -> None:
    contents = ["a" * 40, "b" * 40, "c" * 40]
    reader = TrajectoryReader(trajectory(contents, ["X"]), max_result_chars=120)
    result = reader.run(call("read_steps", {"start": 0, "end": 2}))
    # Each line is "[step k] X: " (12 chars) + 40: two fit in 120 with their newline, the third does not.
    assert result.steps == (0, 1)
    assert result.content.endswith("call read_steps(2, 2) to continue]")
    assert result.text_read == "a" * 40 + "\n" + "b" * 40


def test_a_step_longer_than_the_limit_is_cut_with_the_omission_stated() -> None:
    reader = TrajectoryReader(trajectory(["z" * 500, "short"], ["X"]), max_result_chars=100)
    result = reader.run(call("read_steps", {"start": 0, "end": 1}))
    assert result.steps == (0,)
    assert result.text_read == "z" * 88  # 100 less the 12-character header
    assert "412 more characters not shown" in result.content
    assert "call read_steps(1, 1) to continue" in result.content


def test_search_returns_one_snippet_per_matching_step_case_insensitively() -> None:
    reader = TrajectoryReader(trajectory())
    result = reader.run(call("search", {"pattern": r"ARCHIVE|cached"}))
    assert result.error is None
    assert result.steps == (0, 1, 2, 3)
    lines = result.content.splitlines()
    assert lines[0] == "4 steps match 'ARCHIVE|cached'; showing 4."
    assert lines[3] == f"[step 2] WebSurfer (2 matches): {CONTENTS[2]}"
    assert result.text_read.splitlines()[2] == CONTENTS[2]
    assert reader.steps_read == {0, 1, 2, 3}


def test_search_limits_hits_and_cuts_snippets_around_the_match() -> None:
    long_step = "x" * 300 + " NEEDLE " + "y" * 300
    reader = TrajectoryReader(trajectory([long_step, "needle", "needle", "hay"], ["X"]))
    result = reader.run(call("search", {"pattern": "needle", "max_hits": 2}))
    assert result.steps == (0, 1)
    assert result.content.splitlines()[0] == "3 steps match 'needle'; showing 2."
    snippet = result.text_read.splitlines()[0]
    assert snippet == "x" * 159 + " NEEDLE " + "y" * 159
    assert "…" + snippet + "…" in result.content


def test_search_without_a_match_reads_nothing() -> None:
    reader = TrajectoryReader(trajectory())
    result = reader.run(call("search", {"pattern": "zebra"}))
    assert (result.content, result.error, result.steps, result.text_read) == (
        "No step matches 'zebra'.",
        None,
        (),
        "",
    )
    assert reader.steps_read == set()


def test_list_roles_gives_step_ranges_and_reads_no_content() -> None:
    reader = TrajectoryReader(trajectory())
    result = reader.run(call("list_roles", ""))
    assert result.content == "5 steps, numbered 0..4.\nPlanner: 3 steps (0, 3-4)\nWebSurfer: 2 steps (1-2)"
    assert (result.steps, result.text_read) == ((), "")
    assert reader.run(call("list_roles", "{}")).content == result.content


# --------------------------------------------------------------------------------------------- bad calls


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("read_steps", {"start": 3, "end": 9}, "steps 3..9 are outside the log: its steps are numbered 0..4"),
        ("read_steps", {"start": 7, "end": 7}, "outside the log"),
        ("read_steps", {"start": 3, "end": 1}, "start 3 is after end 1: give start <= end, within 0..4"),
        ("read_steps", {"start": -1, "end": 1}, "start must be a whole step number from 0 to 4, got -1"),
        ("read_steps", {"start": "2", "end": 3}, 'start must be a whole step number from 0 to 4, got "2"'),
        ("read_steps", {"start": 1.5, "end": 3}, "got 1.5"),
        ("read_steps", {"start": True, "end": 3}, "got true"),
        ("read_steps", {"start": 1}, "read_steps: missing end; read_steps takes start, end"),
        ("read_steps", {"start": 1, "end": 2, "limit": 3}, "unknown limit"),
        ("read_steps", "[1, 2]", "must be a JSON object, got list"),
        ("read_steps", '{"start": 1, "end": ', "not valid JSON"),
        ("search", {"pattern": "step ("}, "is not a valid regular expression"),
        ("search", {"pattern": ""}, "pattern must be a non-empty string"),
        ("search", {"pattern": "a" * 501}, "at most 500"),
        ("search", {"pattern": "x", "max_hits": 0}, "max_hits must be an integer from 1 to 50, got 0"),
        ("search", {"max_hits": 3}, "search: missing pattern; search takes pattern, max_hits (optional)"),
        ("list_roles", {"agent": "Planner"}, "list_roles: unknown agent; list_roles takes no arguments"),
        (
            "open_file",
            {"path": "/etc/passwd"},
            "unknown tool 'open_file'; the tools are read_steps, search and",
        ),
    ],
)
def test_bad_calls_become_errors_that_say_what_is_valid(name: str, arguments: Any, expected: str) -> None:
    reader = TrajectoryReader(trajectory())
    result = reader.run(call(name, arguments))
    assert result.error is not None and expected in result.error
    assert result.content == f"Error: {result.error}"
    assert (result.steps, result.text_read) == ((), "")
    assert reader.steps_read == set()


def test_non_json_arguments_show_an_example() -> None:
    result = TrajectoryReader(trajectory()).run(call("read_steps", "start=1, end=2"))
    assert result.error is not None
    assert result.error.startswith(
        "the arguments of read_steps are not valid JSON (Expecting value at character 0)"
    )
    assert '{"start": 0, "end": 5}' in result.error


# ------------------------------------------------------------------------------------------ the ledger


def words(start: int, stop: int) -> str:
    return " ".join(f"w{i}" for i in range(start, stop))


def test_ledger_counts_tokens_not_covered_by_a_seen_13_gram() -> None:
    # W(k) is the 13-gram wk..w(k+12).
    ledger = EvidenceLedger()
    assert ledger.add(words(0, 20)) == 20  # all new; remembers W(0)..W(7)
    assert ledger.add(words(0, 20)) == 0  # read again: every token lies in a seen 13-gram
    # Overlaps the first read by 10 tokens, fewer than 13: no window of it was seen, all 20 are new.
    assert ledger.add(words(10, 30)) == 20  # remembers W(10)..W(17)
    # w5..w26 then w100: W(5)..W(7) cover w5..w19 and W(10)..W(14) cover w10..w26; W(8), W(9) and the last
    # window (w15..w26 w100) are unseen, but only w100 lies in unseen windows alone.
    assert ledger.add(words(5, 27) + " w100") == 1
    assert ledger.total == 41


def test_ledger_counts_repeats_within_one_text() -> None:
    ledger = EvidenceLedger()
    block = words(0, 13)
    # The second copy's 13-gram was seen earlier in the same text; the 12 windows straddling the seam are new.
    assert ledger.add(block + " " + block) == 13


def test_ledger_counts_short_texts_whole_once() -> None:
    ledger = EvidenceLedger()
    assert ledger.add("HTTP 503 from the archive") == 5
    assert ledger.add("HTTP  503 from the\narchive") == 0  # same tokens, other whitespace
    assert ledger.add("HTTP 503") == 2
    assert ledger.add("") == 0
    assert ledger.total == 7


# -------------------------------------------------------------------------------------------- the tool loop

ANSWER = json.dumps({"reason": "503", "responsible_role": "WebSurfer", "root_step": 2})


def calls_reply(*calls: ToolCall) -> Reply:
    return Reply(text="", parsed=None, parse_error=None, finish_reason="tool_calls", tool_calls=calls)


async def converse(
    llm: ScriptedLLM, *, max_tool_calls: int = 24, ledger: EvidenceLedger | None = None
) -> Any:
    reader = TrajectoryReader(trajectory())
    turn = await converse_with_tools(
        llm,
        [Message("system", "judge"), Message("user", "find the root cause")],
        reader=reader,
        ledger=ledger or EvidenceLedger(),
        stage="attribution",
        max_tokens=500,
        schema={"type": "object"},
        temperature=0.0,
        reasoning=None,
        max_tool_calls=max_tool_calls,
    )
    return turn, reader


async def test_tool_loop_runs_every_call_answers_every_id_and_returns_the_answer() -> None:
    llm = ScriptedLLM(
        [
            calls_reply(call("read_steps", {"start": 3, "end": 12}, "a"), call("list_roles", "{}", "b")),
            calls_reply(call("read_steps", {"start": 1, "end": 2}, "c")),
            ANSWER,
        ]
    )
    turn, reader = await converse(llm)
    assert (turn.calls, turn.tool_calls, turn.capped) == (3, 3, False)
    assert turn.reply.text == ANSWER
    assert [r["tool_choice"] for r in llm.requests] == [None, None, None]
    assert all(r["tools"] == reader.tool_specs() for r in llm.requests)
    roles = [(m.role, m.tool_call_id) for m in turn.messages]
    assert roles == [
        ("system", None),
        ("user", None),
        ("assistant", None),
        ("tool", "a"),
        ("tool", "b"),
        ("assistant", None),
        ("tool", "c"),
        ("assistant", None),
    ]
    assert turn.messages[2].tool_calls == llm.requests[1]["messages"][2].tool_calls
    assert turn.messages[3].content.startswith("Error: steps 3..12 are outside the log")
    assert turn.messages[-1] == Message("assistant", ANSWER)
    assert [(e["name"], e["error"] is not None, e["steps"], e["executed"]) for e in turn.tool_log] == [
        ("read_steps", True, [], True),
        ("list_roles", False, [], True),
        ("read_steps", False, [1, 2], True),
    ]
    assert turn.tool_log[0]["arguments"] == '{"start": 3, "end": 12}'
    assert turn.tool_log[2]["result_chars"] == len(turn.messages[6].content)
    expected_tokens = len(CONTENTS[1].split()) + len(CONTENTS[2].split())
    assert turn.evidence_tokens == turn.tool_log[2]["evidence_tokens"] == expected_tokens
    assert reader.steps_read == {1, 2}


async def test_evidence_is_deduplicated_across_turns_through_the_shared_ledger() -> None:
    ledger = EvidenceLedger()
    read_again = [calls_reply(call("read_steps", {"start": 1, "end": 2})), ANSWER]
    first, _ = await converse(ScriptedLLM(list(read_again)), ledger=ledger)
    second, _ = await converse(ScriptedLLM(list(read_again)), ledger=ledger)
    assert first.evidence_tokens > 0
    assert second.evidence_tokens == 0
    assert ledger.total == first.evidence_tokens


async def test_a_runaway_model_hits_the_cap_and_the_turn_ends_capped() -> None:
    numbers = iter(range(100))

    def always_tools(request: dict[str, Any]) -> Reply:
        return calls_reply(
            call("read_steps", {"start": 0, "end": 0}, f"r{next(numbers)}"),
            call("search", {"pattern": "archive"}, f"r{next(numbers)}"),
        )

    llm = ScriptedLLM(always_tools)
    turn, _ = await converse(llm, max_tool_calls=3)
    assert (turn.calls, turn.tool_calls, turn.capped) == (3, 3, True)
    assert [r["tool_choice"] for r in llm.requests] == [None, None, "none"]
    final_request = llm.requests[2]["messages"]
    assert final_request[-1].role == "user" and "used all 3 tool calls" in final_request[-1].content
    refused = [m for m in final_request if m.role == "tool" and m.content.startswith("Not run")]
    assert [m.tool_call_id for m in refused] == ["r3"]
    asked = [c.id for m in final_request if m.role == "assistant" for c in m.tool_calls]
    answered = [m.tool_call_id for m in final_request if m.role == "tool"]
    assert asked == answered == ["r0", "r1", "r2", "r3"]
    assert [e["executed"] for e in turn.tool_log] == [True, True, True, False]
    assert turn.tool_log[3]["error"] == "tool-call budget exhausted"
    # The capped reply's calls are never answered, so they are not left in the conversation handed back.
    assert turn.messages[-1] == Message("assistant", "")
    assert turn.reply.tool_calls


async def test_a_model_that_answers_once_told_to_is_not_capped() -> None:
    llm = ScriptedLLM([calls_reply(call("list_roles", "{}", "a"), call("list_roles", "{}", "b")), ANSWER])
    turn, _ = await converse(llm, max_tool_calls=2)
    assert (turn.calls, turn.tool_calls, turn.capped) == (2, 2, False)
    assert llm.requests[1]["tool_choice"] == "none"
    assert turn.reply.text == ANSWER


async def test_the_cap_must_allow_one_call() -> None:
    with pytest.raises(ValueError, match="max_tool_calls"):
        await converse(ScriptedLLM([ANSWER]), max_tool_calls=0)
