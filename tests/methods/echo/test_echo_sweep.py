"""ECHO through a real sweep against rcarun's simulator, read back from the requests results.db stores.

Three LongRCA records padded to 10, 170 and 700 steps (issue 36, item 2): by default every analyst reads the
per-target contexts (L1-L4 around each target, the global milestones once), every step a target on the short log
and evenly spaced targets on the long ones, at k calls per trajectory; ``context = "whole-log"`` still shows every
step in full at k calls.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from helpers.longrca import write_padded
from helpers.sweeps import make_config, rows
from rcarun.data import iter_dataset
from rcarun.methods.echo import spread_steps
from rcarun.methods.echo.targets import GLOBAL_HEADER, target_block_header
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import run_sweep
from rcarun.store import open_store

# (source, steps): one source per length, so that each record keeps its own id.
RECORDS = (("swe_bench_pro", 10), ("travelplanner", 170), ("webarena_verified", 700))
FILLER_CHARS = 440  # a padded step of about 440 characters: 700 steps are about 300,000 characters
ANALYSTS = 3


async def _sweep(data: Path, db: Path) -> None:
    methods = [
        {"name": "echo"},
        {"name": "echo", "label": "echo/whole-log", "options": {"context": "whole-log"}},
        {"name": "echo", "label": "echo/decoupled", "options": {"decoupled": True}},
    ]
    async with MockServer(MockConfig(latency_s=0.001)) as server:
        config = make_config({"sim": {"base_url": server.base_url}}, dataset=data, methods=methods)
        outcome = await run_sweep(config, db_path=db, run_name="echo", show_progress=False)
    assert outcome.status == "finished"


@pytest.fixture(scope="module")
def sweep_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One sweep of ``echo`` (per-target), ``echo/whole-log`` and ``echo/decoupled`` over the three records."""
    root = tmp_path_factory.mktemp("echo_sweep")
    data = root / "data"
    for source, n_steps in RECORDS:
        write_padded(data, source, n_steps, FILLER_CHARS)
    db = root / "results.db"
    asyncio.run(_sweep(data, db))
    return db, data


def _user_prompts(db: Path, method: str, qid: str) -> list[str]:
    """The user message of every analyst request of ``method`` on ``qid``, in call order, from the stored blobs."""
    shas = rows(
        db,
        "SELECT request_sha256 FROM calls WHERE method = ? AND qid = ? AND stage = 'analyst' ORDER BY call_id",
        (method, qid),
    )
    with open_store(db) as store:
        bodies = [json.loads(store.read_blob(sha)) for (sha,) in shas]
    return [next(m["content"] for m in body["messages"] if m["role"] == "user") for body in bodies]


def _log(user: str) -> str:
    return user.split("=== LOG START ===\n", 1)[1].split("\n=== LOG END ===", 1)[0]


def _blocks(log: str) -> dict[int, str]:
    """Each target's block of the per-target document, by target step."""
    parts = re.split(r"^(?==== Context of target step \d+ )", log, flags=re.MULTILINE)
    return {int(part.split()[5]): part for part in parts[1:]}


def _steps(block: str, tag: str) -> list[int]:
    return [int(step) for step in re.findall(rf"^\[step (\d+) \| {tag}\]", block, flags=re.MULTILINE)]


def _records(data: Path) -> dict[int, tuple[str, list[tuple[str, str]]]]:
    """By length: the record's qid and its steps as (agent, content)."""
    found = {}
    for record in iter_dataset(data):
        trajectory = record.trajectory
        found[trajectory.n_steps] = (trajectory.qid, [(s.agent, s.content) for s in trajectory.steps])
    assert sorted(found) == [n for _, n in RECORDS]
    return found


@pytest.mark.parametrize("n_steps", [n for _, n in RECORDS])
def test_every_analyst_reads_each_targets_l1_to_l4_at_k_calls(
    sweep_db: tuple[Path, Path], n_steps: int
) -> None:
    db, data = sweep_db
    qid, steps = _records(data)[n_steps]
    users = _user_prompts(db, "echo", qid)
    assert len(users) == ANALYSTS  # k calls, whatever the length
    log = _log(users[0])
    assert all(_log(user) == log for user in users)  # the whole panel reads the same contexts
    assert len(log) <= 100_000

    # The global context: every step once, as its milestone.
    global_part = log.split("\n\n", 1)[0]
    assert global_part.splitlines()[0] == GLOBAL_HEADER
    assert _steps(global_part, "L4 milestone") == list(range(n_steps))

    blocks = _blocks(log)
    targets = sorted(blocks)
    if n_steps == 10:
        assert targets == list(range(10))  # every step is a target
        assert "(every step is a target)" in users[0]
    else:
        assert 1 < len(targets) < n_steps and targets == spread_steps(n_steps, len(targets))
        assert f"({len(targets)} evenly spaced target steps: " in users[0]
    for target, block in blocks.items():
        agent, content = steps[target]
        assert block.startswith(target_block_header(target, agent))
        for title in ("L1 immediate", "L2 local", "L3 distant", "L4 global"):
            assert f"\n{title} " in block
        # L1: the target and its neighbours in full.
        assert f"[step {target} | target] {agent}: {content}\n" in block + "\n"
        for neighbour in (target - 1, target + 1):
            if 0 <= neighbour < n_steps:
                agent_n, content_n = steps[neighbour]
                assert f"[step {neighbour}] {agent_n}: {content_n}\n" in block + "\n"
        # L2 and L3: the steps two to three and four to six away, reduced.
        near = [target + d for d in (-3, -2, 2, 3) if 0 <= target + d < n_steps]
        distant = [target + d for d in (-6, -5, -4, 4, 5, 6) if 0 <= target + d < n_steps]
        assert _steps(block, "L2 key decision") == near
        assert _steps(block, "L3 outcome") == distant
        # L4: the other steps, named by range and shown as milestones in the global context.
        far_before, far_after = target - 7, target + 7
        l4 = block.split("\nL4 global (the other steps): ", 1)[1]
        if far_before >= 0:
            assert l4.startswith(f"step {far_before}" if far_before == 0 else f"steps 0-{far_before}")
        if far_after < n_steps:
            assert f"{far_after}-{n_steps - 1}" in l4 or f"step {far_after}," in l4
        if far_before < 0 and far_after >= n_steps:
            assert l4.startswith("none")


@pytest.mark.parametrize("n_steps", [n for _, n in RECORDS])
def test_decoupled_costs_two_calls_per_analyst(sweep_db: tuple[Path, Path], n_steps: int) -> None:
    db, data = sweep_db
    qid, _ = _records(data)[n_steps]
    users = _user_prompts(db, "echo/decoupled", qid)
    assert len(users) == 2 * ANALYSTS
    assert [("Concentrate on WHO" in u, "Concentrate on WHERE" in u) for u in users] == [
        (True, False),
        (False, True),
    ] * ANALYSTS


@pytest.mark.parametrize("n_steps", [n for _, n in RECORDS])
def test_the_whole_log_option_shows_every_step_in_full_at_k_calls(
    sweep_db: tuple[Path, Path], n_steps: int
) -> None:
    db, data = sweep_db
    qid, steps = _records(data)[n_steps]
    users = _user_prompts(db, "echo/whole-log", qid)
    assert len(users) == ANALYSTS
    log = _log(users[0])
    assert all(_log(user) == log for user in users)
    shown = [int(step) for step in re.findall(r"^\[step (\d+)\] ", log, flags=re.MULTILINE)]
    assert shown == list(range(n_steps))
    assert "| L" not in log and "| target]" not in log  # no reduced line, no target block
    # In full at every length: 700 steps hold about 327,000 characters, over the 100,000 cap, but no step is
    # longer than the 1,000 characters below which contents are never cut, so nothing can be cut.
    assert log == "\n".join(f"[step {i}] {agent}: {content}" for i, (agent, content) in enumerate(steps))
