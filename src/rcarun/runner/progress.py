"""One tqdm bar per backbone (items, calls, tokens streamed, USD, 429s, length retries), read from the counters
twice a second rather than updated per call, so the display costs nothing on the hot path."""

from __future__ import annotations

import asyncio
import contextlib
import sys

from tqdm import tqdm

from rcarun.runner.runtime import BackboneRuntime
from rcarun.text import terminal_safe

__all__ = ["ProgressBoard", "postfix"]

_REFRESH_S = 0.5


def postfix(runtime: BackboneRuntime) -> str:
    """What a backbone's bar says after its count of items."""
    counters = runtime.counters
    # Spend comes from the ledger the budgets are checked against (earlier sessions of the run included).
    spent = runtime.gate.ledger.totals(runtime.name)
    streaming = runtime.in_flight
    streamed = counters.streamed_tokens + sum(progress.tokens for progress in streaming)
    text = (
        f"calls={spent.calls} fly={len(streaming)} streamed={streamed:,} cached={counters.cached_calls} "
        f"tok={spent.total_tokens:,} ${spent.usd:.4f} 429={counters.rate_limited} len={counters.length_retries} "
        f"err={counters.errors} fail={counters.items_failed}"
    )
    if counters.cut_calls:
        text += f" cut={counters.cut_calls}"
    return text


class ProgressBoard:
    def __init__(self, runtimes: dict[str, BackboneRuntime], *, enabled: bool) -> None:
        self._runtimes = runtimes
        self._enabled = enabled
        self._bars: dict[str, tqdm] = {}
        self._done = asyncio.Event()
        width = max((len(name) for name in runtimes), default=8)
        if enabled:
            for position, (name, runtime) in enumerate(runtimes.items()):
                self._bars[name] = tqdm(
                    total=runtime.counters.items_total,
                    initial=runtime.counters.items_finished_before,
                    desc=terminal_safe(name).ljust(width),
                    unit="item",
                    position=position,
                    leave=True,
                    disable=None,  # no bars when stderr is not a terminal (CI logs, pipes)
                    file=sys.stderr,
                    dynamic_ncols=True,
                    mininterval=_REFRESH_S,
                )

    def _refresh(self) -> None:
        for name, bar in self._bars.items():
            counters = self._runtimes[name].counters
            finished = (
                counters.items_finished_before
                + counters.items_done
                + counters.items_failed
                + counters.items_skipped_budget
                + counters.items_interrupted
            )
            bar.n = min(finished, bar.total or finished)
            bar.set_postfix_str(postfix(self._runtimes[name]), refresh=False)
            bar.refresh()

    async def run(self) -> None:
        if not self._enabled:
            return
        while not self._done.is_set():
            self._refresh()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._done.wait(), _REFRESH_S)

    def finish(self) -> None:
        if self._enabled:
            self._refresh()
            for bar in self._bars.values():
                bar.close()
        self._done.set()
