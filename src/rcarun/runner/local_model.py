"""A local backbone's model (loaded once, on first use) and the cache of its forward passes beside results.db.

Apart from `rcarun.runner.forward_session` so that `rcarun.runner.runtime` can hold both without importing the
session that uses the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from rcarun.errors import ConfigError
from rcarun.methods.forward import SegmentStates
from rcarun.runner.config import BackboneConfig, tiny_seed

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from rcarun.backends.local import LocalForwardModel

__all__ = ["CacheMode", "ForwardCache", "LocalModel", "forward_cache_dir", "one_line"]

CacheMode = Literal["float16", "float32", "off"]
_ERROR_CHARS = 600


def forward_cache_dir(db_path: Path | str) -> Path:
    """Where the passes of the runs in ``db_path`` are kept: ``<db>.forward-cache`` beside it."""
    path = Path(db_path)
    return path.with_name(path.name + ".forward-cache")


class LocalModel:
    """One local backbone's model: loaded on first use (off the event loop, once; a 9B model takes tens of
    seconds), passes run one at a time on its thread, closed with the sweep."""

    def __init__(self, backbone: str, config: BackboneConfig) -> None:
        self.backbone = backbone
        self.config = config
        self._model: LocalForwardModel | None = None
        self._lock = asyncio.Lock()
        self.fingerprint = ""

    async def get(self) -> LocalForwardModel:
        """The loaded model, or a one-line ConfigError naming the backbone and model (the extra missing, no
        such model, a format transformers cannot read)."""
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
                f"{type(error).__name__}: {one_line(str(error))}"
            ) from None

    def close(self) -> None:
        if self._model is not None:
            self._model.close()


class ForwardCache:
    """Passes as ``<sha256>.npz`` files in one directory (written to a temporary name and renamed, so a killed
    sweep leaves none half-written): arrays too big for results.db (a 9B model's pooled states are ~70 MB per
    trajectory in float32). ``float16`` rounds the pooled states of every pass, fresh or cached, so a rerun reads
    what the first run computed; ``float32`` keeps them exact; ``off`` keeps nothing."""

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


def one_line(text: str) -> str:
    """``text`` on one line, cut to what an error message carries."""
    return " ".join(text.split())[:_ERROR_CHARS]
