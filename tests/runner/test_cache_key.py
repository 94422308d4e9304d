"""The call cache key is the SHA-256 of one JSON rendering, and results.db files written before any rendering
change hold keys made by the standard library's ``json.dumps(fields, sort_keys=True, separators=(",", ":"))``:
whichever encoder renders it now must give those bytes, or every stored answer would be missed on resume."""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any

import pytest

from rcarun.runner.cache import call_cache_key


def _standard_library_key(
    *,
    backbone: str,
    model: str,
    request_sha256: str,
    stage: str,
    realization: int,
    method_label: str | None,
    sample: int = 0,
) -> str:
    fields: dict[str, object] = {
        "backbone": backbone,
        "model": model,
        "stage": stage,
        "realization": realization,
        "method": method_label,
        "request": request_sha256,
    }
    if sample:
        fields["sample"] = sample
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _text(rng: random.Random) -> str:
    # Plain identifiers most of the time; otherwise control characters, DEL (escaped by ``ensure_ascii``),
    # quotes, backslashes, non-ASCII and line separators.
    if rng.random() < 0.5:
        return "".join(
            rng.choice("abcdefghijklmnopqrstuvwxyz0123456789-_./:") for _ in range(rng.randrange(12))
        )
    pool = [chr(code) for code in range(0x80)] + ["é", "→", "\u2028", "\U0001f600", '"', "\\"]
    return "".join(rng.choice(pool) for _ in range(rng.randrange(12)))


@pytest.mark.parametrize("seed", range(3))
def test_the_key_is_the_standard_librarys_rendering_hashed(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(5_000):
        fields = {
            "backbone": _text(rng),
            "model": _text(rng),
            "request_sha256": rng.choice([hashlib.sha256(_text(rng).encode()).hexdigest(), _text(rng)]),
            "stage": _text(rng),
            "realization": rng.randrange(0, 10**6),
            "method_label": rng.choice([None, _text(rng)]),
            "sample": rng.choice([0, 0, rng.randrange(1, 100)]),
        }
        assert call_cache_key(**fields) == _standard_library_key(**fields), fields


def test_a_key_written_by_earlier_versions_is_unchanged() -> None:
    # Pinned: computed by rcarun before this encoder change (json.dumps), the key older results.db files hold.
    fields: dict[str, Any] = {
        "backbone": "deepseek",
        "model": "deepseek-chat",
        "request_sha256": "0" * 64,
        "stage": "attribution",
        "realization": 2,
        "method_label": "all-at-once",
    }
    key = call_cache_key(**fields)
    assert key == _standard_library_key(**fields)
    assert key == "4c057e9bcd07d673d860c0e833c0f5685a125404a46282f08f890a8f12e30978"
