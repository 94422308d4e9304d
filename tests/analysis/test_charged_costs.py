"""`charged_costs`: a run's paid calls per backbone × method, a shared request charged to one method by order."""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from pathlib import Path

import pytest

from rcarun.analysis import charged_costs, resolve_run
from rcarun.methods import registered_methods
from rcarun.store import open_store

_RCTA = ["rcta", "rcta/no-a1", "rcta/no-a2", "rcta/no-a3", "rcta/no-a4"]


def _charged(db: Path, order: list[str]) -> dict[tuple[str, str], tuple[int, int, float]]:
    with open_store(db) as store:
        run = resolve_run(store, None)
        costs = charged_costs(store, run.run_id, order)
    return {key: (c.prompt_tokens, c.completion_tokens, c.cost_usd) for key, c in costs.items()}


def _shared_calls(db: Path) -> dict[str, tuple[set[str], int]]:
    """Per cache key that several methods used: the methods, and the prompt tokens its paid attempts cost."""
    with sqlite3.connect(db) as connection:
        rows = connection.execute("SELECT cache_key, method, status, prompt_tokens FROM calls").fetchall()
    users: dict[str, set[str]] = defaultdict(set)
    paid: dict[str, int] = defaultdict(int)
    for key, method, status, prompt in rows:
        users[key].add(method)
        if status != "cached":
            paid[key] += prompt
    return {key: (methods, paid[key]) for key, methods in users.items() if len(methods) > 1}


def test_every_paid_token_is_charged_once_whatever_the_order(demo_db: Path) -> None:
    with sqlite3.connect(demo_db) as connection:
        prompt, completion, usd = connection.execute(
            "SELECT sum(prompt_tokens), sum(completion_tokens), sum(cost_usd) FROM calls WHERE status != 'cached'"
        ).fetchone()
    for order in (list(registered_methods()), list(reversed(registered_methods()))):
        charged = _charged(demo_db, order)
        assert sum(c[0] for c in charged.values()) == prompt
        assert sum(c[1] for c in charged.values()) == completion
        assert sum(c[2] for c in charged.values()) == pytest.approx(usd)


def test_a_shared_request_is_charged_to_the_first_method_in_the_order(demo_db: Path) -> None:
    shared = _shared_calls(demo_db)
    assert any(methods <= set(_RCTA) for methods, _ in shared.values()), "the RCTA conditions share Stage I"
    first = _charged(demo_db, _RCTA)
    last = _charged(demo_db, list(reversed(_RCTA)))
    # First in the order, rcta pays for every request it shared; last, for none of them.
    rcta_first = sum(v[0] for (_, method), v in first.items() if method == "rcta")
    rcta_last = sum(v[0] for (_, method), v in last.items() if method == "rcta")
    assert (
        rcta_first - rcta_last == sum(prompt for methods, prompt in shared.values() if "rcta" in methods) > 0
    )
