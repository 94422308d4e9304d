"""A hostile OpenAI-compatible server written for rcarun's fault tests, and readers of results.db's ground truth.

The fault tests must not trust rcarun to describe its own failures, so neither the server nor the readers here use
rcarun's code: the server is plain aiohttp on loopback (not `rcarun.mock`), and the readers open results.db with
`sqlite3` and `zlib`. The server keeps its own log, one `LogEntry` per request: when it arrived and was answered,
the request's digest, what was sent, the completion id of every answer it served, the tokens it billed (its own
count, whatever it reported) and their price. A test compares that log with what rcarun stored.

What the server sends is decided per request by a policy: a `Reply`, or a function of the `Request` (its arrival
number and parsed body) returning one. Builders: `ok` (a schema-valid chat completion, with any answer field
overridden verbatim), the usage variants (`honest`, `no_usage`, `raw_usage` and the named nonsense values),
`status` (any code, headers and body, with `echo_secret` / `echo_authorization` for leaks), `hang`, `reset`,
`slow`.

Runs inside a test's event loop (``async with HostileServer(...)``) or in a thread with its own loop
(``with HostileServer(...).running_in_thread()``) while a sweep runs as a child process. Either way the server
stops by itself after ``lifetime_s``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import random
import re
import secrets
import socket
import sqlite3
import struct
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

__all__ = [
    "HONEST",
    "Answer",
    "Flood",
    "Hang",
    "HostileServer",
    "LogEntry",
    "Policy",
    "Prices",
    "Reply",
    "Request",
    "Reset",
    "Status",
    "StoredCall",
    "Stream",
    "Usage",
    "answer_row_counts",
    "answered_twice",
    "db_rows",
    "echo_authorization",
    "echo_secret",
    "find_secret",
    "flood",
    "hang",
    "honest",
    "huge_usage",
    "infinite_usage",
    "integrity_check",
    "make_secret",
    "negative_usage",
    "no_usage",
    "ok",
    "ok_rows_per_cache_key",
    "random_text",
    "raw_usage",
    "request_digest",
    "resent_after_stored",
    "reset",
    "schema_instance",
    "slow",
    "status",
    "stored_calls",
    "stream",
    "unstored_answers",
]

CHARS_PER_TOKEN = 4
_COMPLETION_ID = re.compile(rb"chatcmpl-hostile-[0-9a-f]{8}-[0-9]+")

# ------------------------------------------------------------------------------------------------ requests


def request_digest(messages: Any, max_tokens: Any) -> str:
    """SHA-256 of the canonical JSON of a request's messages (role, content) and max_tokens.

    The same digest comes from what the server received and from the request blob rcarun stores, so a fault
    that carried no completion id can still be matched to its calls row.
    """
    listed = messages if isinstance(messages, list) else []
    payload = {
        "messages": [
            {"role": m.get("role"), "content": m.get("content")} if isinstance(m, dict) else m for m in listed
        ],
        "max_tokens": max_tokens,
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True)
class Request:
    """One request as the policy sees it.

    Attributes:
        seq: 1-based arrival number on this server (every path counted).
        path: the URL path.
        body: the parsed JSON body; None when it was not JSON.
        authorization: the Authorization header as received, or None.
        arrived_at: wall-clock time (Unix seconds).
    """

    seq: int
    path: str
    body: Any
    authorization: str | None
    arrived_at: float

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages = self.body.get("messages") if isinstance(self.body, dict) else None
        return [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []

    @property
    def max_tokens(self) -> Any:
        if not isinstance(self.body, dict):
            return None
        return self.body.get("max_tokens", self.body.get("max_completion_tokens"))

    @property
    def digest(self) -> str | None:
        return request_digest(self.messages, self.max_tokens) if isinstance(self.body, dict) else None

    @property
    def prompt_chars(self) -> int:
        """Characters of the prompt messages' text, the basis of the server's token count."""
        return sum(len(m["content"]) for m in self.messages if isinstance(m.get("content"), str))

    @property
    def prompt_bytes(self) -> int:
        """UTF-8 bytes of the same text: what a byte-level tokenizer counts at most."""
        return sum(
            len(m["content"].encode("utf-8", "surrogatepass"))
            for m in self.messages
            if isinstance(m.get("content"), str)
        )

    @property
    def prompt_text(self) -> str:
        return "\n".join(m["content"] for m in self.messages if isinstance(m.get("content"), str))

    @property
    def schema(self) -> dict[str, Any] | None:
        """The answer's JSON schema from ``response_format`` (json_schema), when the client sent one."""
        if not isinstance(self.body, dict):
            return None
        response_format = self.body.get("response_format")
        if not isinstance(response_format, dict):
            return None
        wrapper = response_format.get("json_schema")
        schema = wrapper.get("schema") if isinstance(wrapper, dict) else None
        return schema if isinstance(schema, dict) else None

    @property
    def agents(self) -> list[str]:
        """The trajectory's agents: the schema's role enum, else the prompt's "Agents recorded in the log" line."""
        schema = self.schema or {}
        role = schema.get("properties", {}).get("responsible_role", {})
        if isinstance(role, dict) and isinstance(role.get("enum"), list):
            return [str(agent) for agent in role["enum"]]
        match = re.search(r"Agents recorded in the log: (.+)", self.prompt_text)
        return [agent.strip() for agent in match.group(1).split(",")] if match else []


# ------------------------------------------------------------------------------------------------ replies


@dataclass(frozen=True, slots=True)
class Prices:
    """USD per million tokens, as the test configures rcarun with them."""

    input_per_mtok: float = 0.0
    output_per_mtok: float = 0.0

    def usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input_per_mtok + completion_tokens * self.output_per_mtok) / 1e6


@dataclass(frozen=True, slots=True)
class Usage:
    """What the server bills for an answer, and what it tells the client.

    The server always bills its own count: ceil(prompt chars / 4 × ``prompt_mult``) prompt tokens (UTF-8 bytes
    instead of chars with ``per_byte``) and ceil(answer chars / 4 × ``completion_mult``) completion tokens (or
    ceil(``max_tokens`` × ``completion_of_budget``), a bill above the output budget, when set).
    ``report`` says what goes in the body:
    ``honest`` (that count), ``missing`` (no usage object at all) or ``raw`` (``raw_json`` written verbatim as the
    usage object: any nonsense, ``Infinity`` included).
    """

    prompt_mult: float = 1.0
    completion_mult: float = 1.0
    report: str = "honest"
    raw_json: str = ""
    per_byte: bool = False
    completion_of_budget: float | None = None

    def billed(self, request: Request, answer_chars: int) -> tuple[int, int]:
        prompt = request.prompt_bytes if self.per_byte else request.prompt_chars
        if self.completion_of_budget is not None and isinstance(request.max_tokens, int):
            completion = math.ceil(request.max_tokens * self.completion_of_budget)
        else:
            completion = math.ceil(answer_chars * self.completion_mult / CHARS_PER_TOKEN)
        return math.ceil(prompt * self.prompt_mult / CHARS_PER_TOKEN), completion


def honest(
    prompt_mult: float = 1.0,
    completion_mult: float = 1.0,
    *,
    per_byte: bool = False,
    completion_of_budget: float | None = None,
) -> Usage:
    """Bill as `Usage` says and report exactly that."""
    return Usage(
        prompt_mult=prompt_mult,
        completion_mult=completion_mult,
        per_byte=per_byte,
        completion_of_budget=completion_of_budget,
    )


HONEST = honest()


def no_usage(prompt_mult: float = 1.0) -> Usage:
    """Bill as `honest` does but send no ``usage`` object."""
    return Usage(prompt_mult=prompt_mult, report="missing")


def raw_usage(raw_json: str, prompt_mult: float = 1.0) -> Usage:
    """Bill as `honest` does but write ``raw_json`` as the usage object, verbatim."""
    return Usage(prompt_mult=prompt_mult, report="raw", raw_json=raw_json)


def negative_usage() -> Usage:
    return raw_usage('{"prompt_tokens": -5, "completion_tokens": -7, "total_tokens": -12}')


def huge_usage(tokens: int = 10**20) -> Usage:
    return raw_usage(
        json.dumps({"prompt_tokens": tokens, "completion_tokens": 10, "total_tokens": tokens + 10})
    )


def infinite_usage() -> Usage:
    """``Infinity`` written literally, as Python's json module (and rcarun) accepts it."""
    return raw_usage('{"prompt_tokens": Infinity, "completion_tokens": 10, "total_tokens": Infinity}')


@dataclass(frozen=True, slots=True)
class Reply:
    """What to send; ``latency_s`` passes before anything is sent. ``kind`` labels it in the log."""

    kind: str
    latency_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Answer(Reply):
    """HTTP 200 with a chat.completion.

    Attributes:
        fields: answer fields written over the schema-valid answer (``json.dumps`` of each value, so
            ``root_step=10**25`` appears verbatim and a lone surrogate becomes a ``\\ud800`` escape in the body).
        content: the message content verbatim instead of an answer built from the schema.
        around: text written before and after the answer built from the schema (e.g. NUL bytes and a fence).
        usage: what is billed and reported.
        finish_reason: as sent.
        headers: extra response headers.
    """

    fields: Mapping[str, Any] = field(default_factory=dict)
    content: str | None = None
    around: tuple[str, str] = ("", "")
    usage: Usage = HONEST
    finish_reason: str = "stop"
    headers: Mapping[str, str] = field(default_factory=dict)


Body = bytes | str | Mapping[str, Any] | Callable[[Request], "bytes | str | Mapping[str, Any]"]


@dataclass(frozen=True, slots=True)
class Status(Reply):
    """Any status with headers and a body (bytes or text as is, a mapping as JSON, or a function of the request)."""

    code: int = 500
    headers: Mapping[str, str] = field(default_factory=dict)
    body: Body = b""


@dataclass(frozen=True, slots=True)
class Hang(Reply):
    """Accept the request and never answer (until the server stops, or ``for_s`` seconds, then reset)."""

    for_s: float | None = None


@dataclass(frozen=True, slots=True)
class Reset(Reply):
    """Close the connection with a TCP reset; with ``partial``, after a 200 head promising more than those bytes."""

    partial: bytes = b""


@dataclass(frozen=True, slots=True)
class Stream(Reply):
    """HTTP 200 with server-sent events, as OpenAI's chat-completions streaming sends them, to a request that asked
    to stream (``"stream": true``); to one that did not, the same answer as one body after the same time.

    Every chunk is one token, billed when sent: a cut stream is billed for what it generated (OpenAI bills the
    tokens generated before a client goes). The events: a role chunk, ``thinking`` chunks of ``reasoning_content``
    (one word each), the answer (the schema-valid answer, or ``content``) in chunks of ``chunk_chars`` characters,
    a chunk with ``finish_reason``, the usage chunk (``choices: []``) when ``stream_options.include_usage`` asked
    for it, then ``data: [DONE]``.

    Attributes:
        interval_s: seconds between two chunks (after the role chunk).
        keepalives: ``: keep-alive`` comments sent before the first chunk, ``interval_s`` apart (DeepSeek's
            queue).
        thinking: reasoning chunks before the answer.
        stall_after: after this many token chunks, nothing more: silence until ``stall_s`` passes (then a reset)
            or the server stops.
        drop_after: after this many token chunks, a TCP reset.
        endless: thinking chunks forever, each ``filler_chars`` long (a model that never stops).
        finish_reason: as sent.
        batch: chunks written at once, every ``interval_s`` (a long answer in scaled time).
    """

    interval_s: float = 0.0
    keepalives: int = 0
    thinking: int = 0
    content: str | None = None
    chunk_chars: int = 4
    stall_after: int | None = None
    stall_s: float | None = None
    drop_after: int | None = None
    endless: bool = False
    filler_chars: int = 5
    finish_reason: str = "stop"
    batch: int = 1


@dataclass(frozen=True, slots=True)
class Flood(Reply):
    """HTTP 200 and then body bytes without end, as fast as the connection takes them: ``sse`` as an event stream
    of thinking chunks, otherwise a JSON body that never closes (no length, chunked)."""

    sse: bool = False


def stream(**settings: Any) -> Stream:
    """A streamed answer (see `Stream`)."""
    return Stream(kind="stream", **settings)


def flood(*, sse: bool = False) -> Flood:
    return Flood(kind="flood_sse" if sse else "flood", sse=sse)


def ok(
    content: str | None = None,
    *,
    usage: Usage = HONEST,
    finish_reason: str = "stop",
    latency_s: float = 0.0,
    kind: str = "ok",
    headers: Mapping[str, str] | None = None,
    around: tuple[str, str] = ("", ""),
    **fields: Any,
) -> Answer:
    """A valid chat.completion answering the request's schema; ``fields`` override answer fields verbatim."""
    return Answer(
        kind=kind,
        latency_s=latency_s,
        fields=dict(fields),
        content=content,
        around=around,
        usage=usage,
        finish_reason=finish_reason,
        headers=dict(headers or {}),
    )


def status(
    code: int,
    headers: Mapping[str, str] | None = None,
    body: Body = b"",
    *,
    kind: str | None = None,
    latency_s: float = 0.0,
) -> Status:
    return Status(
        kind=kind or f"http_{code}", latency_s=latency_s, code=code, headers=dict(headers or {}), body=body
    )


def echo_secret(code: int, secret: str, offset: int, *, raw: bool = False, pad: str = "q") -> Status:
    """An error body quoting ``secret`` after ``offset`` characters of padding: in a JSON error message, or as the
    raw text of the body (``raw``)."""
    if raw:
        return status(code, body=pad * offset + f" raw {secret} body", kind=f"echo{code}raw")
    message = pad * offset + f"{secret} is not allowed here"
    return status(
        code,
        body={"error": {"message": message, "type": "server_error", "code": None}},
        kind=f"echo{code}",
    )


def echo_authorization(code: int = 401) -> Status:
    """An auth error that quotes the Authorization header it received, as some gateways do."""

    def body(request: Request) -> Mapping[str, Any]:
        return {
            "error": {
                "message": f"Invalid API key provided: {request.authorization}",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            }
        }

    return status(code, body=body, kind=f"echo{code}auth")


def hang(for_s: float | None = None) -> Hang:
    return Hang(kind="hang", for_s=for_s)


def reset(partial: bytes = b"") -> Reset:
    return Reset(kind="reset", partial=partial)


def slow(latency_s: float, reply: Reply | None = None) -> Reply:
    """``reply`` (a valid answer by default) sent after ``latency_s`` seconds."""
    return dataclasses.replace(reply or ok(), latency_s=latency_s)


def random_text(chars: int) -> str:
    """Text zlib cannot shrink below 3/4 of its size (base64 of random bytes): a huge answer that fills the disk
    fast. Quick to make, so the server's loop is not held up while it is generated."""
    return base64.b64encode(os.urandom(chars)).decode()[:chars]


def schema_instance(schema: Any) -> Any:
    """The simplest value a JSON schema accepts: first enum value, minimum, minItems items, every property."""
    if not isinstance(schema, dict):
        return None
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        return {name: schema_instance(sub) for name, sub in schema.get("properties", {}).items()}
    if kind == "array":
        count = int(schema.get("minItems", 0))
        items = schema.get("items", {})
        if schema.get("uniqueItems") and isinstance(items, dict):
            if isinstance(items.get("enum"), list):
                return list(items["enum"][:count])
            low = int(items.get("minimum", 0))
            return [low + index for index in range(count)]
        return [schema_instance(items) for _ in range(count)]
    if kind == "integer":
        return int(schema.get("minimum", 0))
    if kind == "number":
        return float(schema.get("minimum", 0))
    if kind == "boolean":
        return False
    if kind == "string":
        return "the hostile server's answer"
    return None


def _content(request: Request, reply: Answer) -> str:
    if reply.content is not None:
        return reply.content
    schema = request.schema
    if schema is not None:
        answer = schema_instance(schema)
    else:  # no response_format: the all-at-once answer, from the prompt
        agents = request.agents or ["unknown"]
        answer = {"reason": "the hostile server's answer", "responsible_role": agents[0], "root_step": 0}
    if not isinstance(answer, dict):
        answer = {}
    answer.update(reply.fields)
    before, after = reply.around
    return before + json.dumps(answer, ensure_ascii=False) + after


# ------------------------------------------------------------------------------------------------ the log


@dataclass(slots=True)
class LogEntry:
    """One request as the server handled it: the ground truth a test compares results.db with.

    Attributes:
        seq: 1-based arrival number.
        path: URL path.
        arrived_at / answered_at: wall-clock times (Unix seconds); ``answered_at`` None while in flight or when
            the connection was dropped without an answer (hang, reset).
        digest: `request_digest` of messages + max_tokens; None when the body was not JSON.
        kind: the reply's label (``ok``, ``http_429``, ``hang``, ...).
        status: the HTTP status sent; None when none was (hang, reset, still in flight).
        completion_id: the unique ``id`` of a completion the server served.
        billed_prompt_tokens / billed_completion_tokens: what the server charged (its own count).
        billed_usd: those tokens at the server's prices.
        auth_sha256: SHA-256 of the Authorization header, None when absent.
    """

    seq: int
    path: str
    arrived_at: float
    digest: str | None
    auth_sha256: str | None
    kind: str = ""
    status: int | None = None
    answered_at: float | None = None
    completion_id: str | None = None
    billed_prompt_tokens: int = 0
    billed_completion_tokens: int = 0
    billed_usd: float = 0.0

    @property
    def served(self) -> bool:
        """An answer (HTTP 200 with a completion) left the server: the provider charged for it."""
        return self.completion_id is not None


Policy = Callable[[Request], Reply] | Reply


class HostileServer:
    """An OpenAI-compatible server on 127.0.0.1 (free port) whose every answer is chosen by ``policy``.

    ``policy`` may be replaced at any time (e.g. made healthy before a resume). ``log()`` returns a snapshot of the
    request log; ``chat_log()`` only the chat requests.
    """

    def __init__(
        self,
        policy: Policy | None = None,
        *,
        prices: Prices = Prices(),
        model: str = "hostile-model",
        lifetime_s: float = 300.0,
    ) -> None:
        self.policy: Policy = policy if policy is not None else ok()
        self.prices = prices
        self.model = model
        self.lifetime_s = lifetime_s
        self.policy_errors: list[str] = []
        self._token = secrets.token_hex(4)
        self._lock = threading.Lock()
        self._log: list[LogEntry] = []
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._closing: asyncio.Event | None = None
        self._lifetime: asyncio.TimerHandle | None = None

    # ---------------------------------------------------------------------------------------- lifetime

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._port}/v1"

    async def start(self) -> None:
        self._closing = asyncio.Event()
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runner = runner
        self._port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is None:
            return
        if self._closing is not None:
            self._closing.set()  # wakes hanging and slow handlers so that shutdown does not wait for them
        await runner.cleanup()

    async def __aenter__(self) -> HostileServer:
        await self.start()
        self._lifetime = asyncio.get_running_loop().call_later(
            self.lifetime_s, lambda: asyncio.ensure_future(self.stop())
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._lifetime is not None:
            self._lifetime.cancel()
        await self.stop()

    @contextlib.contextmanager
    def running_in_thread(self) -> Iterator[HostileServer]:
        """Serve from a thread with its own event loop (for sweeps in child processes), stopped on exit."""
        ready = threading.Event()
        failure: list[BaseException] = []
        stop_requested = threading.Event()

        async def serve() -> None:
            await self.start()
            ready.set()
            deadline = time.monotonic() + self.lifetime_s
            while not stop_requested.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await self.stop()

        def main() -> None:
            try:
                asyncio.run(serve())
            except BaseException as exc:  # reported to the test thread
                failure.append(exc)
                ready.set()

        thread = threading.Thread(target=main, name="hostile-server", daemon=True)
        thread.start()
        if not ready.wait(15) or failure:
            raise RuntimeError(f"the hostile server did not start: {failure}")
        try:
            yield self
        finally:
            stop_requested.set()
            thread.join(10)

    # ---------------------------------------------------------------------------------------- the log

    def log(self) -> list[LogEntry]:
        """A snapshot of every request so far, in arrival order."""
        with self._lock:
            return [dataclasses.replace(entry) for entry in self._log]

    def chat_log(self) -> list[LogEntry]:
        return [entry for entry in self.log() if entry.path.endswith("/chat/completions")]

    def served(self) -> list[LogEntry]:
        """Chat answers the server served (and billed)."""
        return [entry for entry in self.chat_log() if entry.served]

    def billed_usd(self) -> float:
        return sum(entry.billed_usd for entry in self.chat_log())

    def wait_for(self, predicate: Callable[[list[LogEntry]], bool], timeout_s: float) -> bool:
        """Poll the chat log (from another thread) until ``predicate`` holds; False when ``timeout_s`` passed."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self.chat_log()):
                return True
            time.sleep(0.02)
        return predicate(self.chat_log())

    # ---------------------------------------------------------------------------------------- handlers

    async def _models(self, request: web.Request) -> web.Response:
        self._append(request, None)
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    def _append(self, request: web.Request, body: Any) -> tuple[Request, LogEntry]:
        authorization = request.headers.get("Authorization")
        with self._lock:
            seq = len(self._log) + 1
            seen = Request(seq, request.path, body, authorization, time.time())
            entry = LogEntry(
                seq=seq,
                path=request.path,
                arrived_at=seen.arrived_at,
                digest=seen.digest,
                auth_sha256=hashlib.sha256(authorization.encode()).hexdigest() if authorization else None,
            )
            self._log.append(entry)
        return seen, entry

    def _update(self, entry: LogEntry, **values: Any) -> None:
        with self._lock:
            for name, value in values.items():
                setattr(entry, name, value)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        seen, entry = self._append(request, body)
        policy = self.policy
        try:
            reply = policy(seen) if callable(policy) else policy
        except Exception as exc:  # a broken policy is the test's bug: say so in the answer and the log
            self.policy_errors.append(f"request {seen.seq}: {type(exc).__name__}: {exc}")
            reply = status(599, body=f"policy error: {exc}", kind="policy_error")
        self._update(entry, kind=reply.kind)
        if reply.latency_s and not await self._wait(reply.latency_s):
            _drop_connection(request)  # the server is stopping: nothing more is sent
            return web.Response(status=200)
        if isinstance(reply, Stream):
            return await self._stream(request, seen, entry, reply)
        if isinstance(reply, Flood):
            return await self._flood(request, entry, reply)
        if isinstance(reply, Answer):
            return self._answer(seen, entry, reply)
        if isinstance(reply, Status):
            return self._status(seen, entry, reply)
        if isinstance(reply, Hang):
            await self._wait(reply.for_s if reply.for_s is not None else math.inf)
            _drop_connection(request)
            return web.Response(status=200)  # never written: the transport is gone
        if isinstance(reply, Reset):
            if reply.partial:
                response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
                response.content_length = len(reply.partial) * 100
                await response.prepare(request)
                await response.write(reply.partial)
            _drop_connection(request)
            return web.Response(status=200)
        raise TypeError(f"not a reply: {reply!r}")

    async def _wait(self, seconds: float) -> bool:
        """Sleep ``seconds``; False when the server started stopping meanwhile."""
        assert self._closing is not None
        if self._closing.is_set():
            return False
        try:
            await asyncio.wait_for(self._closing.wait(), None if math.isinf(seconds) else seconds)
        except TimeoutError:
            return True
        return False

    def _answer(self, seen: Request, entry: LogEntry, reply: Answer) -> web.Response:
        content = _content(seen, reply)
        completion_id = f"chatcmpl-hostile-{self._token}-{seen.seq}"
        prompt_tokens, completion_tokens = reply.usage.billed(seen, len(content))
        head = json.dumps(
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": reply.finish_reason,
                    }
                ],
            },
            ensure_ascii=True,  # a lone surrogate in the answer becomes a \ud800 escape in the body
        )
        if reply.usage.report == "honest":
            usage_text = json.dumps(
                {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                }
            )
        elif reply.usage.report == "raw":
            usage_text = reply.usage.raw_json
        else:
            usage_text = ""
        text = head if not usage_text else head[:-1] + f', "usage": {usage_text}}}'
        self._update(
            entry,
            status=200,
            answered_at=time.time(),
            completion_id=completion_id,
            billed_prompt_tokens=prompt_tokens,
            billed_completion_tokens=completion_tokens,
            billed_usd=self.prices.usd(prompt_tokens, completion_tokens),
        )
        return web.Response(
            status=200,
            body=text.encode("utf-8"),
            content_type="application/json",
            headers=dict(reply.headers),
        )

    async def _stream(
        self, request: web.Request, seen: Request, entry: LogEntry, reply: Stream
    ) -> web.StreamResponse:
        body = seen.body if isinstance(seen.body, dict) else {}
        completion_id = f"chatcmpl-hostile-{self._token}-{seen.seq}"
        answer = _content(seen, Answer(kind="stream", content=reply.content))
        pieces = [answer[i : i + reply.chunk_chars] for i in range(0, len(answer), reply.chunk_chars)]
        prompt_tokens = math.ceil(seen.prompt_chars / CHARS_PER_TOKEN)
        sent = 0

        def bill() -> None:
            self._update(
                entry,
                completion_id=completion_id,
                billed_prompt_tokens=prompt_tokens,
                billed_completion_tokens=sent,
                billed_usd=self.prices.usd(prompt_tokens, sent),
            )

        if body.get("stream") is not True:
            # Asked for one body: the same answer after the time its chunks would have taken.
            chunks = reply.thinking + len(pieces)
            if not await self._wait(reply.interval_s * (chunks + reply.keepalives)):
                _drop_connection(request)
                return web.Response(status=200)
            sent = chunks
            bill()
            self._update(entry, status=200, answered_at=time.time())
            message: dict[str, Any] = {"role": "assistant", "content": answer}
            if reply.thinking:
                message["reasoning_content"] = "think " * reply.thinking
            return web.json_response(
                {
                    "id": completion_id,
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": self.model,
                    "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": sent,
                        "total_tokens": prompt_tokens + sent,
                    },
                }
            )

        response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        self._update(entry, status=200)

        def event(delta: Mapping[str, Any], finish_reason: str | None = None) -> bytes:
            chunk = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }
            return b"data: " + json.dumps(chunk).encode() + b"\n\n"

        def tokens() -> Iterator[Mapping[str, Any]]:
            if reply.endless:
                while True:
                    yield {"reasoning_content": "x" * reply.filler_chars}
            for _ in range(reply.thinking):
                yield {"reasoning_content": "think "}
            for piece in pieces:
                yield {"content": piece}

        try:
            await response.write(event({"role": "assistant", "content": ""}))
            for _ in range(reply.keepalives):
                if not await self._wait(reply.interval_s):
                    raise ConnectionResetError
                await response.write(b": keep-alive\n\n")
            pending: list[bytes] = []
            for delta in tokens():
                if reply.stall_after is not None and sent >= reply.stall_after:
                    await response.write(b"".join(pending))
                    bill()
                    await self._wait(reply.stall_s if reply.stall_s is not None else math.inf)
                    _drop_connection(request)
                    return response
                if reply.drop_after is not None and sent >= reply.drop_after:
                    await response.write(b"".join(pending))
                    bill()
                    _drop_connection(request)
                    return response
                pending.append(event(delta))
                sent += 1
                if len(pending) >= reply.batch:
                    if reply.interval_s and not await self._wait(reply.interval_s):
                        raise ConnectionResetError
                    await response.write(b"".join(pending))
                    pending.clear()
                if sent % 256 == 0:
                    bill()
            if pending:
                await response.write(b"".join(pending))
            bill()
            await response.write(event({}, reply.finish_reason))
            options = body.get("stream_options")
            if isinstance(options, dict) and options.get("include_usage") is True:
                usage = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": sent,
                    "total_tokens": prompt_tokens + sent,
                }
                chunk = {
                    "id": completion_id,
                    "object": "chat.completion.chunk",
                    "model": self.model,
                    "choices": [],
                    "usage": usage,
                }
                await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            self._update(entry, answered_at=time.time())
        except (ConnectionResetError, ConnectionError):
            bill()  # the client went (or the server is stopping): what was generated was billed
            _drop_connection(request)
        return response

    async def _flood(self, request: web.Request, entry: LogEntry, reply: Flood) -> web.StreamResponse:
        content_type = "text/event-stream" if reply.sse else "application/json"
        response = web.StreamResponse(status=200, headers={"Content-Type": content_type})
        await response.prepare(request)
        self._update(entry, status=200)
        if reply.sse:
            event = (
                b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"' + b"x" * 1000 + b'"}}]}\n\n'
            )
            block = event * 64
        else:
            block = b'{"choices": [{"message": {"content": "' + b"x" * 65_000
        assert self._closing is not None
        try:
            while not self._closing.is_set():
                await response.write(block)
        except (ConnectionResetError, ConnectionError):
            pass
        _drop_connection(request)
        return response

    def _status(self, seen: Request, entry: LogEntry, reply: Status) -> web.Response:
        body = reply.body(seen) if callable(reply.body) else reply.body
        if isinstance(body, Mapping):
            data, content_type = json.dumps(body).encode(), "application/json"
        elif isinstance(body, str):
            data, content_type = body.encode(), "text/plain"
        else:
            data, content_type = body, "application/json"
        self._update(entry, status=reply.code, answered_at=time.time())
        headers = {"Content-Type": content_type, **reply.headers}
        return web.Response(status=reply.code, body=data, headers=headers)


def _drop_connection(request: web.Request) -> None:
    """Close the connection with a TCP reset, as a crashed proxy does."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


# ------------------------------------------------------------------------------------------------ results.db


def db_rows(db: Path, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
    connection = sqlite3.connect(db)
    try:
        connection.row_factory = sqlite3.Row
        return connection.execute(sql, params).fetchall()
    finally:
        connection.close()


def integrity_check(db: Path) -> str:
    return str(db_rows(db, "PRAGMA integrity_check")[0][0])


def _blobs(connection: sqlite3.Connection) -> Iterator[tuple[str, bytes]]:
    for sha, data, text in connection.execute("SELECT sha256, zlib_data, text FROM blobs"):
        if text is not None:  # since migration 4 a blob under 64 KiB is kept as text, a larger one compressed
            yield str(sha), str(text).encode()
            continue
        try:
            yield str(sha), zlib.decompress(data)
        except zlib.error:
            yield str(sha), b""


@dataclass(frozen=True, slots=True)
class StoredCall:
    """A calls row with what its blobs say: the completion id in the raw body, the request's digest."""

    call_id: int
    item_id: str
    status: str
    cache_key: str | None
    completion_id: str | None
    digest: str | None


def stored_calls(db: Path) -> list[StoredCall]:
    """Every calls row, joined to the completion id inside its stored raw response and its request's digest."""
    connection = sqlite3.connect(db)
    try:
        blobs = dict(_blobs(connection))
        rows = connection.execute(
            "SELECT call_id, item_id, status, cache_key, request_sha256, response_sha256 FROM calls ORDER BY call_id"
        ).fetchall()
    finally:
        connection.close()
    calls = []
    for call_id, item_id, row_status, cache_key, request_sha, response_sha in rows:
        body = blobs.get(response_sha, b"") if response_sha else b""
        found = _COMPLETION_ID.search(body)
        digest = None
        if request_sha and blobs.get(request_sha):
            try:
                request = json.loads(blobs[request_sha])
                digest = request_digest(request.get("messages"), request.get("max_tokens"))
            except ValueError:
                digest = None
        calls.append(
            StoredCall(
                call_id=call_id,
                item_id=item_id,
                status=row_status,
                cache_key=cache_key,
                completion_id=found.group().decode() if found else None,
                digest=digest,
            )
        )
    return calls


def _answer_rows(db: Path) -> Counter[str]:
    """Completion id -> calls rows with status ok/length that hold it (cached replays not counted)."""
    return Counter(
        call.completion_id
        for call in stored_calls(db)
        if call.status in ("ok", "length") and call.completion_id is not None
    )


def unstored_answers(log: Iterable[LogEntry], db: Path) -> list[LogEntry]:
    """Answers the server served (and billed) that have no ok/length calls row."""
    stored = _answer_rows(db)
    return [entry for entry in log if entry.served and stored[entry.completion_id or ""] == 0]


def answer_row_counts(log: Iterable[LogEntry], db: Path) -> Counter[int]:
    """How many served answers have 0, 1, 2, ... ok/length calls rows (a healthy store: all have exactly 1)."""
    stored = _answer_rows(db)
    return Counter(stored[entry.completion_id or ""] for entry in log if entry.served)


def ok_rows_per_cache_key(db: Path, statuses: tuple[str, ...] = ("ok", "length")) -> Counter[str]:
    marks = ",".join("?" * len(statuses))
    rows = db_rows(
        db, f"SELECT cache_key, COUNT(*) FROM calls WHERE status IN ({marks}) GROUP BY cache_key", statuses
    )
    return Counter({str(row[0]): int(row[1]) for row in rows})


def answered_twice(log: Iterable[LogEntry]) -> dict[str, int]:
    """Request digests the server answered with a 200 more than once, and how often."""
    counts = Counter(entry.digest for entry in log if entry.served and entry.digest)
    return {digest: count for digest, count in counts.items() if count > 1}


def resent_after_stored(log: Iterable[LogEntry], db: Path) -> list[LogEntry]:
    """Answers served for a request that arrived after an answer to the same request had been served and stored.

    An answer lost with a killed or cancelled call may be paid again on resume; one that reached results.db must
    never be.
    """
    entries = list(log)
    stored_ids = set(_answer_rows(db))
    stored_at: dict[str, float] = {}
    for entry in entries:
        if entry.served and entry.completion_id in stored_ids and entry.digest and entry.answered_at:
            stored_at[entry.digest] = min(stored_at.get(entry.digest, math.inf), entry.answered_at)
    return [
        entry
        for entry in entries
        if entry.served and entry.digest in stored_at and entry.arrived_at > stored_at[entry.digest]
    ]


# ------------------------------------------------------------------------------------------------ secrets


def make_secret(seed: int | None = None) -> str:
    """``sk-proj-`` and 48 hex digits, upper case, every 8 consecutive digits holding a letter.

    Upper-case letters keep the key's fragments apart from the lower-case SHA-256 digests results.db is full of
    (an all-digit 8-character window could occur in one by chance).
    """
    rng = random.Random(seed)
    while True:
        digits = "".join(rng.choice("0123456789ABCDEF") for _ in range(48))
        if all(any(c.isalpha() for c in digits[i : i + 8]) for i in range(48 - 7)):
            return "sk-proj-" + digits


def _fragments(secret: str, width: int) -> list[str]:
    return sorted({secret[i : i + width] for i in range(len(secret) - width + 1)})


def find_secret(
    secret: str,
    *,
    db: Path | None = None,
    texts: Mapping[str, str] | None = None,
    files: Iterable[Path] = (),
    width: int = 8,
) -> list[str]:
    """Where any ``width``-character substring of ``secret`` occurs: results.db's file bytes (with ``-wal``),
    every decompressed blob, the given texts (stdout, stderr) and files. Empty when it is nowhere."""
    fragments = _fragments(secret, width)
    found: list[str] = []

    def scan(where: str, data: bytes | str) -> None:
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogatepass")
        hits = [fragment for fragment in fragments if fragment.encode() in data]
        if hits:
            found.append(f"{where}: {len(hits)} fragments, e.g. {hits[0]!r}")

    paths = list(files)
    if db is not None:
        # File bytes first: opening the database may checkpoint and remove the WAL.
        paths = [db, db.with_name(db.name + "-wal"), *paths]
    for path in paths:
        if path.is_file():
            scan(str(path), path.read_bytes())
    if db is not None and db.is_file():
        connection = sqlite3.connect(db)
        try:
            for sha, data in _blobs(connection):
                scan(f"blob {sha}", data)
        finally:
            connection.close()
    for where, text in (texts or {}).items():
        scan(where, text)
    return found
