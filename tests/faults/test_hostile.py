"""The hostile server itself: what each builder puts on the wire and what the log records, inside a test's loop.

The fault tests take the server's log as ground truth, so the log and the bodies are pinned here byte for byte
where it matters: ``Infinity`` and 10**25 written verbatim, a lone surrogate as a ``\\ud800`` escape, usage
billed even when not reported, a reset that sends no status.
"""

from __future__ import annotations

import json
import math

import aiohttp
import pytest

from faults.hostile import (
    HostileServer,
    Prices,
    Reply,
    Request,
    echo_authorization,
    echo_secret,
    hang,
    infinite_usage,
    no_usage,
    ok,
    request_digest,
    reset,
    schema_instance,
    status,
)

_SCHEMA = {
    "type": "object",
    "properties": {
        "reason": {"type": "string"},
        "responsible_role": {"type": "string", "enum": ["Planner", "Coder"]},
        "root_step": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["reason", "responsible_role", "root_step"],
}
_MESSAGES = [{"role": "system", "content": "s" * 40}, {"role": "user", "content": "u" * 60}]
_BODY = {
    "model": "m",
    "messages": _MESSAGES,
    "max_tokens": 100,
    "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": _SCHEMA}},
}


async def _post(server: HostileServer, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{server.base_url}/chat/completions", json=_BODY, headers=headers) as response,
    ):
        return response.status, await response.read()


async def test_an_answer_follows_the_schema_and_the_log_bills_it() -> None:
    async with HostileServer(ok(), prices=Prices(input_per_mtok=1e6, output_per_mtok=0)) as server:
        code, body = await _post(server, {"Authorization": "Bearer k"})
    payload = json.loads(body)
    answer = json.loads(payload["choices"][0]["message"]["content"])
    assert answer == {"reason": "the hostile server's answer", "responsible_role": "Planner", "root_step": 0}
    (entry,) = server.chat_log()
    assert code == 200 and entry.status == 200 and entry.completion_id == payload["id"]
    assert entry.digest == request_digest(_MESSAGES, 100)
    assert entry.billed_prompt_tokens == math.ceil(100 / 4) == payload["usage"]["prompt_tokens"]
    assert entry.billed_usd == pytest.approx(25.0)
    assert entry.auth_sha256 is not None and "Bearer" not in entry.auth_sha256


async def test_nonsense_is_written_verbatim() -> None:
    def policy(request: Request) -> Reply:
        return ok(root_step=10**25, reason="cut \ud800", usage=infinite_usage())

    async with HostileServer(policy) as server:
        _, body = await _post(server)
    text = body.decode()
    assert '"prompt_tokens": Infinity' in text
    assert "cut \\ud800" in text  # one escape in the body: the content holds the lone surrogate itself
    assert "\ud800" in json.loads(body)["choices"][0]["message"]["content"]
    assert "10000000000000000000000000" in text


async def test_usage_missing_is_still_billed() -> None:
    async with HostileServer(ok(usage=no_usage(prompt_mult=2))) as server:
        _, body = await _post(server)
    assert "usage" not in json.loads(body)
    assert server.chat_log()[0].billed_prompt_tokens == 50


async def test_errors_echo_what_they_are_told_to() -> None:
    replies = iter(
        [echo_secret(500, "SECRET", 7), echo_authorization(), status(429, {"Retry-After": "1e400"})]
    )
    async with HostileServer(lambda request: next(replies)) as server:
        first = await _post(server)
        second = await _post(server, {"Authorization": "Bearer KEY"})
        third = await _post(server)
    assert first[0] == 500 and json.loads(first[1])["error"]["message"].startswith("q" * 7 + "SECRET")
    assert second[0] == 401 and "Bearer KEY" in second[1].decode()
    assert third[0] == 429
    assert [entry.kind for entry in server.chat_log()] == ["echo500", "echo401auth", "http_429"]
    assert not any(entry.served for entry in server.chat_log())


async def test_a_reset_and_a_hang_send_no_status() -> None:
    async with HostileServer(reset()) as server:
        with pytest.raises(aiohttp.ClientError):
            await _post(server)
        server.policy = hang(for_s=0.2)
        with pytest.raises(aiohttp.ClientError):
            await _post(server)
    assert [(entry.kind, entry.status) for entry in server.chat_log()] == [("reset", None), ("hang", None)]


def test_schema_instances_satisfy_counts_and_uniqueness() -> None:
    schema = {
        "type": "object",
        "properties": {
            "ids": {"type": "array", "items": {"type": "integer", "minimum": 3}, "minItems": 3},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 2, "uniqueItems": True},
            "step": {"type": ["integer", "null"], "minimum": 1},
            "flag": {"type": "boolean"},
        },
    }
    assert schema_instance(schema) == {"ids": [3, 3, 3], "tags": ["a", "b"], "step": 1, "flag": False}
