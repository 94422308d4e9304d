"""Replica balancing: fewest outstanding requests first, ties round-robin, over real loopback servers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from rcarun.backends import ChatMessage, ChatRequest, ReplicaBalancer, create_backend

from .helpers import CannedServer, Handler, completion, reply, settings_for

Canned = Callable[[Handler], Awaitable[CannedServer]]

REQUEST = ChatRequest(messages=(ChatMessage("user", "hi"),), max_tokens=8)


def test_ties_go_round_robin() -> None:
    balancer = ReplicaBalancer(("a", "b", "c"))
    picks = []
    for _ in range(6):
        index = balancer.acquire()
        picks.append(index)
        balancer.release(index)
    assert picks == [0, 1, 2, 0, 1, 2]
    assert balancer.outstanding() == (0, 0, 0)


def test_fewest_outstanding_wins() -> None:
    balancer = ReplicaBalancer(("a", "b", "c"))
    held = [balancer.acquire() for _ in range(3)]  # one each
    assert sorted(held) == [0, 1, 2]
    balancer.release(1)
    assert balancer.acquire() == 1  # the only replica with nothing in flight
    balancer.release(0)
    balancer.release(2)
    assert balancer.outstanding() == (0, 1, 0)
    assert {balancer.acquire(), balancer.acquire()} == {0, 2}


def test_single_replica() -> None:
    balancer = ReplicaBalancer(("only",))
    with balancer.lease() as url:
        assert url == "only" and balancer.outstanding() == (1,)
    assert balancer.outstanding() == (0,)


async def test_slow_replica_gets_fewer_calls(canned: Canned, transport_name: str) -> None:
    release_slow = asyncio.Event()
    slow_started = asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        slow_started.set()
        await release_slow.wait()  # held until the test lets go: "slow" without any timing
        return web.json_response(completion(content="slow"))

    slow_server = await canned(slow)
    fast_server = await canned(reply(completion(content="fast")))
    settings = settings_for(
        (slow_server.base_url, fast_server.base_url), provider="vllm", transport=transport_name
    )
    backend = create_backend(settings)
    try:
        first = asyncio.create_task(backend.chat(REQUEST))  # tie: round-robin starts at the slow replica
        await slow_started.wait()
        fast_texts = [(await backend.chat(REQUEST)).text for _ in range(5)]
        release_slow.set()
        slow_result = await first
    finally:
        await backend.aclose()
    assert fast_texts == ["fast"] * 5  # the slow replica still had one in flight, the fast one none
    assert (len(slow_server.seen), len(fast_server.seen)) == (1, 5)
    assert slow_result.text == "slow" and slow_result.endpoint == slow_server.base_url


async def test_idle_replicas_alternate(canned: Canned, transport_name: str) -> None:
    servers = [await canned(reply(completion())) for _ in range(2)]
    settings = settings_for(
        tuple(server.base_url for server in servers), provider="vllm", transport=transport_name
    )
    backend = create_backend(settings)
    try:
        endpoints = [(await backend.chat(REQUEST)).endpoint for _ in range(4)]
    finally:
        await backend.aclose()
    assert endpoints == [servers[0].base_url, servers[1].base_url] * 2
