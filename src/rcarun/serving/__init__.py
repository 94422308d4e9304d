"""Self-hosted serving: rcarun starts, checks, supervises and stops a backbone's vLLM replicas.

A backbone with a ``[backbones.X.serve]`` table says how to serve itself instead of where: `ServeSpec` turns
that into one command line per GPU group, and `ManagedReplicas` owns the processes for the length of a sweep
(or of ``rcarun serve``), each under a guard that ends it should rcarun die (`guard`), and refuses a port held
by a server it did not start (`ports`). It sits in the bottom layer beside ``backends``: it imports nothing of
rcarun but the errors, and the runner hands it a plain spec.

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
