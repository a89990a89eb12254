"""The tables of docs/dp-modes.md: parameter servers against ring all-reduce, DiLoCo
over a WAN, and an adaptive batch against a fixed one.

Run ``python benchmarks/dp_modes.py``; it prints three Markdown tables, each from the
bundled examples changed one key at a time through the Python API (nothing here is
special-cased). Not a timed test.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.api import load_experiment, simulate  # noqa: E402
from sim.faults_run import simulate_run  # noqa: E402

EXAMPLES = ROOT / "workloads" / "examples"
SEQUENCES_PER_WORKER = 8
"""Weak scaling in the PS table: each worker's share of the global batch."""


def parameter_server_table(workers: tuple[int, ...] = (2, 4, 8, 16, 32),
                           servers: tuple[int, ...] = (1, 2, 4)) -> str:
    """Step time (ms) against workers: ring all-reduce and PS with K servers."""
    exp = load_experiment(EXAMPLES / "parameter-server.yaml")
    head = ["workers", "compute only", "ring all-reduce", *(f"PS, K = {k}" for k in servers)]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w in workers:
        gbs = {"training.global_batch_size": SEQUENCES_PER_WORKER * w}
        ring = exp.with_changes({**gbs, "cluster.num_gpus": w, "parallel.dp_mode": "allreduce",
                                 "parallel.ps_servers": None})
        res = simulate(ring)
        compute = res.stats["step_time_s"] - res.stats["exposed_comm_s"]["dp"]
        cells = [str(w), f"{compute * 1e3:,.0f}", f"{res.stats['step_time_s'] * 1e3:,.0f}"]
        for k in servers:
            ps = exp.with_changes({**gbs, "cluster.num_gpus": w + k, "parallel.ps_servers": k})
            cells.append(f"{simulate(ps).stats['step_time_s'] * 1e3:,.0f}")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def diloco_table(steps: int = 10_000, every: tuple[int, ...] = (1, 10, 100, 500)) -> str:
    """DiLoCo over the WAN: per-step time and communication, and time to train ``steps``."""
    exp = load_experiment(EXAMPLES / "diloco-wan.yaml")
    head = ["H", "mean step (s)", "sync step (s)", "exposed DP comm per step (s)",
            f"time to train {steps:,} steps (h)"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for h in every:
        run = simulate_run(exp.with_changes({"training.sync_every": h}), steps).stats
        sync = run.get("sync_step_time_s", run["step_time_s"])
        rows.append(f"| {h} | {run['step_time_s']:.3f} | {sync:.3f} | "
                    f"{run['exposed_comm_s']['dp']:.4f} | {run['time_to_train_s'] / 3600:.2f} |")
    return "\n".join(rows)


def batch_policy_table(target_tokens: float = 2e10, steps: int = 1_000_000) -> str:
    """Time to ``target_tokens`` tokens: fixed batches against the norm test."""
    exp = load_experiment(EXAMPLES / "adaptive-batch.yaml")
    policy = exp.config.training.batch_policy
    assert policy is not None
    head = ["policy", "batch schedule (step: sequences)", "steps", "time to target (h)"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    cases = [("fixed, initial batch", {"training.batch_policy.rule": "constant"}),
             ("fixed, largest batch", {"training.batch_policy.rule": "constant",
                                       "training.global_batch_size":
                                       policy.max_global_batch_size}),
             (f"norm test, eta = {policy.eta:g}", {})]
    for name, changes in cases:
        run = simulate_run(exp.with_changes({**changes, "training.batch_policy.target_tokens":
                                             target_tokens}), steps).stats
        bp = run["batch_policy"]
        shown = ", ".join(f"{s}: {b}" for s, b in bp["schedule"])
        rows.append(f"| {name} | {shown} | {bp['steps_run']:,} | "
                    f"{run['time_to_train_s'] / 3600:.2f} |")
    return "\n".join(rows)


def main() -> None:
    print("## Parameter server against ring all-reduce (step time, ms)\n")
    print(parameter_server_table())
    print("\n## DiLoCo over a WAN\n")
    print(diloco_table())
    print("\n## Adaptive batch\n")
    print(batch_policy_table())


if __name__ == "__main__":
    main()
