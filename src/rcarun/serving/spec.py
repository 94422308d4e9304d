"""What a managed backbone's replicas are: the serve table turned into one command line per replica.

A plain value, apart from the processes, so the plan is tested, recorded and shown by ``rcarun serve`` before
anything starts. The runner builds it from ``[backbones.X.serve]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rcarun.errors import RcarunError

__all__ = ["RESERVED_FLAGS", "ReplicaPlan", "ServeError", "ServeSpec"]


class ServeError(RcarunError):
    """A managed replica did not come up, or serves something other than its backbone's config says."""


# Flags rcarun sets on every replica; an ``extra_args`` entry naming one would contradict the plan.
RESERVED_FLAGS = (
    "--host",
    "--port",
    "--served-model-name",
    "--max-model-len",
    "--tensor-parallel-size",
    "-tp",
    "--api-key",
)


@dataclass(frozen=True, slots=True)
class ReplicaPlan:
    """One replica: its GPUs (``CUDA_VISIBLE_DEVICES``), its port and its whole command line."""

    index: int
    gpus: tuple[int, ...]
    port: int
    argv: tuple[str, ...]

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(gpu) for gpu in self.gpus)


@dataclass(frozen=True, slots=True)
class ServeSpec:
    """How one backbone serves itself: ``served_model`` is what requests carry, ``model`` what the server loads;
    ``gpus`` split in order into replicas of ``tensor_parallel``; ``port_base`` None finds free ports; the key
    named by ``api_key_env`` goes over as ``VLLM_API_KEY``, never on a command line."""

    backbone: str
    served_model: str
    model: str
    gpus: tuple[int, ...]
    tensor_parallel: int = 1
    max_model_len: int | None = None
    extra_args: tuple[str, ...] = ()
    command: tuple[str, ...] = ("vllm",)
    host: str = "127.0.0.1"
    port_base: int | None = None
    startup_timeout_s: float = 900.0
    restarts: int = 2
    grace_s: float = 30.0
    log_dir: Path = Path(".")
    api_key_env: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"backbone {self.backbone!r} serve"
        if not self.gpus:
            raise ValueError(f"{where}: gpus is empty")
        if self.tensor_parallel < 1 or len(self.gpus) % self.tensor_parallel:
            raise ValueError(
                f"{where}: {len(self.gpus)} GPUs do not split into replicas of tensor_parallel = "
                f"{self.tensor_parallel}"
            )
        if not self.command:
            raise ValueError(f"{where}: command is empty")

    @property
    def replicas(self) -> int:
        return len(self.gpus) // self.tensor_parallel

    @property
    def gpu_count(self) -> int:
        """GPUs the replicas hold together (replicas × tensor_parallel): what GPU time is charged for."""
        return len(self.gpus)

    def gpu_groups(self) -> tuple[tuple[int, ...], ...]:
        """The GPUs of each replica, in order: ``gpus`` cut into runs of ``tensor_parallel``."""
        step = self.tensor_parallel
        return tuple(self.gpus[start : start + step] for start in range(0, len(self.gpus), step))

    def plan(self, ports: tuple[int, ...]) -> tuple[ReplicaPlan, ...]:
        """Each replica's command line on the given ports (one per replica)."""
        if len(ports) != self.replicas:
            raise ValueError(f"{self.replicas} replicas need {self.replicas} ports, got {len(ports)}")
        plans = []
        for index, (gpus, port) in enumerate(zip(self.gpu_groups(), ports, strict=True)):
            argv = [*self.command, "serve", self.model, "--host", self.host, "--port", str(port)]
            argv += ["--served-model-name", self.served_model]
            argv += ["--tensor-parallel-size", str(self.tensor_parallel)]
            if self.max_model_len is not None:
                argv += ["--max-model-len", str(self.max_model_len)]
            argv += self.extra_args
            plans.append(ReplicaPlan(index=index, gpus=gpus, port=port, argv=tuple(argv)))
        return tuple(plans)
