"""How many call rows per second the results.db writer sustains, each call bringing its own 2 KB blobs.

A sweep's hot path enqueues one call row plus its request and response blobs per attempt; if the writer could
not keep up, its bounded queue would push back on the calls themselves. This measures that ceiling on the local
disk, from the first enqueue to the last commit.

Usage: ``.venv/bin/python benchmarks/store_writer.py [--calls 20000] [--blob-bytes 2048] [--batch-size 500]``
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

from rcarun.store import CallRow, StoreWriter, open_store

_VOCABULARY = (
    "agent planner coder tool call failed because the step returned an error while the orchestrator "
    "assigned task verify output root cause trajectory role step"
)


def _text_blob(rng: random.Random, size: int) -> bytes:
    """Prompt-like text: random words, so it compresses like real prompts rather than like zeros or noise."""
    vocabulary = _VOCABULARY.split()
    words: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(vocabulary)
        words.append(word)
        length += len(word) + 1
    return " ".join(words).encode()[:size]


async def _write(
    db_path: Path, run_id: int, calls: int, blobs: list[tuple[bytes, bytes]], batch_size: int
) -> None:
    async with StoreWriter(db_path, run_id, batch_size=batch_size) as writer:
        for index, (request, response) in enumerate(blobs):
            await writer.wait_for_room()
            request_sha = writer.put_blob(request)
            response_sha = writer.put_blob(response)
            writer.add_call(
                CallRow(
                    run_id=run_id,
                    item_id=f"bb|all-at-once|q{index // 4}|r{index % 4}",
                    backbone="bb",
                    model="model",
                    method="all-at-once",
                    qid=f"q{index // 4}",
                    realization=index % 4,
                    stage="attribution",
                    attempt=1,
                    max_tokens=1024,
                    status="ok",
                    started_at="2025-01-01T00:00:00.000Z",
                    ended_at="2025-01-01T00:00:01.000Z",
                    finish_reason="stop",
                    prompt_tokens=600,
                    completion_tokens=200,
                    cost_usd=0.0004,
                    latency_ms=812.5,
                    cache_key=f"key{index}",
                    request_sha256=request_sha,
                    response_sha256=response_sha,
                    response_text_sha256=response_sha,
                )
            )
        assert len(blobs) == calls


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--blob-bytes", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=500)
    arguments = parser.parse_args()

    rng = random.Random(0)
    # Unique request and response per call: the worst case for dedupe, generated before the clock starts.
    blobs = [
        (_text_blob(rng, arguments.blob_bytes), _text_blob(rng, arguments.blob_bytes))
        for _ in range(arguments.calls)
    ]
    with tempfile.TemporaryDirectory() as directory:
        db_path = Path(directory) / "results.db"
        with open_store(db_path) as store:
            run_id = store.get_or_create_run("bench", "{}")
        started = time.perf_counter()
        asyncio.run(_write(db_path, run_id, arguments.calls, blobs, arguments.batch_size))
        elapsed_s = time.perf_counter() - started
        with open_store(db_path) as store:
            stored_calls = store.connection.execute("SELECT count(*) FROM calls").fetchone()[0]
            stored_blobs = store.connection.execute("SELECT count(*) FROM blobs").fetchone()[0]
        size_mb = sum(path.stat().st_size for path in Path(directory).iterdir()) / 1e6
    assert stored_calls == arguments.calls and stored_blobs == 2 * arguments.calls
    print(
        f"{arguments.calls} call rows + {2 * arguments.calls} blobs of {arguments.blob_bytes} B "
        f"(batch {arguments.batch_size}) in {elapsed_s:.2f} s: "
        f"{arguments.calls / elapsed_s:,.0f} call rows/s, {3 * arguments.calls / elapsed_s:,.0f} rows/s in all; "
        f"results.db + WAL {size_mb:.1f} MB"
    )


if __name__ == "__main__":
    main()
