"""The simulator as a process: `MockProcess` and the ``python -m rcarun.mock`` command line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import aiohttp
import pytest

from rcarun.mock import MockConfig, MockProcess, MockStartError
from rcarun.mock.cli import build_parser, config_from_args, main


async def test_mock_process_starts_serves_and_stops() -> None:
    config = MockConfig(latency_s=0.0, rpm=60, api_key="sk-process-key", model="proc-model")
    async with MockProcess(config) as mock:
        pid = mock.pid
        assert mock.base_url == f"http://127.0.0.1:{mock.port}/v1"
        # The key travels in the environment, never on the command line.
        assert "sk-process-key" not in " ".join(Path(f"/proc/{pid}/cmdline").read_text().split("\0"))
        body = {"model": "proc-model", "messages": [{"role": "user", "content": "hi"}]}
        headers = {"Authorization": "Bearer sk-process-key"}
        async with aiohttp.ClientSession() as http:
            for expected in (200, 429):
                async with http.post(
                    mock.base_url + "/chat/completions", json=body, headers=headers
                ) as response:
                    assert response.status == expected
        stats = await mock.astats()
        assert (stats.requests_total, stats.accepted, stats.rejected_429) == (2, 1, 1)
        await mock.areset()
        assert mock.stats().requests_total == 0
    assert not mock.running
    with pytest.raises(ProcessLookupError):  # exited and reaped
        os.kill(pid, 0)


def test_mock_process_reports_a_child_that_cannot_start() -> None:
    with pytest.raises(MockStartError, match="refusing to listen"), MockProcess(host="192.0.2.1"):
        pass


def test_cli_refuses_hosts_that_are_not_loopback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--host", "0.0.0.0"]) == 2
    assert "loopback" in capsys.readouterr().err
    assert main(["--config-json", '{"rpm": 10, "colour": "red"}']) == 2
    assert "colour" in capsys.readouterr().err


def test_cli_flags_override_the_config_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOCK_TEST_KEY", "sk-from-env")
    parser = build_parser()
    args = parser.parse_args(
        [
            "--config-json",
            json.dumps({"rpm": 10, "model": "from-json", "latency_s": 0.5}),
            "--rpm",
            "20",
            "--fault-rate",
            "0.2",
            "--reasoning-tokens",
            "64",
            "--reasoning-field",
            "none",
            "--api-key-env",
            "MOCK_TEST_KEY",
        ]
    )
    config = config_from_args(args)
    assert (config.rpm, config.model, config.latency_s) == (20, "from-json", 0.5)
    assert (config.error_500_rate, config.error_503_rate) == (0.1, 0.1)
    assert (config.reasoning_tokens, config.reasoning_field, config.api_key) == (64, None, "sk-from-env")


def test_config_round_trips_through_json_and_rejects_nonsense() -> None:
    config = MockConfig(rpm=600, rps=10, over_concurrency="queue", usage_style="deepseek", headers="none")
    assert MockConfig.from_json(config.to_json()) == config
    with pytest.raises(ValueError, match="fault rates sum"):
        MockConfig(error_500_rate=0.7, reset_rate=0.6)
    with pytest.raises(ValueError, match="rpm"):
        MockConfig(rpm=0)
    with pytest.raises(ValueError, match="headers"):
        MockConfig.from_mapping({"headers": "anthropic"})
