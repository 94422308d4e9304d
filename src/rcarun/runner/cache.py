"""The call cache key: what makes two attempts "the same call" for resume and reuse.

Backbone, model, the full request, stage and realization must match (realizations never serve each other, or a
repeatability study would measure the cache); so must the method label, unless the stage is shareable across
ablation conditions, and the sample number of independent draws (sample 0 leaves the key as it always was).
"""

from __future__ import annotations

import hashlib
import json

from rcarun.jsonfast import dumps_canonical

__all__ = ["call_cache_key"]


def call_cache_key(
    *,
    backbone: str,
    model: str,
    request_sha256: str,
    stage: str,
    realization: int,
    method_label: str | None,
    sample: int = 0,
) -> str:
    """sha256 over the identity of one attempt; ``method_label=None`` for shareable stages.

    ``request_sha256`` is the SHA-256 of the request's canonical JSON (`ChatRequest.canonical_json`).
    """
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
    texts = f"{backbone}{model}{stage}{request_sha256}{method_label or ''}"
    if texts.isascii() and "\x7f" not in texts:
        # The same bytes as below (`ensure_ascii` escapes nothing below DEL that orjson does not), without the
        # standard library's encoder: this runs once an attempt.
        identity = dumps_canonical(fields)
    else:
        identity = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(identity).hexdigest()
