"""Benchmark: ring all-reduce over up to 1,024 GPUs on a fat-tree, flow-level.

Run ``python benchmarks/collectives.py``. For each case it builds the cluster
(DGX H100 servers, one 400 Gb/s NIC per GPU, two-tier 1:1 fat-tree with 32
NIC ports per leaf), simulates one 1 GiB all-reduce through the ordinary
engine (``simulate_program``; nothing here is special-cased) and prints wall
time, simulated time, busbw, flows, SimPy events and events per second.

``stream`` is the engine's default collective granularity (one flow per ring
edge, module docstring of :mod:`sim.collectives`); ``step`` expands the ring
into one flow per step (2(n−1)·n transfers), the engine-bound case.
Events are counted in a second, instrumented run so that counting does not
inflate the measured wall time. Not a timed test: it prints a table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import simpy  # noqa: E402

from sim.collectives import bus_bandwidth  # noqa: E402
from sim.config import parse_config  # noqa: E402
from sim.engine import simulate_program  # noqa: E402
from topologies.build import build_cluster  # noqa: E402
from topologies.cluster import Cluster  # noqa: E402
from workloads.program import Program, ProgramBuilder  # noqa: E402
from workloads.schedules import gpipe  # noqa: E402

GiB = 2**30


def fat_tree_cluster(num_gpus: int, granularity: str) -> Cluster:
    cfg = parse_config({
        "model": {"synthetic": {"forward_ms": 0.0, "backward_ms": 0.0}},
        "cluster": {"preset": "dgx-h100", "num_gpus": num_gpus, "topology": "fat-tree",
                    "gpus_per_leaf": 32, "oversubscription": 1.0,
                    "collective_granularity": granularity}})
    return build_cluster(cfg.cluster)


def ring_all_reduce(cluster: Cluster, nbytes: float) -> float:
    b = ProgramBuilder()
    n = cluster.num_gpus
    b.collective(tuple(range(n)), {}, kind="dp", name="all_reduce", op="all_reduce",
                 nbytes=nbytes, algo="ring")
    program = Program(n, b.build(), (0.0,) * n, gpipe(1, 1))
    return simulate_program(program, cluster, lambda _op: 0.0).end_s


def count_events(num_gpus: int, granularity: str, nbytes: float) -> tuple[int, int]:
    """(SimPy events processed, flows) of the same run, instrumented."""
    counter = [0]
    original = simpy.Environment.step

    def step(env: simpy.Environment) -> None:
        counter[0] += 1
        original(env)

    simpy.Environment.step = step  # type: ignore[method-assign]
    try:
        cluster = fat_tree_cluster(num_gpus, granularity)
        flows = [0]
        from sim import engine

        original_plan = engine._Run._run_plan

        def run_plan(self, steps, done):  # type: ignore[no-untyped-def]
            flows[0] += len(steps)
            return original_plan(self, steps, done)

        engine._Run._run_plan = run_plan  # type: ignore[method-assign]
        try:
            ring_all_reduce(cluster, nbytes)
        finally:
            engine._Run._run_plan = original_plan  # type: ignore[method-assign]
    finally:
        simpy.Environment.step = original  # type: ignore[method-assign]
    return counter[0], flows[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step-max-gpus", type=int, default=256,
                        help="largest GPU count for the step-granularity rows (default 256)")
    args = parser.parse_args()
    cases = [(n, "stream") for n in (64, 256, 1024)]
    cases += [(n, "step") for n in (64, 128, 256, 512, 1024) if n <= args.step_max_gpus]
    print(f"{'GPUs':>5} {'granularity':>11} {'build s':>8} {'wall s':>8} {'sim ms':>9} "
          f"{'busbw GB/s':>10} {'flows':>9} {'events':>9} {'events/s':>10}")
    for n, gran in cases:
        t0 = time.perf_counter()
        cluster = fat_tree_cluster(n, gran)
        t1 = time.perf_counter()
        sim_s = ring_all_reduce(cluster, GiB)
        t2 = time.perf_counter()
        events, flows = count_events(n, gran, GiB)
        wall = t2 - t1
        busbw = bus_bandwidth("all_reduce", n, GiB, sim_s)[1] / 1e9
        print(f"{n:>5} {gran:>11} {t1 - t0:>8.3f} {wall:>8.3f} {sim_s * 1e3:>9.2f} "
              f"{busbw:>10.2f} {flows:>9} {events:>9} {events / wall:>10.0f}")


if __name__ == "__main__":
    main()
