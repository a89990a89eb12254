"""The table of docs/swarm.md: the SWARM example's throughput against the preemption rate.

    python benchmarks/swarm_preemption.py [--steps 30]

Runs ``workloads/examples/swarm-preemptible.yaml`` with ``sim run --steps`` at several
``faults.preemption_rate_per_hour`` (per peer), with and without rebalancing, and prints a
Markdown table (a few minutes: each set of pools met on the way is simulated once).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sim.config import read_yaml
from sim.experiment import build_experiment
from sim.faults_run import simulate_run

EXAMPLE = Path(__file__).resolve().parent.parent / "workloads" / "examples" / \
    "swarm-preemptible.yaml"
RATES = (0.0, 0.25, 0.5, 1.0, 2.0)
"""Preemptions per peer and hour (0: none)."""


def run(steps: int, rate: float, rebalance: bool) -> dict:
    """The run's stats at ``rate`` preemptions per peer-hour."""
    data = read_yaml(EXAMPLE)
    data["parallel"]["swarm"]["rebalance"] = rebalance
    if rate:
        data["faults"]["preemption_rate_per_hour"] = rate
    else:
        del data["faults"]
    return simulate_run(build_experiment(data), steps).stats


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    steps = parser.parse_args().steps
    print("| preemptions / peer-hour | rebalance | preempted | tokens/s | vs none | "
          "pool-empty wait s | time to train h |")
    print("|---|---|---|---|---|---|---|")
    base = None
    for rate in RATES:
        for rebalance in ((True,) if rate == 0 else (True, False)):
            stats = run(steps, rate, rebalance)
            speed = stats["train_tokens_per_s"]
            base = base or speed
            swarm = stats.get("swarm_run", {})
            print(f"| {rate:g} | {'yes' if rebalance else 'no'} | "
                  f"{swarm.get('peer_preemptions', 0)} | {speed:,.0f} | {speed / base:.2f} | "
                  f"{swarm.get('pool_empty_wait_s', 0.0):,.0f} | "
                  f"{stats['time_to_train_s'] / 3600:.2f} |", flush=True)


if __name__ == "__main__":
    main()
