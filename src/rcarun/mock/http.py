"""The simulator's HTTP edge: reading a chat request, writing JSON and error bodies, dropping a connection."""

from __future__ import annotations

import contextlib
import hmac
import json
import socket
import struct
from collections.abc import Mapping
from typing import Any

from aiohttp import web

__all__ = [
    "JSON_CONTENT_TYPE",
    "RequestError",
    "drop_connection",
    "error_response",
    "is_authorized",
    "json_response",
    "parse_body",
]

JSON_CONTENT_TYPE = "application/json"


class RequestError(Exception):
    """A request the server answers with a 400."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body with ``max_tokens``, ``temperature``, ``model`` and ``stream`` normalised (and
    ``include_usage`` added: whether ``stream_options`` asked for the usage chunk).

    Raises:
        RequestError: the body is not a valid chat-completion request.
    """
    try:
        body = json.loads(raw)
    except ValueError:
        raise RequestError("We could not parse the JSON body of your request.") from None
    if not isinstance(body, dict):
        raise RequestError("The request body must be a JSON object.")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty array.", "messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{index}] must be an object with a 'role'.", f"messages[{index}]")
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise RequestError(f"max_tokens must be a positive integer, got {max_tokens!r}.", "max_tokens")
    body["max_tokens"] = max_tokens
    temperature = body.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, int | float)
    ):
        raise RequestError(f"temperature must be a number, got {temperature!r}.", "temperature")
    body["temperature"] = temperature
    model = body.get("model")
    body["model"] = model if isinstance(model, str) else ""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise RequestError(f"stream must be a boolean, got {stream!r}.", "stream")
    body["stream"] = stream is True
    body["include_usage"] = _include_usage(body.get("stream_options"))
    return body


def _include_usage(options: object) -> bool:
    include_usage: object = None
    if options is not None:
        if not isinstance(options, dict):
            raise RequestError(f"stream_options must be an object, got {options!r}.", "stream_options")
        include_usage = options.get("include_usage")
        if include_usage is not None and not isinstance(include_usage, bool):
            raise RequestError(
                f"stream_options.include_usage must be a boolean, got {include_usage!r}.",
                "stream_options.include_usage",
            )
    return include_usage is True


def is_authorized(request: web.Request, expected: bytes | None) -> bool:
    """Whether the request carries the expected ``Authorization`` header (any request when none is expected)."""
    if expected is None:
        return True
    return hmac.compare_digest(request.headers.get("Authorization", "").encode(), expected)


def drop_connection(request: web.Request) -> None:
    """Close the connection with a TCP reset, as a crashed proxy or server does."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def json_response(status: int, body: Any, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, body=json.dumps(body).encode(), content_type=JSON_CONTENT_TYPE, headers=headers
    )


def error_response(
    status: int,
    message: str,
    error_type: str,
    code: str | int | None,
    headers: Mapping[str, str],
    param: str | None = None,
) -> web.Response:
    """An OpenAI-shaped error body: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return json_response(status, body, headers)
