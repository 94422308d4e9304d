"""SOAP's cost per trajectory on the CPU with the tiny random model: time, peak memory, forward passes vs length.

Reads every trajectory of the bundled Who&When sample and a synthetic long one (each step 1,000 bytes, so the
byte-level tokenizer gives about 1,000 tokens a step) the way a SOAP preparation does (every layer kept), with
one torch thread, at the given pass limits. Peak RSS is the process's, read after each trajectory in order of
length (it only grows), so each figure bounds what SOAP needed up to that trajectory.

    python scripts/soap_cpu_figures.py --context 1024 2048 8192
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time

import torch

from rcarun.backends.local import tiny_model
from rcarun.data import Step, Trajectory, bundled_sample_path, iter_dataset
from rcarun.methods.soap import extract_features


def _synthetic(steps: int) -> Trajectory:
    return Trajectory(
        qid=f"synthetic/{steps}x1000",
        source="synthetic",
        task="Find the decisive error.",
        steps=tuple(
            Step(index=i, agent=f"agent{i % 3}", role="user", content="y" * 980) for i in range(steps)
        ),
        sha256="0" * 64,
    )


async def _measure(context: int, only: list[str]) -> None:
    model = tiny_model(0, context_tokens=max(context, 8192), device="cpu")
    trajectories = [record.trajectory for record in iter_dataset(bundled_sample_path())]
    trajectories += [_synthetic(12), _synthetic(24)]
    if only:
        trajectories = [t for t in trajectories if t.qid in only]
    sized = sorted(trajectories, key=lambda t: sum(model.count_tokens(s.content) for s in t.steps))
    print(f"\ncontext_tokens = {context}")
    print(f"{'trajectory':<28} {'steps':>5} {'tokens':>7} {'passes':>6} {'fed':>8} {'s':>7} {'peak MB':>8}")
    for trajectory in sized:
        started = time.perf_counter()
        features = await extract_features(model, trajectory, context_tokens=context)  # type: ignore[arg-type]
        seconds = time.perf_counter() - started
        tokens = sum(features.n_tokens)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"{trajectory.qid:<28} {trajectory.n_steps:>5} {tokens:>7,} {features.passes:>6} "
            f"{features.tokens:>8,} {seconds:>7.2f} {peak:>8.0f}"
        )
    model.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--context", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=[], help="these trajectory ids only")
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    for context in arguments.context:
        asyncio.run(_measure(context, arguments.only))


if __name__ == "__main__":
    main()
