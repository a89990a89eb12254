"""The ``faults:`` section of an experiment file: schema only (validated by pydantic, strict).

Imported by :mod:`sim.config`; what the faults do is in :mod:`sim.faults`.

```yaml
faults:
  stragglers: [{gpu: 3, slowdown: 1.2}]       # GPU 3's compute takes 1.2x as long
  random_stragglers: {count: 2, slowdown_range: [1.1, 1.5], seed: 7}
  gpu_failures: {mtbf_hours: 24, checkpoint_interval_steps: 500, checkpoint_write_s: 30,
                 restart_s: 600, seed: 1}
  link_faults: [{link: [node0, leaf0], at_s: 10, bandwidth_factor: 0.5}]
  preemptions: [{node: 1, at_s: 3600, policy: rebalance}]
```
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from base.schema import Strict

MAX_EVENTS = 100
"""Most link faults, and most preemptions, a file may list: a multi-step run simulates
the step again after each (a few seconds each at scale)."""


class StragglerSpec(Strict):
    """One slow GPU."""

    gpu: int = Field(ge=0)
    """Global GPU rank."""
    slowdown: float = Field(ge=1)
    """Factor on every compute time of that GPU (1.2 = 20% slower)."""


class LognormalSlowdown(Strict):
    """Slowdown ``max(1, median * exp(sigma * z))``, z standard normal."""

    median: float = Field(ge=1)
    """The median slowdown."""
    sigma: float = Field(ge=0)
    """Spread: the standard deviation of the slowdown's logarithm."""


class RandomStragglers(Strict):
    """Stragglers drawn from ``seed``: which GPUs (``fraction`` or ``count``) and how slow
    (a fixed ``slowdown``, uniform in ``slowdown_range``, or ``slowdown_lognormal``)."""

    fraction: float | None = Field(None, gt=0, le=1)
    """Share of the GPUs that straggle (rounded to the nearest count, at least 1)."""
    count: int | None = Field(None, ge=1)
    """How many GPUs straggle (instead of ``fraction``)."""
    slowdown: float | None = Field(None, ge=1)
    """One factor for every straggler."""
    slowdown_range: list[float] | None = None
    """``[low, high]``, uniform, both >= 1."""
    slowdown_lognormal: LognormalSlowdown | None = None
    """A factor per straggler drawn from a lognormal distribution."""
    seed: int = 0
    """Seed of the draws: the same seed picks the same GPUs and factors."""


class GpuFailures(Strict):
    """GPU failures over a multi-step run (``sim run --steps N``).

    A failure loses the work since the last checkpoint and costs ``restart_s``
    (Young 1974; Daly 2006). Give the failure process as ``mtbf_hours`` (of
    the whole job), ``gpu_mtbf_hours`` (per GPU: the job's is this / GPUs) or
    fixed wall-clock ``times_s``.
    """

    mtbf_hours: float | None = Field(None, gt=0)
    """Mean time between failures of the whole job (exponential gaps)."""
    gpu_mtbf_hours: float | None = Field(None, gt=0)
    """Mean time between failures of one GPU; the job's is this over the GPUs."""
    times_s: list[float] | None = None
    """Fixed failure times, wall-clock seconds from the start."""
    checkpoint_interval_steps: int = Field(ge=1)
    """Steps between checkpoints."""
    checkpoint_write_s: float = Field(0.0, ge=0)
    """Time each checkpoint stalls training."""
    restart_s: float = Field(0.0, ge=0)
    """Time from a failure to training again (detection, restart, checkpoint load)."""
    seed: int = 0
    """Seed of the failure times drawn from an MTBF."""


class LinkFault(Strict):
    """A link between two graph nodes degraded or failed from ``at_s`` on: a degradation
    mid-step, at that time (transfers in flight slow down); a failure at the first step
    boundary at or after it (see :func:`sim.api.simulate_run`)."""

    link: list[str | int]
    """``[node_a, node_b]``: graph node names (a GPU by its rank)."""
    at_s: float = Field(0.0, ge=0)
    """When the fault starts, seconds from the start of the run."""
    bandwidth_factor: float | None = Field(None, gt=0, le=1)
    """The link's bandwidth from then on, as a fraction of its own (degraded)."""
    failed: bool = False
    """The link carries nothing from then on; routes go around it."""


class Preemption(Strict):
    """A server taken away at ``at_s``, as preemptible cloud capacity does (Ryabinin et al.
    2023, SWARM). With ``rebalance``, a step in flight then that would not end within
    ``notice_s`` is lost (its DP collectives can no longer complete) and rerun on the
    replicas left; otherwise the change applies at the step boundary."""

    node: int = Field(ge=0)
    """Server index (GPUs ``node * gpus_per_node ...`` on the presets)."""
    at_s: float = Field(0.0, ge=0)
    """When the server goes, seconds from the start of the run."""
    policy: Literal["stall", "rebalance"]
    """``stall``: wait ``replacement_s`` for a replacement server, then go on as before;
    ``rebalance``: go on without the DP replicas that had GPUs on it, the global batch
    spread over the remaining ones (more micro-batches each)."""
    replacement_s: float = Field(0.0, ge=0)
    """``stall`` only: time until the replacement server has joined."""
    notice_s: float = Field(0.0, ge=0)
    """Warning given before the server goes (cloud preemption notices: AWS spot 120 s, GCP
    spot 30 s): a step that ends within it completes; 0, none."""


class FaultsConfig(Strict):
    """Stragglers, random stragglers, GPU failures, link faults and preemptions (listed, or
    drawn from a rate for a swarm)."""

    stragglers: list[StragglerSpec] = []
    """Given slow GPUs."""
    random_stragglers: RandomStragglers | None = None
    """Slow GPUs drawn at random."""
    gpu_failures: GpuFailures | None = None
    """Failures, checkpoints and restarts over a multi-step run."""
    link_faults: list[LinkFault] = Field([], max_length=MAX_EVENTS)
    """Degraded or failed links (at most :data:`MAX_EVENTS`)."""
    preemptions: list[Preemption] = Field([], max_length=MAX_EVENTS)
    """Servers taken away (at most :data:`MAX_EVENTS`)."""
    preemption_rate_per_hour: float | None = Field(None, gt=0)
    """``parallel.swarm`` with ``sim run --steps``: preemptions of each peer per hour up
    (exponential gaps, drawn from ``preemption_seed``); a preempted peer leaves its pool
    and rejoins ``rejoin_s`` later (Ryabinin et al. 2023)."""
    rejoin_s: float = Field(0.0, ge=0)
    """Time from a peer's preemption to its rejoining the swarm."""
    preemption_seed: int = 0
    """Seed of the drawn preemption times: the same seed preempts the same peers at the
    same times."""
