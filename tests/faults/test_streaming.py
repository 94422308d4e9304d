"""Long calls against a server of the tests' own that streams as OpenAI's chat-completions protocol does.

The server (`faults.hostile.Stream`, `Flood`) is not rcarun's simulator: it writes server-sent events from the
published chunk format, bills every token it sends, and keeps its own log. Each test runs a real sweep and reads
results.db beside that log: a generation longer than the silence deadline arrives whole; one that stalls is cut by
it, stored with what arrived and charged; a server that refuses to stream is remembered; an endless answer is cut
at the size cap with bounded memory; a 64,000-token answer at 60 tokens/s (in time scaled by 1/1000) needs one
attempt. Times are scaled down; the assertions are on counts and stored values, never on speed.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from faults.conftest import (
    MODEL,
    Child,
    backbone,
    item_statuses,
    run_in_process,
    sweep_args,
    write_dataset,
    write_sweep,
)
from faults.hostile import HostileServer, Prices, Request, db_rows, flood, ok, status, stream
from rcarun.cli import main as cli_main
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import load_sweep_config, run_sweep

# A dollar a token, both ways: any charge shows.
PRICES = {"input_per_mtok": 1e6, "output_per_mtok": 1e6}
# Both transports read streams under the same deadlines and caps; the cases that exercise the reading run on each.
TRANSPORTS = pytest.mark.parametrize("transport", ["aiohttp", "openai-sdk"])


def _config(
    tmp_path: Path, dataset: Path, url: str, *, stages: dict[str, Any] | None = None, **settings: Any
) -> Path:
    config = write_sweep(
        tmp_path / "sweep.toml",
        dataset=dataset,
        backbones={"b": backbone(url, prices=PRICES, **settings)},
    )
    for stage, table in (stages or {}).items():
        lines = [f"{key} = {json.dumps(value)}" for key, value in table.items()]
        config.write_text(config.read_text() + f"\n[stages.{stage}]\n" + "\n".join(lines) + "\n")
    return config


def _calls(db: Path) -> list[dict[str, Any]]:
    return [dict(row) for row in db_rows(db, "SELECT * FROM calls ORDER BY call_id")]


def _body(db: Path, sha: str | None) -> dict[str, Any]:
    assert sha is not None
    (row,) = db_rows(db, "SELECT text FROM blobs WHERE sha256 = ?", (sha,))
    return dict(json.loads(row[0]))


@TRANSPORTS
def test_a_generation_longer_than_the_silence_deadline_streams_to_its_end(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path, transport: str
) -> None:
    # 60 thinking tokens 20 ms apart and the answer after: over a second, under a 0.3-s silence deadline.
    server = serve(stream(thinking=60, interval_s=0.02), prices=Prices(**PRICES))
    db = tmp_path / "results.db"
    config = _config(tmp_path, dataset(1), server.base_url, timeout_s=0.3, transport=transport)
    outcome = run_in_process(config, db, "long")

    assert outcome.status == "finished"
    (call,) = _calls(db)
    (served,) = server.chat_log()
    assert (call["status"], call["attempt"], call["streamed"], call["usage_source"]) == (
        "ok",
        1,
        1,
        "reported",
    )
    assert call["latency_ms"] > 3 * 300  # far longer than the silence deadline
    assert (call["prompt_tokens"], call["completion_tokens"]) == (
        served.billed_prompt_tokens,
        served.billed_completion_tokens,
    )
    assert call["cost_usd"] == pytest.approx(served.billed_usd)
    assert 0 < call["ttft_ms"] < call["latency_ms"] / 3
    # One token every 20 ms: about 50 a second (loose: the server's sleeps run late, never early).
    assert 10 < call["decode_tokens_per_s"] <= 55
    stored = _body(db, call["response_sha256"])
    assert stored["id"] == served.completion_id and stored["object"] == "chat.completion"
    assert stored["choices"][0]["message"]["reasoning_content"] == "think " * 60
    assert json.loads(stored["choices"][0]["message"]["content"])["root_step"] == 0


def test_the_same_generation_unstreamed_is_cut_by_the_silence_deadline_and_charged_its_budget(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    # Asked for one body, the answer comes after its whole generation: silence longer than the deadline.
    server = serve(stream(thinking=60, interval_s=0.02), prices=Prices(**PRICES))
    db = tmp_path / "results.db"
    config = _config(
        tmp_path, dataset(1), server.base_url, timeout_s=0.3, stream=False, retry={"cut_retries": 0}
    )
    run_in_process(config, db, "long")

    (call,) = _calls(db)
    assert (call["status"], call["error_kind"], call["streamed"]) == ("error", "silence_timeout", None)
    # Cut after it was sent: the provider may have generated the whole budget, and is charged so.
    assert call["usage_source"] == "estimated"
    assert call["completion_tokens"] == call["max_tokens"] and call["prompt_tokens"] > 0
    assert call["cost_usd"] == pytest.approx(call["prompt_tokens"] + call["completion_tokens"])
    assert item_statuses(db) == {"failed": 1}


def test_a_stream_that_stalls_is_cut_by_the_silence_deadline_stored_partial_and_charged(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    server = serve(stream(thinking=40, stall_after=25, interval_s=0.005), prices=Prices(**PRICES))
    db = tmp_path / "results.db"
    config = _config(tmp_path, dataset(1), server.base_url, timeout_s=0.4, retry={"cut_retries": 1})
    child = Child(sweep_args(config, db, "stall"), cwd=tmp_path)
    result = child.wait()

    assert result.returncode == 4, result.describe()  # an item failed for good
    calls = _calls(db)
    log = server.chat_log()
    # The cut generation was sent once more (cut_retries = 1), and no more: each attempt paid.
    assert [c["attempt"] for c in calls] == [1, 2] and len(log) == 2
    for call, served in zip(calls, log, strict=True):
        assert (call["status"], call["error_kind"], call["streamed"]) == ("error", "silence_timeout", 1)
        assert call["usage_source"] == "estimated"
        # At least what the server billed for the tokens it sent; the prompt charged as reserved.
        assert call["completion_tokens"] >= served.billed_completion_tokens == 25
        assert call["prompt_tokens"] >= served.billed_prompt_tokens
        assert call["cost_usd"] >= served.billed_usd > 0
        partial = _body(db, call["response_sha256"])
        assert partial["id"] == served.completion_id
        assert partial["choices"][0]["message"]["reasoning_content"] == "think " * 25
        assert partial["choices"][0]["finish_reason"] is None
        assert call["ttft_ms"] > 0
    (summary,) = db_rows(db, "SELECT cost_usd FROM run_summary")
    assert summary[0] == pytest.approx(sum(c["cost_usd"] for c in calls))
    # Said once for the backbone, with what the run does about it.
    said = [line for line in result.stderr_lines() if "a generation was cut" in line]
    assert len(said) == 1 and "sent again up to 1 time" in said[0] and "silence_timeout" in said[0]
    events = db_rows(db, "SELECT detail_json FROM run_events WHERE kind = 'generation_cut'")
    assert len(events) == 1 and json.loads(events[0][0])["cause"] == "silence_timeout"


@TRANSPORTS
def test_a_stream_dropped_mid_answer_is_stored_partial_and_charged(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path, transport: str
) -> None:
    server = serve(stream(thinking=40, drop_after=12), prices=Prices(**PRICES))
    db = tmp_path / "results.db"
    config = _config(tmp_path, dataset(1), server.base_url, retry={"cut_retries": 0}, transport=transport)
    run_in_process(config, db, "drop")

    (call,) = _calls(db)
    (served,) = server.chat_log()
    assert (call["status"], call["error_kind"], call["usage_source"]) == (
        "error",
        "transport_error",
        "estimated",
    )
    assert call["completion_tokens"] >= served.billed_completion_tokens == 12
    assert _body(db, call["response_sha256"])["choices"][0]["message"]["reasoning_content"] == "think " * 12


def _refuses_streaming(request: Request) -> Any:
    if isinstance(request.body, dict) and request.body.get("stream"):
        body = {
            "error": {
                "message": "streaming is not supported",
                "type": "invalid_request_error",
                "param": "stream",
            }
        }
        return status(400, body=body, kind="refused_stream")
    return ok()


@TRANSPORTS
def test_a_server_that_refuses_to_stream_is_asked_unstreamed_from_then_on(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path, transport: str
) -> None:
    server = serve(_refuses_streaming)
    db = tmp_path / "results.db"
    config = _config(tmp_path, dataset(4), server.base_url, limits={"concurrency": 1}, transport=transport)
    result = Child(sweep_args(config, db, "refused"), cwd=tmp_path).wait()

    assert result.returncode == 0, result.describe()
    kinds = [entry.kind for entry in server.chat_log()]
    assert kinds == ["refused_stream", "ok", "ok", "ok", "ok"]
    assert item_statuses(db) == {"done": 4}
    refused = [c for c in _calls(db) if c["error_kind"] == "stream_refused"]
    assert len(refused) == 1 and refused[0]["http_status"] == 400 and refused[0]["cost_usd"] == 0
    assert {c["streamed"] for c in _calls(db) if c["status"] == "ok"} == {0}
    said = [line for line in result.stderr_lines() if "refuses to stream" in line]
    assert len(said) == 1 and "'b'" in said[0]
    assert len(db_rows(db, "SELECT 1 FROM run_events WHERE kind = 'stream_refused'")) == 1


def test_stream_false_sends_no_stream_field(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    seen: list[Any] = []

    def remember(request: Request) -> Any:
        seen.append(request.body)
        return ok()

    server = serve(remember)
    run_in_process(_config(tmp_path, dataset(1), server.base_url, stream=False), tmp_path / "r.db", "plain")
    assert len(seen) == 1 and "stream" not in seen[0] and "stream_options" not in seen[0]
    run_in_process(_config(tmp_path, dataset(1), server.base_url), tmp_path / "s.db", "streamed")
    assert seen[1]["stream"] is True and seen[1]["stream_options"] == {"include_usage": True}


@TRANSPORTS
@pytest.mark.parametrize("sse", [True, False], ids=["event-stream", "json-body"])
def test_an_endless_answer_ends_at_the_size_cap_with_bounded_memory(
    serve: Callable[..., HostileServer],
    dataset: Callable[..., Path],
    tmp_path: Path,
    sse: bool,
    transport: str,
) -> None:
    server = serve(flood(sse=sse), lifetime_s=120)
    db = tmp_path / "results.db"
    config = _config(
        tmp_path,
        dataset(2),
        server.base_url,
        max_response_mb=8,
        limits={"concurrency": 2},
        transport=transport,
    )
    args = [sys.executable, "-m", "rcarun.cli", *sweep_args(config, db, "flood")]
    peak_kb = 0
    with (tmp_path / "out").open("wb") as out:
        child = subprocess.Popen(args, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        # The child's own high-water mark (VmHWM of its address space since exec), read until it exits: its
        # rusage would include the memory of the process it was forked from.
        while child.poll() is None:
            peak_kb = max(peak_kb, _high_water_kb(child.pid))
            if time.monotonic() > deadline:
                child.send_signal(signal.SIGKILL)
                child.wait()
                pytest.fail("rcarun sweep hung on an endless answer")
            time.sleep(0.01)
    peak_mb = peak_kb / 1024
    assert child.returncode == 4, (tmp_path / "out").read_text()[-2000:]
    calls = _calls(db)
    # Each answer refused at the cap, not sent again (the next would be as endless), charged as cut.
    assert [c["error_kind"] for c in calls] == ["response_too_large"] * 2
    assert all(c["usage_source"] == "estimated" and c["cost_usd"] > 0 for c in calls)
    assert item_statuses(db) == {"failed": 2}
    # Two responses of 8 MiB at most, on top of the sweep's own ~80 MB: nowhere near what arrived unbounded.
    assert 30 < peak_mb < 250, f"peak RSS {peak_mb:.0f} MB"


def _high_water_kb(pid: int) -> int:
    try:
        status_text = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # gone already
        return 0
    for line in status_text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0  # a zombie has no address space left


@pytest.mark.slow
def test_a_64000_token_answer_at_60_tokens_a_second_needs_one_attempt(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    # Time scaled by 1/1000: 64,000 tokens at 60 a second take 1,067 s; here 1.07 s, 64 tokens a millisecond
    # (a gap of 16.7 us a token, as 16.7 ms is at full scale), under the default deadlines scaled alike: 600 s
    # of silence (0.6 s) and max_call_s 10,800 s (10.8 s).
    tokens = 64_000
    server = serve(stream(thinking=tokens, batch=64, interval_s=0.001 * 64 / 60), prices=Prices(**PRICES))
    db = tmp_path / "results.db"
    config = _config(
        tmp_path,
        dataset(1),
        server.base_url,
        timeout_s=0.6,
        max_call_s=10.8,
        stages={"attribution": {"max_tokens": 65_536}},
    )
    outcome = run_in_process(config, db, "long")

    assert outcome.status == "finished"
    (call,) = _calls(db)
    (served,) = server.chat_log()
    assert (call["attempt"], call["status"], call["usage_source"]) == (1, "ok", "reported")
    assert call["completion_tokens"] == served.billed_completion_tokens > tokens
    assert call["latency_ms"] > 1_000
    assert call["cost_usd"] == pytest.approx(served.billed_usd)


@pytest.mark.slow
def test_ctrl_c_mid_stream_keeps_what_arrived_and_charges_it(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    # Five seconds of thinking; Ctrl-C a second in; the drain (2 s) ends before the answer would.
    server = serve(stream(thinking=500, interval_s=0.01), prices=Prices(**PRICES))
    db = tmp_path / "results.db"
    child = Child(sweep_args(_config(tmp_path, dataset(1), server.base_url), db, "interrupted"), cwd=tmp_path)
    assert server.wait_for(lambda log: bool(log) and log[0].status == 200, timeout_s=30)
    time.sleep(1.0)
    child.send(signal.SIGINT)
    result = child.wait()

    assert result.returncode == 130, result.describe()
    (call,) = _calls(db)
    (served,) = server.chat_log()
    assert (call["status"], call["streamed"], call["usage_source"]) == ("cancelled", 1, "estimated")
    assert call["error"] == "cancelled while the answer was arriving"
    # Charged for the tokens that had arrived (the server billed them as it sent them).
    assert 50 < call["completion_tokens"] < 500 and call["cost_usd"] > 0
    assert call["completion_tokens"] >= served.billed_completion_tokens - 256  # the log bills every 256
    thinking = _body(db, call["response_sha256"])["choices"][0]["message"]["reasoning_content"]
    assert thinking == "think " * (len(thinking) // 6) and len(thinking) // 6 >= 50
    assert item_statuses(db) == {"interrupted": 1}


@pytest.mark.slow
def test_a_15_second_generation_streams_under_a_5_second_silence_deadline(
    serve: Callable[..., HostileServer], dataset: Callable[..., Path], tmp_path: Path
) -> None:
    """The case at full scale: 150 thinking tokens 0.1 s apart under ``timeout_s = 5``."""
    server = serve(stream(thinking=150, interval_s=0.1), prices=Prices(**PRICES))
    db = tmp_path / "results.db"
    run_in_process(_config(tmp_path, dataset(1), server.base_url, timeout_s=5), db, "long")

    (call,) = _calls(db)
    (served,) = server.chat_log()
    assert (call["status"], call["attempt"], call["streamed"]) == ("ok", 1, 1)
    assert call["latency_ms"] > 15_000
    assert call["completion_tokens"] == served.billed_completion_tokens


def test_the_simulator_streams_through_a_sweep(tmp_path: Path) -> None:
    """The shipped simulator, through a real sweep: every answer streamed and timed."""

    async def run() -> None:
        config = MockConfig(model=MODEL, latency_s=0.01, latency_per_token_s=0.001, reasoning_tokens=20)
        async with MockServer(config, host="127.0.0.1", port=0) as server:
            sweep = _config(tmp_path, write_dataset(tmp_path / "data", 2), server.base_url)
            await run_sweep(
                load_sweep_config(sweep), db_path=tmp_path / "r.db", run_name="sim", show_progress=False
            )

    asyncio.run(run())
    calls = _calls(tmp_path / "r.db")
    assert len(calls) == 2
    assert all(c["status"] == "ok" and c["streamed"] == 1 and c["ttft_ms"] > 0 for c in calls)
    assert all(c["decode_tokens_per_s"] is not None and c["decode_tokens_per_s"] > 0 for c in calls)


def test_a_streamed_call_reads_like_a_whole_one_in_calls_text_show_and_the_cache(
    dataset: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same answers from the same simulator, streamed and not: calls_text, ``rcarun show`` and a cache hit
    read them alike."""
    data = dataset(3)

    async def sweep(db: Path, run: str, **settings: Any) -> None:
        config = MockConfig(model=MODEL, latency_s=0.0, reasoning_tokens=12, seed=3)
        async with MockServer(config, host="127.0.0.1", port=0) as server:  # a fresh one each: the same ids
            path = _config(tmp_path, data, server.base_url, **settings)
            path.write_text(path.read_text().replace("[sweep]\n", '[sweep]\ncache = "db"\n', 1))
            await run_sweep(load_sweep_config(path), db_path=db, run_name=run, show_progress=False)

    streamed, whole = tmp_path / "streamed.db", tmp_path / "whole.db"
    asyncio.run(sweep(streamed, "s"))
    asyncio.run(sweep(whole, "w", stream=False))

    def texts(db: Path) -> list[tuple[Any, ...]]:
        return [
            tuple(row) for row in db_rows(db, "SELECT qid, answer, reasoning FROM calls_text ORDER BY qid")
        ]

    assert {row[0] for row in db_rows(streamed, "SELECT streamed FROM calls")} == {1}
    assert {row[0] for row in db_rows(whole, "SELECT streamed FROM calls")} == {0}
    assert texts(streamed) == texts(whole) and all(
        answer and thinking for _, answer, thinking in texts(whole)
    )

    shown = []
    for db in (streamed, whole):
        assert cli_main(["show", "--db", str(db), "--call", "1", "--json"]) == 0
        call = json.loads(capsys.readouterr().out)["call"]
        shown.append((call["answer"], call["reasoning"], call["prompt"]))
    assert shown[0] == shown[1]

    # A second run in the streamed file is served by the call cache: the stored completion replays as the answer.
    asyncio.run(sweep(streamed, "again"))
    again = db_rows(
        streamed, "SELECT c.status FROM calls c JOIN runs r USING (run_id) WHERE r.name = 'again'"
    )
    assert [row[0] for row in again] == ["cached"] * 3
    predictions = db_rows(
        streamed,
        "SELECT r.name, p.qid, p.pred_role, p.pred_step FROM predictions p JOIN runs r USING (run_id) ORDER BY p.qid",
    )
    by_run: dict[str, list[tuple[Any, ...]]] = {}
    for name, qid, role, step in predictions:
        by_run.setdefault(name, []).append((qid, role, step))
    assert by_run["again"] == by_run["s"] and len(by_run["s"]) == 3
