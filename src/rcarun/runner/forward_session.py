"""The `ForwardModel` a model-reading method (SOAP) receives for one trajectory: cache → pass → record.

A local backbone (``provider = "local"``) runs forward passes over a causal LM on this machine instead of chat
calls over HTTP. What a chat call gets from `rcarun.runner.session.ItemSession` a pass gets here, so SOAP sits
in results.db beside the chat methods:

- every pass is a ``calls`` row (stage ``forward``, or ``forward/reference`` and ``forward/validation`` while a
  method prepares; the method label, backbone, realization and trajectory): ``prompt_tokens`` = the tokens the
  pass held, chat template included, no completion and no USD, its latency; the request (the model and the
  segments, as JSON) is a blob like a chat request, so the pass can be read back; the response blob is a short
  JSON summary (token counts and array shapes), never the arrays;
- the arrays live beside results.db, in ``<db>.forward-cache/<sha256>.npz`` (one file per pass, written to a
  temporary name and renamed, so a killed sweep leaves none half-written), keyed by the SHA-256 of the model's
  fingerprint (name, dtype, device) and the segments: a rerun, a resume or another realization reads the file
  instead of recomputing, and its row is marked ``cached``. Pooled states of a 9B model are about 70 MB per
  trajectory in float32, which results.db should not carry. ``sweep.forward_cache`` chooses how they are kept:
  ``float16`` (the default) rounds the pooled states of every pass, fresh or cached, so a rerun reads exactly
  what the first run computed (attention and NLL stay float32); ``float32`` keeps them exact at twice the size;
  ``off`` recomputes every pass and writes nothing;
- a pass that fails (too many tokens, out of memory, anything the model raises) is recorded as an ``error`` row
  and raised as `ForwardPassFailed`, one line, which fails the item and never the sweep.

`LocalModel` is the backbone's side: the model is loaded on first use, once, on a thread (a model directory of a
9B model takes tens of seconds), and passes run one at a time on the model's own thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rcarun.errors import ConfigError, RcarunError, StopRequested
from rcarun.methods.forward import SegmentStates
from rcarun.runner.config import BackboneConfig, tiny_seed
from rcarun.runner.runtime import BackboneRuntime, RunContext, WorkItem
from rcarun.store import CallRow, utc_timestamp

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from rcarun.backends.local import ForwardPass, LocalForwardModel

__all__ = [
    "FORWARD_STAGE",
    "ForwardCache",
    "ForwardPassFailed",
    "ForwardSession",
    "LocalModel",
    "forward_cache_dir",
]

FORWARD_STAGE = "forward"
"""The stage of the passes that answer an item; a preparation's passes are ``forward/<part>``."""

CacheMode = Literal["float16", "float32", "off"]
_ERROR_CHARS = 600


class ForwardPassFailed(RcarunError):
    """A forward pass raised (too long, out of memory, a model error): the item fails with this one line."""


def forward_cache_dir(db_path: Path | str) -> Path:
    """Where the passes of the runs in ``db_path`` are kept: ``<db>.forward-cache`` beside it."""
    path = Path(db_path)
    return path.with_name(path.name + ".forward-cache")


class LocalModel:
    """One local backbone's model: loaded on first use (off the event loop), once, and closed with the sweep.

    Args:
        backbone: the backbone's name (for messages).
        config: its configuration (``model`` and the ``local`` table).
    """

    def __init__(self, backbone: str, config: BackboneConfig) -> None:
        self.backbone = backbone
        self.config = config
        self._model: LocalForwardModel | None = None
        self._lock = asyncio.Lock()
        self.fingerprint = ""

    async def get(self) -> LocalForwardModel:
        """The loaded model.

        Raises:
            ConfigError: it cannot be loaded (the ``local`` extra missing, no such directory or hub name, a
                format transformers cannot read); one line naming the backbone and the model.
        """
        async with self._lock:
            if self._model is None:
                self._model = await asyncio.to_thread(self._load)
                self.fingerprint = json.dumps(
                    {
                        "model": self._model.name,
                        "dtype": str(self._model.model.dtype).removeprefix("torch."),
                        "device": self._model.device.type,
                    },
                    sort_keys=True,
                )
            return self._model

    def _load(self) -> LocalForwardModel:
        from rcarun.backends.local import LocalForwardModel, require_local_extra, tiny_model

        require_local_extra()
        settings = self.config.local_settings
        device = None if settings.device == "auto" else settings.device
        seed = tiny_seed(self.config.model)
        try:
            if seed is not None:
                return tiny_model(seed, context_tokens=settings.context_tokens, device=device)
            return LocalForwardModel.load(
                self.config.model,
                revision=settings.revision,
                dtype=None if settings.dtype == "auto" else settings.dtype,
                device=device,
                context_tokens=settings.context_tokens,
                trust_remote_code=settings.trust_remote_code,
                local_files_only=settings.local_files_only,
            )
        except ConfigError as error:
            raise ConfigError(f"backbone {self.backbone!r}: {error}") from None
        except Exception as error:  # OSError, ValueError, torch's: whatever a load can raise, as one line
            raise ConfigError(
                f"backbone {self.backbone!r}: cannot load model {self.config.model!r}: "
                f"{type(error).__name__}: {_one_line(str(error))}"
            ) from None

    def close(self) -> None:
        if self._model is not None:
            self._model.close()


class ForwardCache:
    """Passes as ``.npz`` files by key, in one directory (module docstring); ``mode = "off"`` keeps nothing."""

    def __init__(self, directory: Path, mode: CacheMode) -> None:
        self.directory = directory
        self.mode: CacheMode = mode

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.npz"

    def load(self, key: str) -> SegmentStates | None:
        """The pass stored under ``key``, None when there is none (or it cannot be read: computed again)."""
        if self.mode == "off":
            return None
        # numpy is imported where a pass is handled: every sweep imports this module, and a chat sweep would pay
        # numpy's 10 MB of resident memory and 0.15 s of start-up CPU for nothing.
        import numpy as np

        try:
            with np.load(self.path(key)) as stored:
                return SegmentStates(
                    n_tokens=tuple(int(n) for n in stored["n_tokens"]),
                    pooled=np.asarray(stored["pooled"], dtype=np.float32),
                    attention=np.asarray(stored["attention"], dtype=np.float32),
                    nll=np.asarray(stored["nll"], dtype=np.float32),
                )
        except (OSError, KeyError, ValueError):
            return None

    def keep(self, key: str, states: SegmentStates, pooled: npt.NDArray[np.floating]) -> None:
        """Write the pass atomically (a temporary file renamed over the final name)."""
        if self.mode == "off":
            return
        import numpy as np

        self.directory.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{key}.", suffix=".npz.tmp", dir=self.directory)
        try:
            with os.fdopen(handle, "wb") as file:
                np.savez(
                    file,
                    n_tokens=np.asarray(states.n_tokens, dtype=np.int64),
                    pooled=pooled,
                    attention=states.attention,
                    nll=states.nll,
                )
            os.replace(temporary, self.path(key))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise

    def stored_pooled(self, pooled: npt.NDArray[np.float32]) -> npt.NDArray[np.floating]:
        """The pooled states as the cache keeps them: float16 in the default mode, unless a value overflows
        float16's range (then float32, exact, for that pass)."""
        if self.mode != "float16":
            return pooled
        import numpy as np

        with np.errstate(over="ignore"):
            rounded = pooled.astype(np.float16)
        if not np.array_equal(np.isfinite(rounded), np.isfinite(pooled)):
            return pooled
        return rounded


def _one_line(text: str) -> str:
    return " ".join(text.split())[:_ERROR_CHARS]


def _pass_key(fingerprint: str, segments: Sequence[str]) -> str:
    document = json.dumps({"model": fingerprint, "segments": list(segments)}, ensure_ascii=False)
    return hashlib.sha256(document.encode()).hexdigest()


def _states(forward: ForwardPass) -> SegmentStates:
    return SegmentStates(
        n_tokens=forward.n_tokens, pooled=forward.pooled, attention=forward.attention, nll=forward.nll
    )


class ForwardSession:
    """Implements `rcarun.methods.forward.ForwardModel` for one trajectory of one item (module docstring).

    Args:
        context: the run.
        runtime: the local backbone.
        model: its loaded model.
        fingerprint: what identifies the model's numbers (`LocalModel.fingerprint`).
        cache: where passes are kept.
        item: the work item the passes are recorded under (a preparation's trajectory: its would-be item).
        stage: ``forward``, or ``forward/<part>`` while preparing.
    """

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
        """One pass over ``segments``: from the cache, or run and kept (module docstring).

        Raises:
            StopRequested: the backbone or the run stopped before the pass started.
            ForwardPassFailed: the pass raised.
        """
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
                f"{type(error).__name__}: {_one_line(str(error))}"
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
        states = _states(forward)
        pooled = self._cache.stored_pooled(states.pooled)
        # Every pass is handed on as the cache keeps it, so a rerun served from the cache reads the same.
        states = SegmentStates(
            n_tokens=states.n_tokens,
            pooled=np.asarray(pooled, dtype=np.float32),
            attention=states.attention,
            nll=states.nll,
        )
        await asyncio.to_thread(self._cache.keep, key, states, pooled)
        self._record(
            key,
            request_sha,
            states,
            status="ok",
            started=started_at,
            ended=utc_timestamp(),
            latency_ms=latency,
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
