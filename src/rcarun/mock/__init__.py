"""rcarun's OpenAI-compatible simulator: a backbone on loopback for tests, the demo and the benchmark.

It stands alone (it imports nothing else of rcarun), answers chat completions with values generated from the
JSON schema each request carries (as one JSON body, or streamed as server-sent events in each provider's chunk
shape when the request says ``"stream": true``), enforces rate and concurrency limits the way providers do,
injects reproducible faults, measures what clients offered at ``GET /mock/stats`` and, when asked, logs every
request with its outcome at ``GET /mock/log``.

    async with MockServer(MockConfig(rpm=600)) as server:   # in this event loop
        ... server.base_url, server.stats(), server.reset()

    with MockProcess(MockConfig(rpm=600)) as mock:          # in a child process
        ... mock.base_url, mock.stats(), mock.reset()
"""

from .answers import generate_value, schema_from_prompt, schema_from_request
from .config import HeaderStyle, MockConfig, OverConcurrency, ReasoningField, UsageStyle
from .headers import format_openai_duration
from .process import MockProcess, MockStartError
from .server import MockServer, is_loopback_host
from .stats import MockStats, RequestLogEntry, request_digest

__all__ = [
    "HeaderStyle",
    "MockConfig",
    "MockProcess",
    "MockServer",
    "MockStartError",
    "MockStats",
    "OverConcurrency",
    "ReasoningField",
    "RequestLogEntry",
    "UsageStyle",
    "format_openai_duration",
    "generate_value",
    "is_loopback_host",
    "request_digest",
    "schema_from_prompt",
    "schema_from_request",
]
