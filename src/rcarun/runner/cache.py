"""The call cache key: what makes two attempts "the same call" for resume and reuse.

A finished attempt is served again instead of paid again when backbone, model, the full request (messages,
budget, sampling, schema, reasoning), stage and realization all match. Realization is in the key so repeated
realizations are never served from each other's cache — otherwise a repeatability study would measure the cache.
The method label is in the key too, unless the stage declares itself shareable across ablation conditions (for
example a summary stage that several RCTA conditions send identically).
"""

from __future__ import annotations

import hashlib
import json

__all__ = ["call_cache_key"]


def call_cache_key(
    *,
    backbone: str,
    model: str,
    request_sha256: str,
    stage: str,
    realization: int,
    method_label: str | None,
) -> str:
    """sha256 over the identity of one attempt; ``method_label=None`` for shareable stages.

    ``request_sha256`` is the SHA-256 of the request's canonical JSON (`ChatRequest.canonical_json`).
    """
    identity = json.dumps(
        {
            "backbone": backbone,
            "model": model,
            "stage": stage,
            "realization": realization,
            "method": method_label,
            "request": request_sha256,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(identity.encode()).hexdigest()
