"""The sweep says what happened: exit status, the cause of failures, backbones stopped early, the next command.

Each case drives `rcarun sweep` as a child process against the hostile server and asserts the exit status, the
line that names the cause, and the rows in results.db. Exit statuses: 0 every item has a prediction, 3 stopped
early and resumable, 4 items failed for good, 2 config/data/store unusable.
"""

from __future__ import annotations

import shlex
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from faults.conftest import (
    backbone,
    child_environment,
    item_statuses,
    run_cli,
    sweep_args,
    write_sweep,
)
from faults.hostile import HostileServer, Reply, Request, db_rows, ok, status

ITEMS = 8


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_server_that_is_down_stops_its_backbone_fast_and_leaves_every_item_for_a_resume(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    good = serve(ok())
    config = write_sweep(
        tmp_path / "sweep.toml",
        dataset=dataset(ITEMS),
        backbones={"down": backbone(f"http://127.0.0.1:{_free_port()}/v1"), "good": backbone(good.base_url)},
    )
    db = tmp_path / "results.db"
    result = run_cli(sweep_args(config, db, "down"), cwd=tmp_path)

    assert result.returncode == 3, result.describe()
    told = [line for line in result.stderr_lines() if "backbone 'down' stopped" in line]
    assert len(told) == 1 and "could not connect" in told[0] and "is the server up" in told[0], result.stderr
    assert "failed" not in item_statuses(db, "down"), (
        "a server that is down fails no item: they wait for a resume"
    )
    assert item_statuses(db, "good") == {"done": ITEMS}, "the other backbone goes on"
    attempts = int(
        __import__("sqlite3")
        .connect(db)
        .execute("SELECT count(*) FROM calls WHERE backbone = 'down'")
        .fetchone()[0]
    )
    assert attempts <= 8 + 4, f"{attempts} attempts on a server that is down (stops after 8 in a row)"
    assert "stopped early: backbone 'down' stopped" in result.stdout
    assert "resume with: rcarun sweep" in result.stdout


@pytest.mark.parametrize(
    ("reply", "cause", "advice"),
    [
        (status(401, body={"error": {"message": "Incorrect API key provided"}}), "HTTP 401", "$HOSTILE_KEY"),
        (
            status(429, body={"error": {"message": "You exceeded your quota", "code": "insufficient_quota"}}),
            "quota",
            "out of credit",
        ),
        (status(404, body={"error": {"message": "The model `x` does not exist"}}), "HTTP 404", "check model"),
    ],
    ids=["wrong-key", "no-quota", "no-such-model"],
)
def test_what_will_not_heal_stops_the_backbone_after_a_handful_of_calls(
    reply: Reply,
    cause: str,
    advice: str,
    serve: Callable[..., HostileServer],
    dataset: Callable[..., Path],
    tmp_path: Path,
) -> None:
    server = serve(reply)
    config = write_sweep(
        tmp_path / "sweep.toml",
        dataset=dataset(20),
        backbones={"fx": backbone(server.base_url, api_key_env="HOSTILE_KEY")},
    )
    db = tmp_path / "results.db"
    result = run_cli(
        sweep_args(config, db, "heal"),
        cwd=tmp_path,
        env=child_environment(HOSTILE_KEY="sk-not-a-real-key-000"),
    )
    assert result.returncode == 3, result.describe()
    sent = len(server.chat_log())
    assert sent <= 3 + 4, f"{sent} requests for 20 items: it should stop after 3 refusals in a row"
    told = [line for line in result.stderr_lines() if "backbone 'fx' stopped" in line]
    assert len(told) == 1 and cause in told[0].replace("QuotaExhausted", "quota") and advice in told[0], (
        result.stderr
    )
    assert "failed" not in item_statuses(db), "a backbone-wide refusal fails no item for good"


@pytest.mark.slow
def test_items_that_fail_for_good_exit_4_with_their_cause_and_the_retry_command(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    def policy(request: Request) -> Reply:
        # Half the items ask for something this server refuses (400): a failure of those items, not the backbone.
        if "task number 1" in str(request.body) or "task number 3" in str(request.body):
            return status(400, body={"error": {"message": "Unsupported parameter in this request"}})
        return ok()

    server = serve(policy)
    config = write_sweep(
        tmp_path / "sweep.toml", dataset=dataset(4), backbones={"fx": backbone(server.base_url)}
    )
    db = tmp_path / "results.db"
    result = run_cli(sweep_args(config, db, "fails"), cwd=tmp_path)

    assert result.returncode == 4, result.describe()
    assert item_statuses(db) == {"done": 2, "failed": 2}
    assert "failed items by cause" in result.stdout, result.stdout
    assert "BadRequest (HTTP 400): fx: HTTP 400: Unsupported parameter in this request" in result.stdout, (
        result.stdout
    )
    assert "--retry-failed" in result.stdout

    server.policy = ok()
    again = run_cli(sweep_args(config, db, "fails"), cwd=tmp_path)
    assert again.returncode == 4, "a resume without --retry-failed leaves them failed, and says so"
    retried = run_cli(sweep_args(config, db, "fails", "--retry-failed"), cwd=tmp_path)
    assert retried.returncode == 0, retried.describe()
    assert item_statuses(db) == {"done": 4}


def test_answers_with_prose_or_thinking_before_the_json_are_read(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    server = serve(
        ok(around=("<think>the second agent slipped</think>\nHere is my answer: ", " Hope it helps."))
    )
    config = write_sweep(
        tmp_path / "sweep.toml", dataset=dataset(3), backbones={"fx": backbone(server.base_url)}
    )
    db = tmp_path / "results.db"
    result = run_cli(sweep_args(config, db, "prose"), cwd=tmp_path)
    assert result.returncode == 0, result.describe()
    rows = (
        __import__("sqlite3")
        .connect(db)
        .execute("SELECT role_valid, step_valid, error FROM predictions")
        .fetchall()
    )
    assert rows == [(1, 1, None)] * 3


def test_a_budget_stop_says_which_budget_the_spend_and_how_to_go_on(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    server = serve(ok())
    config = write_sweep(
        tmp_path / "sweep.toml",
        dataset=dataset(10),
        backbones={
            "fx": backbone(
                server.base_url,
                limits={"concurrency": 1},
                prices={"input_per_mtok": 1000, "output_per_mtok": 20},
            )
        },
        budget={"max_usd": 2.0},
    )
    db = tmp_path / "results.db"
    result = run_cli(sweep_args(config, db, "budget"), cwd=tmp_path)
    assert result.returncode == 3, result.describe()
    told = [line for line in result.stderr_lines() if "budget reached on backbone 'fx'" in line]
    assert len(told) == 1 and "run USD budget would be exceeded: spent $" in told[0], result.stderr
    assert "skipped when a budget was reached" in result.stdout and "resume with:" in result.stdout
    kinds = [row[0] for row in __import__("sqlite3").connect(db).execute("SELECT kind FROM run_events")]
    assert "budget_stop" in kinds


def test_a_slice_runs_only_what_it_names_and_the_full_run_resumes_it(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    one, two = serve(ok()), serve(ok())
    config = write_sweep(
        tmp_path / "sweep.toml",
        dataset=dataset(5),
        backbones={"one": backbone(one.base_url), "two": backbone(two.base_url)},
        methods=["all-at-once", "step-by-step"],
    )
    db = tmp_path / "results.db"
    smoke = run_cli(
        sweep_args(config, db, "slice", "--limit", "2", "--backbone", "one", "--method", "all-at-once"),
        cwd=tmp_path,
    )
    assert smoke.returncode == 0, smoke.describe()
    assert item_statuses(db) == {"done": 2} and not two.chat_log()
    first_requests = len(one.chat_log())

    unknown = run_cli(sweep_args(config, db, "slice", "--backbone", "three"), cwd=tmp_path)
    assert (
        unknown.returncode == 2
        and "--backbone three: not in the sweep (backbones: one, two)" in unknown.stderr
    )

    full = run_cli(sweep_args(config, db, "slice"), cwd=tmp_path)
    assert full.returncode == 0, full.describe()
    assert item_statuses(db) == {"done": 20}
    # The smoke run's answers were kept: its two items were not asked again.
    assert len(one.chat_log()) - first_requests == len(two.chat_log()) - 2


def test_unreadable_answers_are_stored_as_such_and_fallbacks_say_they_decided(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    server = serve(ok(content="I don't know the answer to that."))
    config = write_sweep(
        tmp_path / "sweep.toml",
        dataset=dataset(3),
        backbones={"fx": backbone(server.base_url)},
        methods=["all-at-once", "binary-search"],
    )
    db = tmp_path / "results.db"
    result = run_cli(sweep_args(config, db, "prose"), cwd=tmp_path)
    # Every item has a prediction, but not one answer could be read: a status of its own, not success.
    assert result.returncode == 5, result.describe()
    assert "backbone 'fx': not one of its 6 answers could be read" in result.stdout
    rows = {
        (method, error is not None, fallback is not None)
        for method, error, fallback in __import__("sqlite3")
        .connect(db)
        .execute("SELECT method, error, fallback FROM predictions")
    }
    assert rows == {("all-at-once", True, False), ("binary-search", True, True)}
    assert "6 predictions come from answers that could not be read" in result.stdout

    report = run_cli(["report", "--db", str(db), "--run", "prose", "--json"], cwd=tmp_path)
    assert report.returncode == 0, report.describe()
    outcomes = __import__("json").loads(report.stdout)["outcomes"]
    by_method = {entry["method"]: entry for entry in outcomes}
    assert by_method["all-at-once"]["invalid"] == 3 and by_method["binary-search"]["fallback"] == 3


def test_a_key_refused_fewer_times_than_stop_a_backbone_still_says_why_items_are_left(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    # A one-item smoke run meets the wrong key once: too few refusals to stop the backbone, one too many to hide.
    server = serve(status(401, body={"error": {"message": "Incorrect API key provided"}}))
    config = write_sweep(
        tmp_path / "sweep.toml",
        dataset=dataset(1),
        backbones={"fx": backbone(server.base_url, api_key_env="HOSTILE_KEY")},
    )
    db = tmp_path / "results.db"
    run = "smoke <1> $(x) 'q'"  # a name a shell would redirect, substitute and unquote
    result = run_cli(
        sweep_args(config, db, run), cwd=tmp_path, env=child_environment(HOSTILE_KEY="sk-not-a-real-key-000")
    )
    assert result.returncode == 3, result.describe()
    resume = next(line for line in result.stdout.splitlines() if line.startswith("resume with: "))
    assert shlex.split(resume.removeprefix("resume with: ")) == [
        *("rcarun", "sweep", "--config", str(config), "--db", str(db), "--run", run)
    ]
    said = [line for line in result.stdout.splitlines() if line.startswith("stopped early:")]
    assert len(said) == 1 and "HTTP 401" in said[0] and "check the key in $HOSTILE_KEY" in said[0], (
        result.describe()
    )
    assert sum("HTTP 401" in line for line in result.stderr_lines()) == 1, result.stderr
    events = db_rows(db, "SELECT kind FROM run_events WHERE kind = 'items_left'")
    assert len(events) == 1
    assert item_statuses(db) == {"interrupted": 1}


def test_a_run_exits_0_when_some_answers_of_each_backbone_could_be_read(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    def policy(request: Request) -> Reply:
        return ok(content="no idea") if "task number 0" in str(request.body) else ok()

    server = serve(policy)
    config = write_sweep(
        tmp_path / "sweep.toml", dataset=dataset(3), backbones={"fx": backbone(server.base_url)}
    )
    db = tmp_path / "results.db"
    result = run_cli(sweep_args(config, db, "mixed"), cwd=tmp_path)
    assert result.returncode == 0, result.describe()
    assert "1 predictions come from answers that could not be read" in result.stdout
    assert "not one of its" not in result.stdout
