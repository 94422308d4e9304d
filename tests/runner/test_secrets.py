"""A planted API key reaches the provider's Authorization header and nowhere else: not results.db, not logs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from helpers.sweeps import make_config, rows
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import run_sweep

PLANTED = "sk-" + "test-PLANTED-0123456789abcdefghij"  # split: no key-shaped literal in the tree


def _files_contain(directory: Path, needle: bytes) -> list[Path]:
    return [path for path in directory.rglob("*") if path.is_file() and needle in path.read_bytes()]


async def test_planted_key_never_reaches_results_db_or_logs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("RCARUN_TEST_KEY", PLANTED)
    db = tmp_path / "results.db"
    async with (
        MockServer(MockConfig(latency_s=0.01, api_key=PLANTED)) as good,
        MockServer(MockConfig(latency_s=0.01, api_key="a-different-key")) as wrong,
    ):
        config = make_config(
            {
                "good": {"base_url": good.base_url, "api_key_env": "RCARUN_TEST_KEY"},
                "wrong": {"base_url": wrong.base_url, "api_key_env": "RCARUN_TEST_KEY"},
            }
        )
        outcome = await run_sweep(config, db_path=db, run_name="secret", show_progress=False)

    assert outcome.counters["good"].items_done == 10
    # A wrong key stops its backbone after three refusals in a row; its items wait for a resume, none failed.
    assert outcome.counters["wrong"].items_failed == 0
    assert outcome.status == "stopped"
    errors = rows(db, "SELECT DISTINCT error_kind, http_status FROM calls WHERE backbone = 'wrong'")
    assert errors == [("auth_error", 401)]
    assert _files_contain(tmp_path, PLANTED.encode()) == []
    captured = capsys.readouterr()
    assert PLANTED not in captured.out + captured.err
    assert PLANTED not in caplog.text
    # The config stored with the run names the variable, never its value.
    config_json = rows(db, "SELECT config_json FROM runs")[0][0]
    assert "RCARUN_TEST_KEY" in config_json and PLANTED not in config_json
