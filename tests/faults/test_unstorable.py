"""No value a server sends can kill the store writer: every answer served is stored once, every item finishes.

Each kind of answer here holds something SQLite refuses or rcarun cannot take at face value: an integer past 2**63
in the answer (``root_step``), a lone surrogate (an answer cut mid-emoji), usage of 10**20 tokens, ``Infinity``,
negative counts, no usage at all, NUL bytes. The server's log says which answers it served; results.db must hold
exactly one ok/length row for each (joined by the completion id in the stored raw body), a prediction for every
item, and estimated usage where the reported one is missing or nonsense.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from faults.conftest import (
    CliResult,
    backbone,
    column_names,
    item_statuses,
    run_cli,
    run_status,
    sweep_args,
    write_sweep,
)
from faults.hostile import (
    Answer,
    HostileServer,
    Request,
    answer_row_counts,
    db_rows,
    huge_usage,
    infinite_usage,
    negative_usage,
    no_usage,
    ok,
    stored_calls,
)

BAD: dict[str, Answer] = {
    "hugestep": ok(kind="hugestep", root_step=10**25),
    "surrogate": ok(kind="surrogate", reason="the answer was cut mid-emoji \ud800"),
    "hugeusage": ok(kind="hugeusage", usage=huge_usage(10**20)),
    "infusage": ok(kind="infusage", usage=infinite_usage()),
    "negusage": ok(kind="negusage", usage=negative_usage()),
    "nousage": ok(kind="nousage", usage=no_usage()),
    "nul": ok(kind="nul", around=("\x00```json\n", "\n```\x00"), reason="a NUL \x00 inside"),
}
NONSENSE_USAGE = frozenset({"hugeusage", "infusage", "negusage", "nousage"})
RUN = "unstorable"


def _sweep(
    serve: Callable[..., HostileServer], policy: Callable[[Request], Answer], data: Path, tmp: Path
) -> tuple[HostileServer, Path, Path, CliResult]:
    server = serve(policy)
    config = write_sweep(tmp / "sweep.toml", dataset=data, backbones={"fx": backbone(server.base_url)})
    db = tmp / "results.db"
    result = run_cli(sweep_args(config, db, RUN), cwd=tmp)
    return server, config, db, result


def _check(server: HostileServer, config: Path, db: Path, result: CliResult, items: int, tmp: Path) -> None:
    log = server.chat_log()
    served = [entry for entry in log if entry.served]
    assert result.returncode == 0, f"the sweep did not finish cleanly:\n{result.describe()}"
    assert run_status(db, RUN) == "finished"
    counts = answer_row_counts(log, db)
    assert counts == {1: len(served)}, (
        f"{len(served)} answers served; number of ok/length calls rows per answer -> how many answers: "
        f"{dict(counts)} (0 = paid and lost, 2+ = stored twice)"
    )
    assert item_statuses(db) == {"done": items}, f"items by status: {dict(item_statuses(db))}"
    predictions = db_rows(db, "SELECT COUNT(*) FROM predictions")[0][0]
    assert predictions == items, f"{predictions} predictions for {items} items"

    kinds = {entry.completion_id: entry.kind for entry in served}
    calls = {call.call_id: call for call in stored_calls(db) if call.completion_id in kinds}

    huge = db_rows(
        db,
        "SELECT call_id, prompt_tokens, completion_tokens, reasoning_tokens, cached_tokens FROM calls "
        "WHERE max(prompt_tokens, completion_tokens, reasoning_tokens, cached_tokens) > ?",
        (2**53,),
    )
    assert huge == [], f"token counts above 2**53 stored: {[tuple(row) for row in huge]}"

    hugestep_items = {call.item_id for call in calls.values() if kinds[call.completion_id] == "hugestep"}
    for item_id in hugestep_items:
        pred_step, step_valid = db_rows(
            db, "SELECT pred_step, step_valid FROM predictions WHERE item_id = ?", (item_id,)
        )[0]
        assert (pred_step, step_valid) == (None, 0), f"{item_id}: root_step 10**25 stored as {pred_step!r}"

    assert "usage_source" in column_names(db, "calls"), (
        "calls has no usage_source column ('reported' | 'estimated')"
    )
    sources = {
        row["call_id"]: (row["usage_source"], row["prompt_tokens"])
        for row in db_rows(
            db, "SELECT call_id, usage_source, prompt_tokens FROM calls WHERE status IN ('ok', 'length')"
        )
    }
    wrong = []
    for call_id, call in calls.items():
        kind = kinds[call.completion_id]
        source, prompt_tokens = sources[call_id]
        expected = "estimated" if kind in NONSENSE_USAGE else "reported"
        if source != expected or prompt_tokens <= 0:
            wrong.append(
                f"{kind}: usage_source={source!r} prompt_tokens={prompt_tokens} (expected {expected!r}, > 0)"
            )
    assert wrong == [], "usage recorded wrongly:\n" + "\n".join(wrong)

    # Resume: everything is finished, so nothing is sent.
    requests = len(server.log())
    again = run_cli(sweep_args(config, db, RUN), cwd=tmp)
    assert again.returncode == 0, again.describe()
    assert len(server.log()) == requests, f"the resume sent {len(server.log()) - requests} requests"


@pytest.mark.parametrize("kind", sorted(BAD))
def test_one_bad_kind_among_good_answers(
    kind: str, serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    def policy(request: Request) -> Answer:
        return BAD[kind] if request.seq % 2 == 0 else ok()

    server, config, db, result = _sweep(serve, policy, dataset(8), tmp_path)
    served_kinds = {entry.kind for entry in server.chat_log()}
    assert kind in served_kinds, f"the server never sent {kind}: {served_kinds}"
    _check(server, config, db, result, 8, tmp_path)


def test_mixed_run_one_bad_answer_in_eight(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    kinds = sorted(BAD)

    def policy(request: Request) -> Answer:
        if request.seq % 8:
            return ok(latency_s=0.01)
        return BAD[kinds[(request.seq // 8 - 1) % len(kinds)]]

    server, config, db, result = _sweep(serve, policy, dataset(56), tmp_path)
    assert {entry.kind for entry in server.chat_log()} >= set(kinds)
    _check(server, config, db, result, 56, tmp_path)
