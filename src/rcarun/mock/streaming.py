"""How the simulator streams an answer: the server-sent events of OpenAI's chat-completions stream, and when each
goes out.

`stream_plan` turns one composed answer into its events (a role chunk, thinking deltas in the style's field,
content or tool-call deltas, the last choice chunk, the usage chunk or Kimi's usage inside the last choice,
``[DONE]``), each with the count of tokens generated before it; `write_on_time` writes them as they fall due.
Kept apart from `rcarun.mock.chat`, which decides what is answered and holds the request's slot meanwhile.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from aiohttp import web

from .answers import filler_text
from .config import MockConfig

__all__ = [
    "DONE_EVENT",
    "EVENT_STREAM_CONTENT_TYPE",
    "Chunk",
    "StreamPlan",
    "StreamedAnswer",
    "stream_plan",
    "write_on_time",
]

EVENT_STREAM_CONTENT_TYPE = "text/event-stream"
DONE_EVENT = b"data: [DONE]\n\n"
# A stream writes at most once per this many seconds: chunks falling due in between go out together, so tokens
# faster than this cost one write (and one wake-up) each 5 ms rather than one each, whatever the concurrency.
_MIN_WRITE_GAP_S = 0.005


class StreamedAnswer(Protocol):
    """What `stream_plan` reads of a composed answer (the server's completion)."""

    @property
    def content(self) -> str: ...
    @property
    def tool_calls(self) -> list[dict[str, Any]] | None: ...
    @property
    def reasoning_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def finish_reason(self) -> str: ...


class Chunk(NamedTuple):
    """One server-sent event of a stream and when it falls due."""

    due_tokens: int  # completion tokens generated before it goes out: due at first token + this × per-token
    tokens_sent: int  # completion tokens delivered once it is written
    data: bytes


class StreamPlan(NamedTuple):
    role: bytes  # the first chunk (``role`` and empty content), written at once
    chunks: list[Chunk]  # content-bearing chunks first, then the last choice, usage and [DONE] events
    pieces: int  # how many of ``chunks`` carry thinking, content or tool-call text


def stream_plan(
    config: MockConfig,
    completion: StreamedAnswer,
    *,
    completion_id: str,
    model: str,
    usage: Mapping[str, Any] | None,
    include_usage: bool,
    ascii_only: bool,
) -> StreamPlan:
    """The events of ``completion``: the role chunk, then every chunk with its time in tokens.

    The thinking text (when ``reasoning_field`` shows it) and the content or tool-call deltas are cut into
    pieces of ``tokens_per_chunk`` tokens; each part's tokens are spread evenly over its pieces (hidden
    thinking takes its time without a chunk). The last choice chunk, the usage chunk and ``[DONE]`` fall
    due with the last token. Chunk JSON is compact and written in key order, as ``json.dumps`` of the whole
    chunk would write it; with ``ascii_only`` (a "surrogate" answer) with ASCII escapes, so a lone ``\\ud800``
    survives.
    """

    def dumps(value: Any) -> str:
        return json.dumps(value, ensure_ascii=ascii_only, separators=(",", ":"))

    envelope = (
        f'{{"id":{dumps(completion_id)},"object":"chat.completion.chunk","created":{int(time.time())},'
        f'"model":{dumps(model)}'
    )
    head = f'data: {envelope},"choices":[{{"index":0,"delta":'.encode()
    open_tail = b',"logprobs":null,"finish_reason":null}]}\n\n'
    chunks: list[Chunk] = []
    done = 0

    def add(deltas: list[str], tokens: int) -> None:
        nonlocal done
        count = len(deltas)
        for index, delta in enumerate(deltas):
            data = head + delta.encode() + open_tail
            chunks.append(Chunk(done + index * tokens // count, done + (index + 1) * tokens // count, data))
        done += tokens

    chars = max(1.0, config.tokens_per_chunk * config.chars_per_token)
    reasoning_tokens = completion.reasoning_tokens
    field = config.reasoning_field
    thinking = ""
    if field is not None and reasoning_tokens > 0:
        thinking = filler_text(reasoning_tokens, config.chars_per_token)
    add([f'{{"{field}":{dumps(piece)}}}' for piece in _text_pieces(thinking, chars)], reasoning_tokens)
    answer_tokens = completion.completion_tokens - reasoning_tokens
    if completion.tool_calls is not None:
        add(_tool_call_deltas(completion.tool_calls, chars, dumps), answer_tokens)
    else:
        pieces = _text_pieces(completion.content, chars)
        add([f'{{"content":{dumps(piece)}}}' for piece in pieces], answer_tokens)
    content_chunks = len(chunks)

    finish = f',"logprobs":null,"finish_reason":{dumps(completion.finish_reason)}'
    moonshot = config.headers == "moonshot"
    if moonshot and usage is not None:  # Kimi: usage inside the last choice, asked for or not
        finish += f',"usage":{dumps(usage)}'
    chunks.append(Chunk(done, done, head + b"{}" + finish.encode() + b"}]}\n\n"))
    if include_usage and not moonshot and usage is not None:
        usage_event = f'data: {envelope},"choices":[],"usage":{dumps(usage)}}}\n\n'
        chunks.append(Chunk(done, done, usage_event.encode()))
    chunks.append(Chunk(done, done, DONE_EVENT))
    role = head + b'{"role":"assistant","content":""}' + open_tail
    return StreamPlan(role, chunks, content_chunks)


async def write_on_time(
    response: web.StreamResponse,
    chunks: Sequence[Chunk],
    first_token_at: float,
    per_token_s: float,
    clock: Callable[[], float],
    sent: Callable[[int], None],
) -> None:
    """Write each chunk when it falls due (``first_token_at`` + its tokens before × ``per_token_s``).

    Whatever is due goes out in one write, and writes are at least `_MIN_WRITE_GAP_S` apart (the last one is
    never held past its own time for that), so a request costs at most ~200 wake-ups a second however fast its
    tokens come. ``sent`` is told the completion tokens delivered after each write.

    Raises:
        ConnectionError: the client went away.
    """
    if not chunks:
        return
    count = len(chunks)
    end_at = first_token_at + chunks[-1].due_tokens * per_token_s
    next_write_at = -math.inf
    index = 0
    while index < count:
        due = first_token_at + chunks[index].due_tokens * per_token_s
        wake = min(max(due, next_write_at), end_at)
        now = clock()
        if wake > now:
            await asyncio.sleep(wake - now)
            now = clock()
        stop = index + 1
        while stop < count and first_token_at + chunks[stop].due_tokens * per_token_s <= now:
            stop += 1
        if stop == index + 1:
            await response.write(chunks[index].data)
        else:
            await response.write(b"".join(chunk.data for chunk in chunks[index:stop]))
        sent(chunks[stop - 1].tokens_sent)
        next_write_at = now + _MIN_WRITE_GAP_S
        index = stop


def _text_pieces(text: str, chars: float) -> list[str]:
    """``text`` in consecutive, non-empty pieces of about ``chars`` (>= 1) characters each."""
    length = len(text)
    if length == 0:
        return []
    bounds = [math.floor(index * chars) for index in range(math.ceil(length / chars))] + [length]
    return [text[start:end] for start, end in itertools.pairwise(bounds) if end > start]


def _tool_call_deltas(calls: list[dict[str, Any]], chars: float, dumps: Callable[[Any], str]) -> list[str]:
    """OpenAI's tool-call deltas: per call, one with its ``index``, ``id``, type and name (arguments ""), then
    its arguments in pieces, each with only the ``index`` and ``function.arguments``."""
    deltas: list[str] = []
    for index, call in enumerate(calls):
        function = call["function"]
        opening = {
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": function["name"], "arguments": ""},
        }
        deltas.append(dumps({"tool_calls": [opening]}))
        for piece in _text_pieces(str(function["arguments"]), chars):
            deltas.append(dumps({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    return deltas
