"""An answer that came back is recorded even when its item is cancelled before the session is done with it.

The session lets a freed slot's next call go out before it records the finished attempt (two turns of the
loop); a cancellation delivered in between must not lose the row of an answer the provider charged for.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from helpers.sweeps import make_config, rows
from rcarun.backends import Backend, BackendSettings, CallProgress, ChatRequest, ChatResult, create_backend
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import run_sweep


class _CancelsItsCallerOnce:
    """The real backend, except that the first answer is handed back to a task already told to cancel."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self.cancelled: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    async def chat(self, request: ChatRequest, progress: CallProgress | None = None) -> ChatResult:
        result = await self._backend.chat(request, progress)
        if not self.cancelled:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()  # delivered at the session's next await: after the answer, before its row
            self.cancelled.append(result.text)
        return result


async def test_an_answer_whose_item_is_cancelled_right_after_it_is_still_recorded(tmp_path: Path) -> None:
    wrappers: list[_CancelsItsCallerOnce] = []

    def factory(settings: BackendSettings) -> Backend:
        wrapper = _CancelsItsCallerOnce(create_backend(settings))
        wrappers.append(wrapper)
        return wrapper  # type: ignore[return-value]

    db = tmp_path / "r.db"
    async with MockServer(MockConfig(latency_s=0.001)) as server:
        config = make_config({"sim": {"base_url": server.base_url}})
        await run_sweep(config, db_path=db, run_name="x", show_progress=False, backend_factory=factory)
        accepted = server.stats().accepted

    assert len(wrappers[0].cancelled) == 1
    assert rows(db, "SELECT count(*) FROM calls WHERE status = 'ok'") == [(accepted,)]
    assert rows(db, "SELECT status, count(*) FROM items GROUP BY status ORDER BY status") == [
        ("done", 9),
        ("interrupted", 1),
    ]
