"""Self-hosted serving: rcarun starts, checks, supervises and stops a backbone's vLLM replicas.

A ``[backbones.X.serve]`` table becomes a `ServeSpec` (a command line per GPU group); `ManagedReplicas` owns the
processes for a sweep or ``rcarun serve``. Bottom layer: it imports nothing of rcarun but the errors.

    async with ManagedReplicas(spec, on_event=...) as fleet:
        ... fleet.base_urls, fleet.record.to_detail()
"""

from rcarun.serving.fleet import FleetRecord, ManagedReplicas, ServedReplica, ServeError, replica_log_dir
from rcarun.serving.spec import RESERVED_FLAGS, ReplicaPlan, ServeSpec

__all__ = [
    "RESERVED_FLAGS",
    "FleetRecord",
    "ManagedReplicas",
    "ReplicaPlan",
    "ServeError",
    "ServeSpec",
    "ServedReplica",
    "replica_log_dir",
]
