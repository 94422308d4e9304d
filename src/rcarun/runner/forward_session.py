"""The `ForwardModel` a model-reading method (SOAP) receives for one trajectory: cache → pass → record.

What a chat call gets from `rcarun.runner.session.ItemSession` a forward pass gets here, so SOAP sits in
results.db beside the chat methods: every pass is a ``calls`` row (stage ``forward``, or ``forward/<part>`` while
a method prepares; the tokens the pass held, no completion, no USD); the request blob is the segments as JSON,
the response blob a short summary (token counts, array shapes), never the arrays, which `ForwardCache` keeps. A
pass that fails is an ``error`` row and `ForwardPassFailed`, which fails the item, never the sweep.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from rcarun.errors import RcarunError, StopRequested
from rcarun.methods.forward import SegmentStates
from rcarun.runner.local_model import ForwardCache, one_line
from rcarun.runner.runtime import BackboneRuntime, RunContext, WorkItem
from rcarun.store import CallRow, utc_timestamp

if TYPE_CHECKING:
    from rcarun.backends.local import LocalForwardModel

__all__ = ["FORWARD_STAGE", "ForwardPassFailed", "ForwardSession"]

FORWARD_STAGE = "forward"
"""The stage of the passes that answer an item; a preparation's passes are ``forward/<part>``."""


class ForwardPassFailed(RcarunError):
    """A forward pass raised (too long, out of memory, a model error): the item fails with this one line."""


def _pass_key(fingerprint: str, segments: Sequence[str]) -> str:
    """The pass's cache key: a rerun, a resume or another realization of the same model reads its file."""
    document = json.dumps({"model": fingerprint, "segments": list(segments)}, ensure_ascii=False)
    return hashlib.sha256(document.encode()).hexdigest()


class ForwardSession:
    """`rcarun.methods.forward.ForwardModel` for one trajectory, its passes recorded under ``item`` (for a
    preparation's trajectory, its would-be item) and ``stage``; ``fingerprint`` names the model's numbers."""

    def __init__(
        self,
        context: RunContext,
        runtime: BackboneRuntime,
        model: LocalForwardModel,
        *,
        fingerprint: str,
        cache: ForwardCache,
        item: WorkItem,
        stage: str = FORWARD_STAGE,
    ) -> None:
        self._context = context
        self._runtime = runtime
        self._model = model
        self._fingerprint = fingerprint
        self._cache = cache
        self._item = item
        self._stage = stage
        self.name = model.name
        self.context_tokens = model.context_tokens
        self.template_tokens = model.template_tokens
        self.n_layers = model.n_layers
        self.passes = 0
        self.cached = 0

    def count_tokens(self, text: str) -> int:
        return self._model.count_tokens(text)

    async def encode(self, segments: Sequence[str]) -> SegmentStates:
        """One pass over ``segments``, from the cache or run and kept; `StopRequested` when the backbone or the
        run stopped before it started, `ForwardPassFailed` when it raised."""
        runtime = self._runtime
        if runtime.stopped is not None or self._context.stop.admission_stopped:
            raise StopRequested(runtime.stopped or self._context.stop.reason or "stopped")
        self.passes += 1
        writer = self._context.writer
        key = _pass_key(self._fingerprint, segments)
        request = json.dumps(
            {"model": self.name, "segments": list(segments)}, ensure_ascii=False, sort_keys=True
        ).encode()
        request_sha = writer.put_blob(request)
        cached = await asyncio.to_thread(self._cache.load, key)
        if cached is not None:
            self.cached += 1
            runtime.counters.cached_calls += 1
            now = utc_timestamp()
            self._record(key, request_sha, cached, status="cached", started=now, ended=now, latency_ms=0.0)
            return cached
        await writer.wait_for_room()
        started_at = utc_timestamp()
        started = time.perf_counter()
        try:
            forward = await self._model.encode(segments)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            latency = (time.perf_counter() - started) * 1000
            message = (
                f"forward pass over {len(segments)} segments on {self.name} failed: "
                f"{type(error).__name__}: {one_line(str(error))}"
            )
            runtime.counters.errors += 1
            writer.add_call(
                CallRow(
                    **self._keys(key, request_sha),
                    status="error",
                    started_at=started_at,
                    ended_at=utc_timestamp(),
                    latency_ms=latency,
                    error=message[:2000],
                    error_kind="forward_failed",
                )
            )
            raise ForwardPassFailed(message) from None
        import numpy as np

        latency = (time.perf_counter() - started) * 1000
        pooled = self._cache.stored_pooled(forward.pooled)
        # Every pass is handed on as the cache keeps it, so a rerun served from the cache reads the same.
        states = SegmentStates(
            n_tokens=forward.n_tokens,
            pooled=np.asarray(pooled, dtype=np.float32),
            attention=forward.attention,
            nll=forward.nll,
        )
        await asyncio.to_thread(self._cache.keep, key, states, pooled)
        ended = utc_timestamp()
        self._record(
            key, request_sha, states, status="ok", started=started_at, ended=ended, latency_ms=latency
        )
        return states

    def _keys(self, key: str, request_sha: str) -> dict[str, Any]:
        return {
            **self._item.row_keys(self._context.run_id),
            "model": self.name,
            "stage": self._stage,
            "attempt": 1,
            "max_tokens": None,
            "cache_key": f"forward:{key}",
            "request_sha256": request_sha,
        }

    def _record(
        self,
        key: str,
        request_sha: str,
        states: SegmentStates,
        *,
        status: Literal["ok", "cached"],
        started: str,
        ended: str,
        latency_ms: float,
    ) -> None:
        tokens = self.template_tokens + sum(states.n_tokens)
        summary = {
            "segments": len(states.n_tokens),
            "n_tokens": list(states.n_tokens),
            "tokens": tokens,
            "pooled": list(states.pooled.shape),
            "attention": list(states.attention.shape),
            "nll": list(states.nll.shape),
            "pooled_kept_as": self._cache.mode,
            "file": self._cache.path(key).name if self._cache.mode != "off" else None,
        }
        writer = self._context.writer
        writer.add_call(
            CallRow(
                **self._keys(key, request_sha),
                status=status,
                started_at=started,
                ended_at=ended,
                finish_reason="stop",
                prompt_tokens=tokens,
                completion_tokens=0,
                cost_usd=0.0,
                latency_ms=latency_ms,
                response_sha256=writer.put_blob(json.dumps(summary, sort_keys=True).encode()),
            )
        )
