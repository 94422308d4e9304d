"""How the answers of a run came, per backbone, read from the ``calls`` table: streamed or whole, time to first
token, decode rate, and generations cut short (what `rcarun cost` prints below its table and `rcarun report`
shows as "Call timing").

Over the attempts sent (not ``cached``):
    - ``streamed_calls``: attempts whose answer came as a server-sent-event stream (``calls.streamed = 1``);
      None when no attempt recorded how its answer came (a file from before migration 5, a local backbone).
    - TTFT p50 / p95 (seconds): nearest-rank percentiles of ``ttft_ms`` over the attempts that have it (streamed
      ones where a first token arrived); decode p50 / p95 (tokens per second): of ``decode_tokens_per_s`` over
      the attempts that have it. None when no attempt has it: unknown, never 0.
    - ``cut_calls`` / ``cut_usd``: generations cut short (silence timeout, disconnect, size cap, call deadline,
      Ctrl-C): attempts with status ``error`` or ``cancelled`` and ``usage_source = 'estimated'`` that were
      charged (``cost_usd > 0`` or ``completion_tokens > 0``), and the USD of their estimates (in ``cost_usd``
      of `CostRow` too).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from rcarun.store import Store

from .cost import nearest_rank

__all__ = ["CallTiming", "call_timing"]

# A generation cut short and charged an estimate of what it generated (module docstring).
_CUT = (
    "status IN ('error', 'cancelled') AND usage_source = 'estimated' "
    "AND (cost_usd > 0 OR completion_tokens > 0)"
)

_TIMING_SQL = f"""
SELECT backbone,
       sum(status != 'cached') AS attempts,
       sum(status != 'cached' AND streamed = 1) AS streamed_calls,
       sum(status != 'cached' AND streamed IS NOT NULL) AS known_calls,
       sum(status != 'cached' AND {_CUT}) AS cut_calls,
       sum(CASE WHEN status != 'cached' AND {_CUT} THEN cost_usd ELSE 0 END) AS cut_usd
FROM calls WHERE run_id = ?
GROUP BY backbone
ORDER BY backbone
"""

_TIMES_SQL = """
SELECT backbone, ttft_ms, decode_tokens_per_s FROM calls
WHERE run_id = ? AND status != 'cached' AND (ttft_ms IS NOT NULL OR decode_tokens_per_s IS NOT NULL)
"""


@dataclass(frozen=True, slots=True)
class CallTiming:
    """How the answers of one backbone came within one run, over its attempts sent (module docstring).

    Attributes:
        attempts: attempts sent to the provider (cache hits left out).
        streamed_calls: of those, answers that came as a stream; None when none recorded how it came.
        ttft_p50_s / ttft_p95_s: time to first token, seconds; None when unknown.
        decode_p50_tokens_per_s / decode_p95_tokens_per_s: decode rate; None when unknown.
        cut_calls: generations cut short and charged an estimate; cut_usd: their USD.
    """

    backbone: str
    attempts: int
    streamed_calls: int | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    decode_p50_tokens_per_s: float | None
    decode_p95_tokens_per_s: float | None
    cut_calls: int
    cut_usd: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def call_timing(store: Store, run_id: int) -> list[CallTiming]:
    """One `CallTiming` per backbone of the run (every backbone with a call row), sorted by name."""
    connection = store.connection
    ttft: dict[str, list[float]] = defaultdict(list)
    decode: dict[str, list[float]] = defaultdict(list)
    for row in connection.execute(_TIMES_SQL, (run_id,)):
        if row["ttft_ms"] is not None:
            ttft[row["backbone"]].append(float(row["ttft_ms"]) / 1000)
        if row["decode_tokens_per_s"] is not None:
            decode[row["backbone"]].append(float(row["decode_tokens_per_s"]))
    result = []
    for row in connection.execute(_TIMING_SQL, (run_id,)).fetchall():
        backbone = str(row["backbone"])
        firsts, rates = sorted(ttft[backbone]), sorted(decode[backbone])
        result.append(
            CallTiming(
                backbone=backbone,
                attempts=int(row["attempts"] or 0),
                streamed_calls=int(row["streamed_calls"] or 0) if row["known_calls"] else None,
                ttft_p50_s=nearest_rank(firsts, 0.50),
                ttft_p95_s=nearest_rank(firsts, 0.95),
                decode_p50_tokens_per_s=nearest_rank(rates, 0.50),
                decode_p95_tokens_per_s=nearest_rank(rates, 0.95),
                cut_calls=int(row["cut_calls"] or 0),
                cut_usd=float(row["cut_usd"] or 0.0),
            )
        )
    return result
