"""Streamed answers: server-sent events decoded, and chat-completion chunks added up to one completion.

A streamed answer becomes the completion object an unstreamed call returns, so one parser, the store and the
cache treat both alike; `CallProgress` keeps what an attempt has received, so a cut generation is stored and
charged, never free. Formats: docs/reliability.md ("Streamed answers").
"""

from __future__ import annotations

import json
import time
from typing import Any, Final

from rcarun import jsonfast
from rcarun.jsonfast import dumps_compact

__all__ = ["CallProgress", "ChunkAssembler", "EventDecoder", "StreamError", "render_completion"]

_DONE: Final = b"[DONE]"
_REASONING_FIELDS: Final = ("reasoning_content", "reasoning")


class StreamError(Exception):
    """An event the stream cannot go on from: not JSON, not a chunk, or an in-band error (``payload``)."""

    def __init__(self, message: str, *, data: bytes, payload: Any = None) -> None:
        super().__init__(message)
        self.data = data
        self.payload = payload


class EventDecoder:
    """Incremental server-sent-events decoder: bytes in, the ``data`` of each complete event out (a trailing CR
    waits for a possible LF; comments and other fields are ignored; a cut-off last event is dropped)."""

    __slots__ = ("_data", "_rest")

    def __init__(self) -> None:
        self._rest = b""
        self._data: list[bytes] | None = None

    def feed(self, chunk: bytes) -> list[bytes]:
        """The data of every event that ``chunk`` completes, in order."""
        text = self._rest + chunk if self._rest else chunk
        if b"\r" in text:
            held = text.endswith(b"\r")
            if held:
                text = text[:-1]
            text = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            lines = text.split(b"\n")
            self._rest = lines.pop() + (b"\r" if held else b"")
        else:
            lines = text.split(b"\n")
            self._rest = lines.pop()
        events: list[bytes] = []
        data = self._data
        for line in lines:
            if not line:
                if data is not None:
                    events.append(data[0] if len(data) == 1 else b"\n".join(data))
                    data = None
                continue
            if line[0] == 0x3A:  # ":" a comment
                continue
            name, _, value = line.partition(b":")
            if name == b"data":
                if value[:1] == b" ":
                    value = value[1:]
                if data is None:
                    data = [value]
                else:
                    data.append(value)
        self._data = data
        return events


class ChunkAssembler:
    """Chat-completion chunks in, the completion object they add up to out (`completion`); deltas are joined,
    ``usage`` taken wherever it arrives, only the first choice read (rcarun asks for one)."""

    __slots__ = (
        "_content",
        "_created",
        "_id",
        "_model",
        "_reasoning",
        "_reasoning_field",
        "_tool_calls",
        "done",
        "finish_reason",
        "tokens",
        "usage",
    )

    def __init__(self) -> None:
        self._id: Any = None
        self._model: Any = None
        self._created: Any = None
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._reasoning_field = _REASONING_FIELDS[0]
        self._tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.tokens = 0
        """Deltas that carried text (answer, thinking or tool-call arguments): about one token each."""

    def add(self, data: bytes) -> bool:
        """Take one event's data; True when it carried text (`StreamError` when it cannot be taken)."""
        if data == _DONE:
            self.done = True
            return False
        try:
            chunk = jsonfast.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise StreamError("a stream event is not JSON", data=data) from None
        if type(chunk) is not dict:
            raise StreamError("a stream event is not a JSON object", data=data, payload=chunk)
        if chunk.get("error") is not None:
            raise StreamError("the stream carried an error", data=data, payload=chunk)
        if self._id is None:
            self._id = chunk.get("id")
            self._model = chunk.get("model")
            self._created = chunk.get("created")
        usage = chunk.get("usage")
        if type(usage) is dict:
            self.usage = usage
        choices = chunk.get("choices")
        if not choices or type(choices) is not list:
            return False
        choice = choices[0]
        if type(choice) is not dict:
            raise StreamError("a stream chunk's choice is not an object", data=data, payload=chunk)
        finish_reason = choice.get("finish_reason")
        if finish_reason:
            self.finish_reason = finish_reason if type(finish_reason) is str else str(finish_reason)
        usage = choice.get("usage")
        if type(usage) is dict:
            self.usage = usage
        delta = choice.get("delta")
        if type(delta) is not dict:
            delta = choice.get("message")  # a server that sends whole messages as chunks
            if type(delta) is not dict:
                return False
        carried = False
        content = delta.get("content")
        if content and type(content) is str:
            self._content.append(content)
            carried = True
        for field in _REASONING_FIELDS:
            thinking = delta.get(field)
            if thinking and type(thinking) is str:
                self._reasoning.append(thinking)
                self._reasoning_field = field
                carried = True
                break
        calls = delta.get("tool_calls")
        if calls and type(calls) is list:
            carried = self._add_tool_calls(calls) or carried
        if carried:
            self.tokens += 1
        return carried

    def _add_tool_calls(self, calls: list[Any]) -> bool:
        carried = False
        for position, call in enumerate(calls):
            if type(call) is not dict:
                continue
            index = call.get("index", position)
            if type(index) is not int:
                index = position
            entry = self._tool_calls.get(index)
            if entry is None:
                entry = self._tool_calls[index] = {"id": None, "name": "", "arguments": []}
            if isinstance(call.get("id"), str) and call["id"]:
                entry["id"] = call["id"]
            function = call.get("function")
            if type(function) is dict:
                name = function.get("name")
                if isinstance(name, str) and name:
                    entry["name"] += name
                    carried = True
                arguments = function.get("arguments")
                if isinstance(arguments, str) and arguments:
                    entry["arguments"].append(arguments)
                    carried = True
        return carried

    @property
    def text_chars(self) -> int:
        """Characters of answer, thinking text and tool calls received."""
        chars = sum(map(len, self._content)) + sum(map(len, self._reasoning))
        for entry in self._tool_calls.values():
            chars += len(entry["name"]) + sum(map(len, entry["arguments"]))
        return chars

    def completion(self) -> dict[str, Any]:
        """The completion object the chunks so far add up to (``finish_reason`` None when none arrived)."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._content)}
        if self._reasoning:
            message[self._reasoning_field] = "".join(self._reasoning)
        if self._tool_calls:
            if not self._content:
                message["content"] = None
            message["tool_calls"] = [
                {
                    "id": entry["id"] if entry["id"] is not None else f"call_{index}",
                    "type": "function",
                    "function": {"name": entry["name"], "arguments": "".join(entry["arguments"])},
                }
                for index, entry in sorted(self._tool_calls.items())
            ]
        completion: dict[str, Any] = {
            "id": self._id,
            "object": "chat.completion",
            "created": self._created,
            "model": self._model,
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}],
        }
        if self.usage is not None:
            completion["usage"] = self.usage
        return completion


class CallProgress:
    """What one attempt has received so far; the backend updates it as the answer arrives, the runner reads it
    when the attempt ends, however it ends (times are `time.perf_counter`)."""

    __slots__ = (
        "assembler",
        "bytes_received",
        "first_token_at",
        "last_token_at",
        "lost_sends",
        "sent_at",
        "status",
        "streamed",
    )

    def __init__(self) -> None:
        # Sends a reused keep-alive connection lost before any byte of an answer, each sent again once by the
        # transport without counting an attempt: (seconds from sending to the loss, why), recorded as rows.
        self.lost_sends: list[tuple[float, str]] = []
        self.sent_at = time.perf_counter()
        self.status: int | None = None
        self.streamed = False
        self.bytes_received = 0
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.assembler: ChunkAssembler | None = None

    @property
    def answered(self) -> bool:
        """The server accepted the request (a 2xx status arrived): it was generating, and charging, from then."""
        return self.status is not None and 200 <= self.status < 300

    @property
    def tokens(self) -> int:
        """Text-carrying chunks received (about one token each; 0 for an unstreamed answer)."""
        return self.assembler.tokens if self.assembler is not None else 0

    @property
    def text_chars(self) -> int:
        """Characters of answer, thinking and tool-call text received in chunks."""
        return self.assembler.text_chars if self.assembler is not None else 0

    def ttft_s(self) -> float | None:
        """Seconds from sending to the first token, when one arrived."""
        return None if self.first_token_at is None else self.first_token_at - self.sent_at

    def partial_body(self) -> bytes | None:
        """The completion the chunks received so far add up to, as a body the parser reads; None when none came."""
        if self.assembler is None or not (self.assembler.tokens or self.assembler.usage):
            return None
        return render_completion(self.assembler.completion())


def render_completion(completion: dict[str, Any]) -> bytes:
    """An assembled completion as the body stored for it: compact UTF-8 JSON, or ASCII-escaped JSON when a text
    holds an unpaired surrogate (an answer cut mid-emoji), which UTF-8 cannot carry and the parser repairs."""
    try:
        return dumps_compact(completion)
    except UnicodeEncodeError:
        return json.dumps(completion, separators=(",", ":")).encode()
