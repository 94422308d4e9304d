"""Content addressing and compression for the ``blobs`` table.

Prompts repeat across realizations, backbones and retries, and raw responses are large; storing each
distinct byte string once, zlib-compressed and keyed by the SHA-256 of its uncompressed bytes, keeps
results.db small while keeping every raw request and response for audits and cache rebuilds.
"""

from __future__ import annotations

import hashlib
import zlib
from typing import Final

from rcarun.errors import StoreError

__all__ = ["BLOB_ZLIB_LEVEL", "blob_sha256", "compress_blob", "decompress_blob"]

# Level 1: the store writer compresses every new request and response, and at level 6 (zlib's default) that was
# 43 % of the writer thread's CPU in the bench's latency-bound run, about 0.085 ms a call. On the bundled
# Who&When trajectories (22 KB on average) level 1 takes 300 us a blob against 600 us at level 6, for 15 % more
# bytes (a ratio of 0.32 against 0.28). Any level decompresses the same way, so older files read unchanged.
BLOB_ZLIB_LEVEL: Final = 1


def blob_sha256(data: bytes) -> str:
    """The key a blob is stored under: hex SHA-256 of the uncompressed bytes."""
    return hashlib.sha256(data).hexdigest()


def compress_blob(data: bytes) -> bytes:
    return zlib.compress(data, BLOB_ZLIB_LEVEL)


def decompress_blob(sha256: str, zlib_data: bytes) -> bytes:
    """Decompress a stored blob and check it still hashes to its key.

    Raises:
        StoreError: the stored bytes are corrupt or do not match the key.
    """
    try:
        data = zlib.decompress(zlib_data)
    except zlib.error as error:
        raise StoreError(f"blob {sha256} is corrupt: {error}") from error
    if blob_sha256(data) != sha256:
        raise StoreError(f"blob {sha256} does not match its content hash")
    return data
