"""The ``parallel.swarm:`` section of an experiment file: schema only (pydantic, strict).

SWARM parallelism (Ryabinin, Dettmers, Diskin and Borzunov 2023, "SWARM Parallelism:
Training Large Models Can Be Surprisingly Communication-Efficient", ICML 2023): each
pipeline stage is served by a pool of peers instead of one GPU; every micro-batch is routed
to a peer of the next stage drawn with probability proportional to that peer's throughput
(stochastic wiring); peers leave (preemptible instances) and join, and peers move from the
best-provisioned stage to one that thinned out (adaptive rebalancing). What it does is in
:mod:`sim.swarm`.

```yaml
parallel:
  pp: 4                      # stages
  swarm: {pools: [4, 4, 4, 4], activation_compression: 2.0, seed: 0, rebalance: true}
```
"""

from __future__ import annotations

from pydantic import Field

from base.schema import Strict

MAX_PEERS = 4096
"""Most peers a swarm may have: each is simulated, with every micro-batch routed through
it (SWARM's largest run had 400)."""


class SwarmConfig(Strict):
    """Stage pools of peers, stochastic wiring and rebalancing (SWARM, Ryabinin et al. 2023).

    The peers are the cluster's GPUs in rank order: the first ``pools[0]`` serve stage 0,
    the next ``pools[1]`` stage 1, and so on (list GPU types per stage in
    ``cluster.nodes``, e.g. ``[{gpu: T4, count: 6}, {gpu: A100-80GB, count: 2}, ...]``).
    There are no data-parallel replicas: the global batch's micro-batches all flow through
    the pools, and each pool averages its gradients (all-reduce) before the optimizer step.
    """

    pools: list[int] = Field(min_length=1, max_length=MAX_PEERS)
    """Peers of each stage, one entry per pipeline stage (``parallel.pp`` of them), each
    at least 1; they add up to ``cluster.num_gpus``."""
    activation_compression: float = Field(1.0, ge=1)
    """Bytes of a bf16 activation (or its gradient) over the bytes sent between stages,
    e.g. 2.0 for SWARM's 8-bit quantisation; 1.0: uncompressed."""
    weight_sharing: int = Field(1, ge=1)
    """Layers that share one set of weights (ALBERT-style, as SWARM's 13B-before-sharing
    model with 1B unique parameters): each peer keeps, averages and updates 1/k of its
    stage's weights, gradients and optimizer state; compute and activations are unchanged.
    1: no sharing."""
    seed: int = 0
    """Seed of the stochastic wiring: the same seed routes the same micro-batches to the
    same peers."""
    rebalance: bool = True
    """SWARM's adaptive rebalancing: when the pools change (``faults.preemption_rate_per_hour``
    with ``sim run --steps``), peers move one at a time from the stage of the highest total
    throughput to that of the lowest while that raises the lowest, and rejoining peers join
    the stage of the lowest throughput; false: peers stay in (and rejoin) their own stage."""
