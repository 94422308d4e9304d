"""The embedded default sweep behind `rcarun sweep` with no config (and `make demo`).

The bundled Who&When sample × every registered method × four simulated backbones × 2 realizations into
./results.db, without a key or a network. Each backbone is rcarun's simulator with the limit style of a real
provider, so that the demo exercises the whole engine: sim-deepseek (a concurrency cap, 429s, no headers; the
client one slot too optimistic), sim-gpt (rpm and tpm with OpenAI headers), sim-kimi (two-tier request limits,
Moonshot headers, a few 503s) and sim-qwen (a managed vLLM backbone: two fake ``vllm`` replicas started,
balanced, stopped and charged by GPU time, which queue and think long enough for the length retry). SOAP runs on
a fifth, ``tiny-random-local`` (a 3-layer model with seeded random weights, on the CPU; its accuracy means
nothing), when the ``local`` extra is installed.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from rcarun.data import bundled_sample_path
from rcarun.methods import registered_methods
from rcarun.mock import MockConfig, MockServer
from rcarun.runner import BackboneConfig, MethodConfig, SweepConfig

__all__ = [
    "DEMO_LOCAL_BACKBONE",
    "DEMO_REALIZATIONS",
    "SimulatedBackbone",
    "demo_backbones",
    "demo_sweep_config",
    "simulated_backbones",
]

DEMO_REALIZATIONS = 2
DEMO_LOCAL_BACKBONE = "tiny-random-local"
"""The demo's local backbone: SOAP on a tiny model with random weights (its answers mean nothing)."""
# Passes of at most this many tokens: the byte-level tiny tokenizer makes the sample's longest trajectory about
# 61,000 tokens, read in windows; a pass's cost grows with the square of its length.
_DEMO_CONTEXT_TOKENS = 1024


_SHORT_ATTRIBUTION: dict[str, Any] = {"max_tokens": 1024}
_EVERY_BACKBONE = object()  # stands for the names of every backbone of the demo
# All-at-once, and every method built on it, starts at 1,024 output tokens; Continual Search and Passive
# Continuation read the log with tools, as in the paper (the simulator calls them for a few rounds); the judge
# panel sits every backbone of the demo (four judges, as in the Continual Search paper's panel). Other methods
# keep their own options.
_DEMO_METHOD_OPTIONS: dict[str, dict[str, Any]] = {
    "all-at-once": _SHORT_ATTRIBUTION,
    "continual-search": {"reading": "agentic", "base_options": _SHORT_ATTRIBUTION},
    "passive-continuation": {"reading": "agentic", "base_options": _SHORT_ATTRIBUTION},
    "self-consistency": {"base_options": _SHORT_ATTRIBUTION},
    "judge-panel": {"judges": _EVERY_BACKBONE, "base_options": _SHORT_ATTRIBUTION},
    "soap": {"context_tokens": _DEMO_CONTEXT_TOKENS},
}

# What the fake vllm command sets itself from its flags (served name, weights, window) or never takes from here.
_SET_BY_FAKE_VLLM = frozenset(("model", "model_root", "context_window", "server_version", "api_key"))


@dataclass(frozen=True, slots=True)
class SimulatedBackbone:
    """One demo backbone: its simulator(s) and its client settings.

    Attributes:
        servers: one `MockConfig` per replica.
        client: the backbone's settings (provider, limits, prices ...), its model and endpoints aside.
        serve: for a managed backbone, its ``[serve]`` table less the fake command's settings: the runner starts
            one fake ``vllm`` per server (GPU ``i`` for server ``i``) instead of the demo starting `MockServer`s.
    """

    name: str
    servers: tuple[MockConfig, ...]
    client: dict[str, Any]
    serve: dict[str, Any] | None = None

    def backbone_config(self, base_urls: tuple[str, ...], model_suffix: str = "") -> BackboneConfig:
        """The backbone's config: served by ``base_urls``, or by its managed replicas when it has ``serve``."""
        model = self.servers[0].model + model_suffix
        if self.serve is None:
            return BackboneConfig.model_validate({"model": model, "base_urls": base_urls, **self.client})
        behaviour = {
            "devices": {
                str(index): {"mock": _mock_settings(server)} for index, server in enumerate(self.servers)
            }
        }
        serve = {
            **self.serve,
            "gpus": list(range(len(self.servers))),
            "command": [sys.executable, "-m", "rcarun.mock.fake_vllm"],
            "env": {"RCARUN_FAKE_VLLM": json.dumps(behaviour, sort_keys=True)},
        }
        return BackboneConfig.model_validate({"model": model, "serve": serve, **self.client})


def _mock_settings(server: MockConfig) -> dict[str, Any]:
    """The fields of ``server`` that differ from the simulator's defaults, for the fake command's ``mock`` key."""
    defaults = MockConfig(model=server.model).to_dict()
    return {
        key: value
        for key, value in server.to_dict().items()
        if key not in _SET_BY_FAKE_VLLM and value != defaults.get(key)
    }


def demo_backbones() -> tuple[SimulatedBackbone, ...]:
    # Prices are illustrative (of the order of the real providers', USD per 1M tokens) so that the cost columns
    # show real arithmetic; the banner says the backbones are simulated.
    return (
        SimulatedBackbone(
            "sim-deepseek",
            (
                MockConfig(
                    model="sim-deepseek-flash",
                    latency_s=0.15,
                    max_concurrency=4,
                    over_concurrency="429",
                    headers="none",
                    usage_style="deepseek",
                    reasoning_tokens=300,
                    reasoning_field="reasoning_content",
                    seed=11,
                ),
            ),
            {
                "provider": "deepseek",
                "limits": {"concurrency": 6},
                "prices": {"input_per_mtok": 0.28, "cached_input_per_mtok": 0.028, "output_per_mtok": 0.42},
            },
        ),
        SimulatedBackbone(
            "sim-gpt",
            (
                MockConfig(
                    model="sim-gpt",
                    latency_s=0.1,
                    rpm=600,
                    tpm=2_000_000,
                    headers="openai",
                    reasoning_tokens=200,
                    seed=12,
                ),
            ),
            {
                "provider": "simulated",
                "limits": {"concurrency": 16, "rpm": 600, "tpm": 2_000_000, "burst_s": 1.0},
                "prices": {"input_per_mtok": 1.25, "cached_input_per_mtok": 0.125, "output_per_mtok": 10.0},
            },
        ),
        SimulatedBackbone(
            "sim-kimi",
            (
                MockConfig(
                    model="sim-kimi",
                    latency_s=0.1,
                    rps=10,
                    rpm=480,
                    headers="moonshot",
                    error_503_rate=0.05,
                    seed=13,
                ),
            ),
            {
                "provider": "kimi",
                "limits": {"concurrency": 8, "rpm": 480, "burst_s": 1.0},
                "prices": {"input_per_mtok": 0.6, "cached_input_per_mtok": 0.15, "output_per_mtok": 2.5},
                "retry": {"base_s": 0.2, "cap_s": 2.0},
            },
        ),
        _sim_qwen(),
    )


def _sim_qwen() -> SimulatedBackbone:
    """A managed vLLM backbone: two replicas that queue, think long and are charged by GPU time."""
    return SimulatedBackbone(
        "sim-qwen",
        tuple(
            MockConfig(
                model="sim-qwen3.5-35b-a3b",
                latency_s=0.1,
                max_concurrency=2,
                over_concurrency="queue",
                headers="none",
                reasoning_tokens=1500,
                reasoning_field="reasoning",
                context_window=32_768,
                seed=14 + replica,
            )
            for replica in range(2)
        ),
        {
            "provider": "vllm",
            "context_window": 32_768,
            "max_output_tokens": 16_384,
            "limits": {"concurrency": 8},
            # Of the order of a rented data-centre GPU's hourly price; the GPU time is the fake's wall time.
            "prices": {"gpu_hour_usd": 2.5},
        },
        serve={"model": "sim/Qwen3.5-35B-A3B", "startup_timeout_s": 60.0, "grace_s": 5.0, "restarts": 1},
    )


@contextlib.asynccontextmanager
async def simulated_backbones(model_suffix: str = "") -> AsyncIterator[dict[str, BackboneConfig]]:
    """Start every demo mock server on loopback and yield backbone configs pointing at them (a managed
    backbone's config says how to start its replicas instead: the sweep starts them).

    ``model_suffix`` renames every simulated model (client and server alike). The simulator seeds a
    temperature-0 answer by model and request, so a renamed demo is a new draw of every answer with the same
    prompts (`scripts/estimate_calibration.py` runs many).
    """
    async with contextlib.AsyncExitStack() as stack:
        configs: dict[str, BackboneConfig] = {}
        for backbone in demo_backbones():
            model = backbone.servers[0].model + model_suffix
            urls = []
            if backbone.serve is None:
                for server_config in backbone.servers:
                    server = MockServer(
                        dataclasses.replace(server_config, model=model), host="127.0.0.1", port=0
                    )
                    urls.append((await stack.enter_async_context(server)).base_url)
            configs[backbone.name] = backbone.backbone_config(tuple(urls), model_suffix)
        yield configs


def local_extra_installed() -> bool:
    """torch and transformers can be imported (the ``local`` extra), without importing them."""
    return all(importlib.util.find_spec(module) is not None for module in ("torch", "transformers"))


def _demo_local_backbone() -> BackboneConfig:
    return BackboneConfig.model_validate(
        {
            "provider": "local",
            "model": "tiny",
            "local": {"device": "cpu", "context_tokens": _DEMO_CONTEXT_TOKENS},
        }
    )


def _demo_method_options(name: str, backbones: dict[str, BackboneConfig]) -> dict[str, Any]:
    """The demo's options for method ``name`` (`_DEMO_METHOD_OPTIONS`), the judges filled in."""
    return {
        key: list(backbones) if value is _EVERY_BACKBONE else copy.deepcopy(value)
        for key, value in _DEMO_METHOD_OPTIONS.get(name, {}).items()
    }


def demo_sweep_config(backbones: dict[str, BackboneConfig]) -> SweepConfig:
    """Bundled sample × every registered method × the given backbones × 2 realizations.

    All-at-once starts at 1,024 output tokens (the original Who&When scripts' budget), so that sim-qwen's long
    thinking runs out of room and the length retry doubles it, and so do the methods built on it
    (`_DEMO_METHOD_OPTIONS`). The judge panel's items run once per trajectory and realization, under its first
    judge. SOAP runs on `DEMO_LOCAL_BACKBONE` when the ``local`` extra is installed.
    """
    local = local_extra_installed()
    names = [name for name in registered_methods() if local or name != "soap"]
    return SweepConfig.model_validate(
        {
            "sweep": {
                "dataset": str(bundled_sample_path()),
                "realizations": DEMO_REALIZATIONS,
                "simulated": True,
            },
            "methods": [
                MethodConfig(name=name, options=_demo_method_options(name, backbones)) for name in names
            ],
            "backbones": {**backbones, DEMO_LOCAL_BACKBONE: _demo_local_backbone()} if local else backbones,
        }
    )
