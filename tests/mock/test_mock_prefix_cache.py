"""The simulator's prefix cache model: a hit on a first message it holds, least-recently-used eviction."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rcarun.mock import MockConfig, MockServer

from .conftest import PostChat

Body = Callable[..., dict[str, Any]]

SYSTEM_TOKENS = 100 + 4  # 400 characters at 4 per token, plus the message overhead


def system(name: str) -> str:
    return name + "s" * (400 - len(name))


async def cached(post_chat: PostChat, server: MockServer, body: dict[str, Any]) -> int:
    reply = await post_chat(server, body)
    assert reply.status == 200
    return int(reply.body["usage"]["prompt_tokens_details"]["cached_tokens"])


async def test_same_first_message_hits(post_chat: PostChat, make_body: Body) -> None:
    async with MockServer(MockConfig(latency_s=0.0, prefix_cache_entries=2)) as server:
        first = await cached(post_chat, server, make_body("stage 1", system=system("a")))
        second = await cached(post_chat, server, make_body("stage 2", system=system("a")))
        other = await cached(post_chat, server, make_body("stage 1", system=system("b")))
        assert (server.prefix_hits, server.prefix_misses) == (1, 2)
        server.reset()
        assert (server.prefix_hits, server.prefix_misses) == (0, 0)
        after_reset = await cached(post_chat, server, make_body("stage 3", system=system("a")))
    # Only the shared first message is served from the cache, never the differing last one.
    assert (first, second, other, after_reset) == (0, SYSTEM_TOKENS, 0, 0)


async def test_least_recently_used_is_evicted(post_chat: PostChat, make_body: Body) -> None:
    async with MockServer(MockConfig(latency_s=0.0, prefix_cache_entries=2)) as server:
        for name in ("a", "b"):
            await cached(post_chat, server, make_body("fill", system=system(name)))
        # "a" is used again, so "b" is now the least recently used and goes when "c" arrives.
        assert await cached(post_chat, server, make_body("touch", system=system("a"))) == SYSTEM_TOKENS
        assert await cached(post_chat, server, make_body("new", system=system("c"))) == 0
        assert await cached(post_chat, server, make_body("again", system=system("a"))) == SYSTEM_TOKENS
        assert await cached(post_chat, server, make_body("again", system=system("b"))) == 0
        assert (server.prefix_hits, server.prefix_misses) == (2, 4)


async def test_off_by_default_keeps_the_old_flag(post_chat: PostChat, make_body: Body) -> None:
    """Without a capacity every first message seen is reported cached and no counter moves."""
    async with MockServer(MockConfig(latency_s=0.0)) as server:
        for name in ("a", "b", "c"):
            await cached(post_chat, server, make_body("fill", system=system(name)))
        assert await cached(post_chat, server, make_body("again", system=system("a"))) == SYSTEM_TOKENS
        assert (server.prefix_hits, server.prefix_misses) == (0, 0)


@pytest.mark.parametrize(
    ("field", "value"),
    [("prefix_cache_entries", -1), ("prefix_cache_entries", True), ("latency_per_prompt_token_s", -1.0)],
)
def test_invalid_values_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        MockConfig.from_mapping({field: value})


def test_round_trips_as_json() -> None:
    config = MockConfig(prefix_cache_entries=8, latency_per_prompt_token_s=0.0001)
    assert MockConfig.from_json(config.to_json()) == config
