"""Prefix affinity: calls sharing a first message go to one home replica, unless it is down or overloaded."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from rcarun.backends import ChatMessage, ChatRequest, ReplicaBalancer, create_backend
from rcarun.backends.replicas import prefix_key

from .helpers import CannedServer, Handler, completion, reply, settings_for

Canned = Callable[[Handler], Awaitable[CannedServer]]


def keys(count: int) -> list[int]:
    return [prefix_key("system", f"trajectory {n}") for n in range(count)]


def test_prefix_key_is_stable_and_tells_roles_apart() -> None:
    assert prefix_key("user", "same") == prefix_key("user", "same")
    assert prefix_key("user", "same") != prefix_key("system", "same")
    assert prefix_key("user", "same") != prefix_key("user", "other")


def test_same_key_same_replica_and_keys_spread() -> None:
    balancer = ReplicaBalancer(("a", "b", "c"), affinity=True)
    homes = {}
    for key in keys(60):
        picks = set()
        for _ in range(3):
            index = balancer.acquire(key)
            balancer.release(index)
            picks.add(index)
        assert picks == {balancer.home(key)}
        homes[key] = picks.pop()
    shares = [list(homes.values()).count(i) for i in range(3)]
    assert min(shares) >= 10  # 60 keys over 3 replicas: none is starved


def test_without_affinity_the_key_is_ignored() -> None:
    balancer = ReplicaBalancer(("a", "b", "c"))
    key = keys(1)[0]
    picks = []
    for _ in range(3):
        index = balancer.acquire(key)
        balancer.release(index)
        picks.append(index)
    assert picks == [0, 1, 2]


def test_down_home_moves_only_its_own_keys() -> None:
    balancer = ReplicaBalancer(("a", "b", "c"), affinity=True)
    before = {key: balancer.home(key) for key in keys(60)}
    balancer.set_available(1, False)
    after = {}
    for key in before:
        after[key] = balancer.acquire(key)
        balancer.release(after[key])  # one call at a time: no overload fallback
    assert 1 not in after.values()
    assert all(after[key] == home for key, home in before.items() if home != 1)
    assert any(home == 1 for home in before.values())


def test_overloaded_home_falls_back_to_least_loaded() -> None:
    balancer = ReplicaBalancer(("a", "b", "c"), affinity=True, affinity_factor=1.0)
    key = keys(1)[0]
    home = balancer.home(key)
    # Up to mean + 1 the home keeps the key: 1 > 1/3 + 1 is false, 2 > 2/3 + 1 is true.
    assert balancer.acquire(key) == home
    assert balancer.acquire(key) == home
    third = balancer.acquire(key)
    assert third != home
    assert balancer.outstanding()[home] == 2 and balancer.outstanding()[third] == 1


async def test_backend_sends_a_trajectory_to_one_replica(canned: Canned) -> None:
    servers = [await canned(reply(completion())) for _ in range(3)]
    backend = create_backend(settings_for(tuple(server.base_url for server in servers), provider="vllm"))
    replicas = getattr(backend, "replicas", None)
    assert isinstance(replicas, ReplicaBalancer)
    replicas.affinity = True
    try:
        endpoints: dict[str, set[str]] = {}
        for trajectory in ("t1", "t2", "t3", "t4", "t5", "t6"):
            for stage in range(3):
                request = ChatRequest(
                    messages=(
                        ChatMessage("system", f"long prefix of {trajectory}"),
                        ChatMessage("user", str(stage)),
                    ),
                    max_tokens=8,
                )
                endpoints.setdefault(trajectory, set()).add((await backend.chat(request)).endpoint)
    finally:
        await backend.aclose()
    assert all(len(used) == 1 for used in endpoints.values())
    expected = {
        trajectory: servers[replicas.home(prefix_key("system", f"long prefix of {trajectory}"))].base_url
        for trajectory in endpoints
    }
    assert {trajectory: used.pop() for trajectory, used in endpoints.items()} == expected
