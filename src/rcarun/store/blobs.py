"""Content addressing and the two stored forms of the ``blobs`` table.

Prompts repeat across realizations, backbones and retries, and raw responses are large; storing each distinct
byte string once, keyed by the SHA-256 of its bytes, keeps results.db small while keeping every raw request and
response for audits and cache rebuilds.

Since migration 4 a blob is stored one of two ways (`blob_columns`), so that SQLite itself, and so datasette,
sqlite-utils and the ``calls_text`` view, can read prompts and answers:

- UTF-8 text of at most `BLOB_TEXT_MAX_BYTES` bytes without NUL: as is, in ``text`` (``zlib_data`` empty);
- anything else (larger text, binary, NUL-bearing): zlib-compressed in ``zlib_data`` (``text`` NULL), as
  every blob was before migration 4; those rows stay as they were.

Why 64 KiB, measured (`benchmarks/blob_storage.py`, figures in docs/schema.md): on the demo all but its longest
trajectory's prompts are under it (prompts average 13 KB) and the file grows from 23.7 to 57.3 MB; on a
Mini-sized run (200
trajectories of the official Mini sizes, prompts of 210 KB on average) only the answers and the shortest
prompts are under it and the file grows 8 % (12.5 to 13.5 MB), where storing everything as text would make it
3.4 times larger. Storing text instead of compressing it also takes zlib off the writer thread for those blobs.
"""

from __future__ import annotations

import hashlib
import zlib
from typing import Final

from rcarun.errors import StoreError

__all__ = [
    "BLOB_TEXT_MAX_BYTES",
    "BLOB_ZLIB_LEVEL",
    "blob_columns",
    "blob_sha256",
    "compress_blob",
    "decompress_blob",
    "stored_bytes",
]

# Level 1: the store writer compresses every new request and response it does not keep as text, and at level 6
# (zlib's default) that was 43 % of the writer thread's CPU in the bench's latency-bound run, about 0.085 ms a
# call. On the bundled Who&When trajectories (22 KB on average) level 1 takes 300 us a blob against 600 us at
# level 6, for 15 % more bytes (a ratio of 0.32 against 0.28). Any level decompresses the same way.
BLOB_ZLIB_LEVEL: Final = 1
BLOB_TEXT_MAX_BYTES: Final = 65_536
"""The largest blob, in bytes, stored as readable text rather than compressed (the module docstring says why)."""


def blob_sha256(data: bytes) -> str:
    """The key a blob is stored under: hex SHA-256 of its bytes."""
    return hashlib.sha256(data).hexdigest()


def compress_blob(data: bytes) -> bytes:
    return zlib.compress(data, BLOB_ZLIB_LEVEL)


def blob_columns(data: bytes) -> tuple[bytes, str | None]:
    """``(zlib_data, text)`` of a new blobs row: readable text when ``data`` may be, compressed bytes otherwise."""
    if len(data) <= BLOB_TEXT_MAX_BYTES and b"\x00" not in data:
        try:
            return b"", data.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return compress_blob(data), None


def decompress_blob(sha256: str, zlib_data: bytes) -> bytes:
    """Decompress a compressed blob and check it still hashes to its key.

    Raises:
        StoreError: the stored bytes are corrupt or do not match the key.
    """
    return stored_bytes(sha256, zlib_data, None)


def stored_bytes(sha256: str, zlib_data: bytes | None, text: str | None) -> bytes:
    """A blob's bytes from either stored form (``text`` when it is not NULL), checked against its key.

    Raises:
        StoreError: the stored bytes are corrupt or do not match the key.
    """
    if text is not None:
        data = text.encode("utf-8", errors="surrogatepass")
    else:
        try:
            data = zlib.decompress(zlib_data or b"")
        except zlib.error as error:
            raise StoreError(f"blob {sha256} is corrupt: {error}") from error
    if blob_sha256(data) != sha256:
        raise StoreError(f"blob {sha256} does not match its content hash")
    return data
