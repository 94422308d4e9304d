"""``balance = "affinity"`` in a backbone's config reaches its replica balancer for the sweep's length."""

from __future__ import annotations

import pytest

from rcarun.backends import BackendSettings, ReplicaBalancer, create_backend
from rcarun.runner.config import BackboneConfig
from rcarun.runner.managed import replica_balancing

URLS = ("http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1")


@pytest.mark.parametrize(("balance", "affinity"), [("affinity", True), ("outstanding", False)])
async def test_balance_turns_affinity_on(balance: str, affinity: bool) -> None:
    config = BackboneConfig.model_validate(
        {"provider": "vllm", "model": "m", "base_urls": URLS, "balance": balance}
    )
    backend = create_backend(BackendSettings(name="q", provider="vllm", model="m", base_urls=URLS))
    try:
        replicas = getattr(backend, "replicas", None)
        assert isinstance(replicas, ReplicaBalancer) and not replicas.affinity
        async with replica_balancing({"q": (config, backend)}, {}) as pollers:
            assert replicas.affinity is affinity
            assert pollers == {}  # affinity needs no metrics scrape
    finally:
        await backend.aclose()
