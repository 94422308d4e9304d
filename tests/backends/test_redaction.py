"""No part of a key survives into an error message: scrubbed whole first, shortened after.

A provider that quotes the key near the 300-character cut once left 46 of its 48 characters in ``calls.error``
(the text was cut before the key was matched, and a cut key matches nothing). These tests put the key at every
offset of an error body and look for any 8-character piece of it in the message, through the parser alone and
through the real backend over loopback HTTP with both transports.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from rcarun.backends import ChatMessage, ChatRequest, Secret, create_backend, get_preset, parse_completion
from rcarun.backends.settings import redact_secrets
from rcarun.backends.transports import describe_failure
from rcarun.backends.wire import MAX_QUOTED_CHARS
from rcarun.errors import CallError, MalformedResponse, ServerError

from .helpers import KEY_ENV, CannedServer, Handler, settings_for

Canned = Callable[[Handler], Awaitable[CannedServer]]

# Split so that the tree holds no key-shaped literal. The shape of the review's key (sk-proj- and 48 hex), and a
# key of no known shape, which only the backbone's own Secret can recognise.
SK_KEY = "sk-" + "proj-" + "0123456789abcdef" * 3
PLAIN_KEY = "f0e1d2c3b4a59687" * 3
OFFSETS = range(1001)


def pieces(key: str) -> set[str]:
    """Every 8-character substring of ``key``."""
    return {key[start : start + 8] for start in range(len(key) - 7)}


def leaked(text: str, key: str) -> list[str]:
    return sorted(piece for piece in pieces(key) if piece in text)


def json_body(offset: int, key: str) -> bytes:
    return json.dumps({"error": {"message": "q" * offset + key + " tail", "type": "server_error"}}).encode()


def raw_body(offset: int, key: str) -> bytes:
    return ("q" * offset + " raw " + key + " body").encode()


def whitespace_body(offset: int, key: str) -> bytes:
    # Runs of whitespace collapse to one space: a key 2,000 bytes in can still land inside the quoted part.
    return (" \n" * offset + key + " tail").encode()


BODIES = {"json": json_body, "raw": raw_body, "whitespace": whitespace_body}


def message_for(status: int, body: bytes, **redact: Callable[[str], str]) -> str:
    with pytest.raises(CallError) as caught:
        parse_completion(
            status, {}, body, get_preset("openai-compatible"), 0.1, "http://x/v1", backbone="bb", **redact
        )
    return str(caught.value)


@pytest.mark.parametrize("status", [500, 401, 200])
@pytest.mark.parametrize("shape", list(BODIES))
@pytest.mark.parametrize("key", [SK_KEY, PLAIN_KEY], ids=["sk-key", "plain-key"])
def test_the_backbones_key_leaves_no_piece_at_any_offset(status: int, shape: str, key: str) -> None:
    redact = functools.partial(redact_secrets, secret=Secret(key))
    make = BODIES[shape]
    found = {
        offset: leaked(message, key)
        for offset in OFFSETS
        if leaked(message := message_for(status, make(offset, key), redact=redact), key)
    }
    assert found == {}
    # The quoted part still stops at the cut, and the key's place is marked.
    assert (
        len(message_for(status, make(0, key), redact=redact)) <= len("bb: HTTP 500: ") + MAX_QUOTED_CHARS + 40
    )
    assert "***" in message_for(status, make(250, key), redact=redact)


@pytest.mark.parametrize("status", [500, 200])
@pytest.mark.parametrize("shape", list(BODIES))
def test_secret_shapes_are_scrubbed_without_knowing_the_key(status: int, shape: str) -> None:
    make = BODIES[shape]
    for offset in OFFSETS:
        for quoted in (" " + SK_KEY, " Bearer " + PLAIN_KEY, " bearer " + SK_KEY):
            message = message_for(status, make(offset, quoted))
            assert not leaked(message, SK_KEY) and not leaked(message, PLAIN_KEY), (offset, quoted, message)


def test_generic_shapes_become_their_masks_and_ordinary_words_stay() -> None:
    text = f"got Bearer {PLAIN_KEY}, key {SK_KEY}; model task-classifier-v2; short sk-abc; Bearer ***"
    assert redact_secrets(text) == (
        # A bearer token runs to the next space or quote: punctuation glued to it goes too, a key never stays.
        "got Bearer *** key sk-***; model task-classifier-v2; short sk-abc; Bearer ***"
    )
    assert redact_secrets(f"x{PLAIN_KEY}x", Secret(PLAIN_KEY)) == "x***x"


@pytest.mark.parametrize("offset", range(240, 320))
def test_transport_failures_are_scrubbed_before_they_are_cut(offset: int) -> None:
    error = OSError("q" * offset + PLAIN_KEY + " then " + SK_KEY)
    detail = describe_failure(error, Secret(PLAIN_KEY))
    assert not leaked(detail, PLAIN_KEY) and not leaked(detail, SK_KEY)
    assert describe_failure(OSError("bad \udcff header"), None) == "OSError: bad \ufffd header"


# ------------------------------------------------------------------------ through the backend, over loopback

PADS = range(230, 306, 5)  # the echo lands on both sides of the 300-character cut
SHAPES = ("json", "raw", "glued")


def echo_near_the_cut() -> Handler:
    """A provider that quotes the Authorization header it got, and the bare key, near the cut, in turn."""
    calls = iter([(pad, shape) for pad in PADS for shape in SHAPES])

    async def handle(request: web.Request) -> web.StreamResponse:
        pad, shape = next(calls)
        sent = request.headers.get("Authorization", "")
        key = sent.removeprefix("Bearer ")
        if shape == "json":
            payload = {"error": {"message": "q" * pad + " raw " + sent + " body", "type": "server_error"}}
            return web.json_response(payload, status=500)
        if shape == "raw":
            return web.Response(status=500, text="q" * pad + " raw " + sent + " body")
        return web.Response(status=500, text="q" * pad + key + "q" * 40)

    return handle


async def test_a_key_echoed_near_the_cut_never_reaches_the_error_in_part(
    canned: Canned, transport_name: str, planted_key: str
) -> None:
    server = await canned(echo_near_the_cut())
    backend = create_backend(settings_for(server.base_url, transport=transport_name, api_key_env=KEY_ENV))
    request = ChatRequest(messages=(ChatMessage("user", "which step failed?"),), max_tokens=16)
    messages: list[str] = []
    try:
        for _ in range(len(PADS) * len(SHAPES)):
            with pytest.raises(CallError) as caught:
                await backend.chat(request)
            assert type(caught.value) is ServerError
            messages += [str(caught.value), repr(caught.value), *map(str, caught.value.args)]
    finally:
        await backend.aclose()
    assert all(seen.headers["Authorization"] == f"Bearer {planted_key}" for seen in server.seen)
    assert len(server.seen) == len(PADS) * len(SHAPES)
    assert [message for message in messages if leaked(message, planted_key)] == []
    assert sum("***" in message for message in messages) > len(messages) // 2


async def test_an_ok_status_quoting_the_key_is_malformed_and_scrubbed(
    canned: Canned, transport_name: str, planted_key: str
) -> None:
    async def quote_key(request: web.Request) -> web.StreamResponse:
        return web.Response(status=200, text="x" * 290 + request.headers.get("Authorization", ""))

    server = await canned(quote_key)
    backend = create_backend(settings_for(server.base_url, transport=transport_name, api_key_env=KEY_ENV))
    try:
        with pytest.raises(MalformedResponse) as caught:
            await backend.chat(ChatRequest(messages=(ChatMessage("user", "hi"),), max_tokens=16))
    finally:
        await backend.aclose()
    assert not leaked(str(caught.value), planted_key)
