"""A process that streams rows through a StoreWriter forever, for the crash test to SIGKILL mid-stream.

Every row carries a global sequence number (its enqueue position) so the test can check that what survived the
kill is exactly a prefix of what was enqueued. Usage: ``python crash_writer.py DB RUN_ID``.
"""

from __future__ import annotations

import asyncio
import json
import sys

from rcarun.store import CallRow, EventRow, PredictionRow, StoreWriter

READY_AFTER_ITEMS = 300


async def stream(db_path: str, run_id: int) -> None:
    sequence = 0
    async with StoreWriter(
        db_path, run_id, batch_size=250, flush_interval_s=0.002, max_queued_rows=1_500
    ) as writer:
        item = 0
        while True:
            qid = f"q{item}"
            item_id = f"bb|m|{qid}|r0"
            await writer.wait_for_room()
            prompt_sha = writer.put_blob(f"prompt for item {item}: ".encode() * 40)
            writer.add_call(
                CallRow(
                    run_id=run_id,
                    item_id=item_id,
                    backbone="bb",
                    model="model",
                    method="m",
                    qid=qid,
                    realization=0,
                    stage="attribution",
                    attempt=1,
                    max_tokens=256,
                    status="ok",
                    started_at="2025-01-01T00:00:00.000Z",
                    cache_key=f"seq{sequence}",
                    request_sha256=prompt_sha,
                )
            )
            sequence += 1
            writer.add_prediction(
                PredictionRow(
                    run_id=run_id,
                    item_id=item_id,
                    backbone="bb",
                    method="m",
                    qid=qid,
                    realization=0,
                    pred_role="r",
                    pred_step=0,
                    role_valid=True,
                    step_valid=True,
                    abstained=False,
                    output_json=json.dumps({"seq": sequence}),
                )
            )
            sequence += 1
            writer.add_event(EventRow(run_id, "progress", json.dumps({"seq": sequence})))
            sequence += 1
            item += 1
            if item == READY_AFTER_ITEMS:
                await writer.flush()
                print("ready", flush=True)
            if item % 20 == 0:
                await asyncio.sleep(0)  # let the writer task take batches while we keep producing


if __name__ == "__main__":
    asyncio.run(stream(sys.argv[1], int(sys.argv[2])))
