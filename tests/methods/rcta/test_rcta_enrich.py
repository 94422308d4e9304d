"""RCTA step enrichment: the nine-rule action order, exit codes, success, verifier signals, hashes, handoffs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from rcarun.data import Step, Trajectory, load_trajectory_file, natural_sort_key
from rcarun.methods.rcta.enrich import (
    EnrichedStep,
    compute_step_hash,
    enrich,
    enrich_step,
    infer_success,
    parse_exit_code,
)


def _one(agent: str, content: str, role: str = "assistant", index: int = 0) -> EnrichedStep:
    return enrich_step(Step(index=index, agent=agent, role=role, content=content))


# --- action_type, rule by rule and in order ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("agent", "role", "content", "expected"),
    [
        # 1. user-role human: message, even with a fenced bash block in the text.
        ("human", "user", "Please fix it.\n```bash\nls\n```", "message"),
        # 2. user-role terminal: observation, even with a python fence and finish(.
        ("Computer_terminal", "user", "exitcode: 0\n```python\nfinish()\n```", "observation"),
        ("ComputerTerminal", "user", "output", "observation"),
        # Rules 1-2 need the chat role "user": a terminal speaking as assistant falls through to content.
        ("Computer_terminal", "assistant", "```bash\nls\n```", "bash"),
        ("human", "human", "plain task text", "message"),
        # 3. a delegate target beats the verifier class and finish(.
        ("JudgeAgent (-> ActionAgent)", "assistant", "finish(done)", "delegate"),
        ("DiagnostAgent (-> ActionAgent)", "assistant", "```python\nx\n```", "delegate"),
        # 4. verifier class: judge, before finish( and fences.
        ("JudgeAgent", "assistant", "finish()\n```bash\nls\n```", "judge"),
        ("DataVerification_Expert", "assistant", "looks right", "judge"),
        # 5. finish( with a word boundary, optional space, any case; before fences.
        ("ActionAgent", "assistant", "call finish(message='ok')\n```bash\nls\n```", "finish"),
        ("ActionAgent", "assistant", "FINISH (reason)", "finish"),
        ("ActionAgent", "assistant", "refinish(the table)", "message"),
        # 6. bash/sh/shell fences, before python.
        ("ActionAgent", "assistant", "```sh\nls\n```\n```python\nx\n```", "bash"),
        ("ActionAgent", "assistant", "``` shell\nls\n```", "bash"),
        ("ActionAgent", "assistant", "```BASH\nls\n```", "bash"),
        ("ActionAgent", "assistant", "```shellcheck\nx\n```", "message"),
        # 7. python fences.
        ("Coder", "assistant", "```python\nprint(1)\n```", "python"),
        ("Coder", "assistant", "```py\nprint(1)\n```", "message"),
        # 8. <think> with under 80 characters outside the closed blocks.
        ("ActionAgent", "assistant", "<think>" + "r" * 500 + "</think>\n" + "o" * 79, "thinking"),
        ("ActionAgent", "assistant", "<think>" + "r" * 500 + "</think>\n" + "o" * 80, "message"),
        ("ActionAgent", "assistant", "<think>a</think> x <THINK>b</THINK>", "thinking"),
        ("ActionAgent", "assistant", "<think>" + "r" * 200, "message"),
        # 9. otherwise message.
        ("WebSurfer", "assistant", "I clicked the link.", "message"),
        ("Orchestrator", "Orchestrator (thought)", "", "message"),
    ],
)
def test_action_type(agent: str, role: str, content: str, expected: str) -> None:
    assert _one(agent, content, role=role).action_type == expected


# --- exit code and success ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("exit code: 1", 1),
        ("Exit Code = 0", 0),
        ("exit_code=2", 2),
        ("exitcode: 1 (execution failed)\nCode output: Traceback", 1),  # AG2's Computer_terminal form
        ("EXITCODE:0", 0),
        ("return code: -9", -9),
        ("returncode = 3", 3),
        ("return_code: 4", 4),
        ("Process exited with code 137", 137),
        ("exited  with   code -1", -1),
        # The first pattern wins even when "exited with code" comes first.
        ("exited with code 5, then exit code: 2", 2),
        # Two matches of the first pattern: the first one.
        ("exit code: 7 ... exit code: 8", 7),
        # No separator, no number, nothing: None.
        ("exit code 1", None),
        ("exit code: n/a", None),
        ("all good", None),
    ],
)
def test_exit_code_variants(content: str, expected: int | None) -> None:
    assert parse_exit_code(content) == expected
    assert _one("Computer_terminal", content, role="user").exit_code == expected


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("exitcode: 0\nError: printed by the test itself", True),  # the exit code decides first
        ("exitcode: 1", False),
        ("Traceback (most recent call last):", False),
        ("fatal: not a git repository", False),
        ("1 FAIL, 2 ok", False),
        ("raised an Exception here", False),
        ("TypeError: bad operand", None),  # "Error" must be a whole word
        ("no error here", None),  # case-sensitive tokens
        ("", None),
    ],
)
def test_success(content: str, expected: bool | None) -> None:
    assert infer_success(parse_exit_code(content), content) is expected
    assert _one("ActionAgent", content).success is expected


# --- verifier signal ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("agent", "content", "expected"),
    [
        ("JudgeAgent", "VERDICT: PASS", "PASS"),
        ("JudgeAgent", "verdict = fail", "FAIL"),
        ("JudgeAgent", "VERIFY:PASS", "PASS"),
        ("Verification_Expert", "The verification succeeded... verification success", "PASS"),
        ("verifier_agent", "Verification failed: budget exceeded", "FAIL"),
        ("Computer_terminal", "All tests passed", "PASS"),
        ("Computer_terminal", "AssertionError: 3 != 4", "FAIL"),
        # FAIL phrases are tested before PASS phrases.
        ("Computer_terminal", "12 tests passed, 1 test failed", "FAIL"),
        ("JudgeAgent", "VERDICT: PASS (earlier: VERDICT: FAIL)", "FAIL"),
        # A verifier or terminal step without a phrase has no signal.
        ("JudgeAgent", "I will check the patch.", None),
        # Other classes never carry a signal, whatever they say.
        ("ActionAgent", "VERDICT: FAIL, tests failed", None),
        ("DiagnostAgent", "All tests passed", None),
        ("human", "tests passed", None),
        ("SomeoneElse", "tests passed", None),
    ],
)
def test_verifier_signal(agent: str, content: str, expected: str | None) -> None:
    assert _one(agent, content).verifier_signal == expected


# --- handoffs, classes, text fields ---------------------------------------------------------------------


def test_delegate_target_from_name_from_role_and_name_first() -> None:
    from_name = _one("DiagnostAgent (-> ActionAgent)", "do it")
    assert (from_name.delegate_target, from_name.role_class, from_name.agent_raw) == (
        "ActionAgent",
        "planner",
        "DiagnostAgent (-> ActionAgent)",
    )
    from_role = enrich_step(Step(0, "Orchestrator", "Orchestrator (-> WebSurfer)", "search"))
    assert (from_role.delegate_target, from_role.action_type, from_role.role_class) == (
        "WebSurfer",
        "delegate",
        "planner",
    )
    assert enrich_step(Step(0, "A (-> B)", "Orchestrator (-> C)", "")).delegate_target == "B"
    assert enrich_step(Step(0, "Orchestrator", "Orchestrator (thought)", "")).delegate_target is None
    assert _one("Task_Planner (→ Action_Expert)", "").delegate_target == "Action_Expert"
    assert _one("ActionAgent", "transfer to JudgeAgent").delegate_target is None


def test_role_class_uses_the_paper_list() -> None:
    # The release's default profile calls these unknown; App. H does not.
    assert [
        _one(name, "").role_class for name in ("Orchestrator", "WebSurfer", "manager_agent", "Coder")
    ] == [
        "planner",
        "executor",
        "planner",
        "executor",
    ]
    assert _one("ComputerTerminal", "").role_class == "terminal"
    assert _one("Nobody", "").role_class == "unknown"


def test_head_tail_and_length() -> None:
    content = "".join(chr(ord("a") + i % 26) for i in range(1200))
    step = _one("ActionAgent", content)
    assert (step.head, step.tail, step.content_len) == (content[:500], content[700:], 1200)
    assert step.content == content and step.role == "assistant"
    short = _one("ActionAgent", "x" * 500)
    assert (len(short.head), short.tail) == (500, "")
    just_over = _one("ActionAgent", "y" + "x" * 500)
    assert (just_over.head, just_over.tail) == ("y" + "x" * 499, "x" * 500)
    assert _one("ActionAgent", "é" * 3).content_len == 3  # code points, not bytes


def test_step_hash_layout() -> None:
    # Pinned: sha1(b"3|DiagnostAgent (-> ActionAgent)|Run the tests.|")[:16]; the tail is empty under 201 chars.
    assert compute_step_hash(3, "DiagnostAgent (-> ActionAgent)", "Run the tests.") == "03e6c7579fc0cc07"
    content = "a" * 200 + "MIDDLE" + "z" * 200
    expected = hashlib.sha1(f"7|ActionAgent|{'a' * 200}|{'z' * 200}".encode()).hexdigest()[:16]
    assert compute_step_hash(7, "ActionAgent", content) == expected == "9ff564fcb1a4e5bb"
    assert _one("ActionAgent", content, index=7).step_hash == expected


def test_step_hash_sees_id_name_and_ends_but_not_the_middle() -> None:
    base = "a" * 200 + "MIDDLE" + "z" * 200
    reference = compute_step_hash(7, "ActionAgent", base)
    assert compute_step_hash(7, "ActionAgent", base.replace("MIDDLE", "other")) == reference
    assert compute_step_hash(8, "ActionAgent", base) != reference
    assert compute_step_hash(7, "JudgeAgent", base) != reference
    assert compute_step_hash(7, "ActionAgent", "b" + base[1:]) != reference
    assert compute_step_hash(7, "ActionAgent", base[:-1] + "y") != reference
    assert len(reference) == 16 and int(reference, 16) >= 0
    assert len(compute_step_hash(0, "x", "\ud800")) == 16  # a lone surrogate is replaced, not an error


def test_enrich_keeps_order_and_ids() -> None:
    steps = (
        Step(0, "human", "user", "Fix the failing test."),
        Step(1, "DiagnostAgent (-> ActionAgent)", "assistant", "Run pytest."),
        Step(2, "ActionAgent", "assistant", "```bash\npytest\n```"),
        Step(3, "Computer_terminal", "user", "exit code: 1\n2 tests failed"),
        Step(4, "JudgeAgent", "assistant", "VERDICT: FAIL"),
        Step(5, "ActionAgent", "assistant", "finish('gave up')"),
    )
    enriched = enrich(Trajectory("q", "swe_bench_pro", "task", steps, "0" * 64))
    assert [s.step_id for s in enriched] == [0, 1, 2, 3, 4, 5]
    assert [s.action_type for s in enriched] == [
        "message",
        "delegate",
        "bash",
        "observation",
        "judge",
        "finish",
    ]
    assert [s.verifier_signal for s in enriched] == [None, None, None, "FAIL", "FAIL", None]
    assert [s.exit_code for s in enriched] == [None, None, None, 1, None, None]
    assert [s.success for s in enriched] == [None, None, None, False, False, None]  # "FAIL" is an error token
    assert enrich(Trajectory("e", "s", "", (), "0" * 64)) == ()


# --- Who&When hand_crafted ------------------------------------------------------------------------------------


def test_who_and_when_hand_crafted_delegates_match_handoffs(who_and_when: Path) -> None:
    files = sorted((who_and_when / "hand_crafted").glob("*.json"), key=lambda p: natural_sort_key(p.name))
    assert len(files) == 20
    n_steps = n_delegates = 0
    recipients: set[str] = set()
    for file in files:
        trajectory = load_trajectory_file(file, "hand_crafted").trajectory
        enriched = enrich(trajectory)
        assert [s.step_id for s in enriched] == list(range(trajectory.n_steps))
        for step, rich in zip(trajectory.steps, enriched, strict=True):
            expected = step.handoff.recipient if step.handoff is not None else None
            assert rich.delegate_target == expected
            assert (rich.action_type == "delegate") == (expected is not None)
            assert rich.agent_raw == step.agent and rich.role == step.role
            n_delegates += expected is not None
            recipients.update([expected] if expected is not None else [])
        n_steps += trajectory.n_steps
    assert (n_steps, n_delegates) == (1135, 260)
    assert recipients == {"WebSurfer", "Assistant", "FileSurfer", "ComputerTerminal"}
