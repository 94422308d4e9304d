"""Content addressing and the two stored forms of the ``blobs`` table.

Each distinct byte string is stored once, keyed by its SHA-256. Since migration 4, UTF-8 text up to
`BLOB_TEXT_MAX_BYTES` without NUL is stored as text (readable by SQLite tools and ``calls_text``), anything else
zlib-compressed. Why 64 KiB: docs/reliability.md ("Blob storage forms").
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
"""The largest blob, in bytes, stored as readable text rather than compressed (why: docs/reliability.md, "Blob storage forms")."""


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
    """Decompress a compressed blob and check it against its key (`StoreError` when corrupt)."""
    return stored_bytes(sha256, zlib_data, None)


def stored_bytes(sha256: str, zlib_data: bytes | None, text: str | None) -> bytes:
    """A blob's bytes from either stored form, checked against its key (`StoreError` when corrupt)."""
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
