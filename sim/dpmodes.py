"""Data parallelism beyond one synchronous all-reduce per step: parameter servers, local
SGD (DiLoCo) and bounded staleness. Pure: rules and arithmetic on simulated steps.

- ``parallel.dp_mode: parameter_server`` is lowered by
  :mod:`workloads.lowering.paramserver`; its servers are the last ``ps_servers`` ranks.
- ``training.sync_every: H`` (local SGD, Stich 2019; DiLoCo, Douillard et al. 2023):
  :func:`sim.api.simulate` runs the synchronising step (today's step: the DP all-reduce
  of the outer gradients, then the optimizer) and a local step (the same program
  without DP communication, :func:`workloads.multistep.without_dp`) and
  :func:`cycle_stats` combines them: a step takes ((H - 1)·local + sync) / H on average.
- ``training.max_staleness: S`` (Ho et al. 2013): steps run back to back without a
  barrier, each optimizer applying the DP communication of S steps before
  (:func:`workloads.multistep.repeat_program`); :func:`stale_steps` of them are
  simulated and the period of a middle one reported.
"""

from __future__ import annotations

import math
from typing import Any

from base.errors import ConfigError
from workloads.registry import overlaps_steps

RATE_KEYS = ("tokens_per_s", "tflops_per_gpu", "mfu")
"""Per-second statistics, inversely proportional to the step time."""


def check_dp_modes(cfg: Any, dp: int) -> None:
    """ConfigError for combinations of the DP modes that do not exist (``cfg``: the
    :class:`~sim.config.ExperimentConfig`, ``dp``: the data-parallel degree)."""
    par, t = cfg.parallel, cfg.training
    local = t.sync_every > 1 or t.max_staleness > 0
    if t.sync_every > 1 and t.max_staleness > 0:
        raise ConfigError(f"training.max_staleness={t.max_staleness}: not with "
                          f"training.sync_every={t.sync_every}; choose local SGD or "
                          "asynchronous updates")
    if local and par.zero_stage != 0:
        key = ("training.sync_every", t.sync_every) if t.sync_every > 1 else (
            "training.max_staleness", t.max_staleness)
        raise ConfigError(f"{key[0]}={key[1]}: needs parallel.zero_stage: 0 (every replica "
                          f"keeps its own optimizer state), got zero_stage={par.zero_stage}")
    if par.dp_mode != "parameter_server":
        if "ps_servers" in par.model_fields_set:
            raise ConfigError(f"parallel.ps_servers={par.ps_servers}: only used with "
                              "parallel.dp_mode: parameter_server")
        return
    if t.sync_every > 1:
        raise ConfigError(f"training.sync_every={t.sync_every}: not with parallel.dp_mode: "
                          "parameter_server (the servers apply every push)")
    if par.zero_stage != 0:
        raise ConfigError(f"parallel.dp_mode='parameter_server': needs parallel.zero_stage: 0 "
                          f"(the servers hold the sharded state), got {par.zero_stage}")
    if par.overlap_grad_reduce:
        raise ConfigError("parallel.dp_mode='parameter_server': not with "
                          "parallel.overlap_grad_reduce (pushes follow each stage's backward)")
    preemptions = cfg.faults.preemptions if cfg.faults is not None else ()
    for k, event in enumerate(preemptions):
        if event.policy == "rebalance":
            raise ConfigError(f"faults.preemptions[{k}]: policy 'rebalance' is not supported "
                              "with parallel.dp_mode: parameter_server; use policy 'stall'")
    if par.ep > 1 or par.cp > 1:
        raise ConfigError(f"parallel.dp_mode='parameter_server': not with ep={par.ep}, "
                          f"cp={par.cp} (workers are the DP replicas of a dense model)")


def ps_layout_gpus(cfg: Any, num_gpus: int) -> int:
    """The cluster's GPUs the layout covers: all, or under ``dp_mode: parameter_server``
    those before the ``ps_servers`` server ranks (ConfigError if none are left)."""
    par = cfg.parallel
    if par.dp_mode != "parameter_server":
        return num_gpus
    if par.ps_servers >= num_gpus:
        raise ConfigError(f"parallel.ps_servers={par.ps_servers}: the servers take the last "
                          f"ranks of the cluster, but it has only cluster.num_gpus={num_gpus}")
    return num_gpus - par.ps_servers


def ps_servers(exp: Any) -> tuple[int, ...]:
    """The parameter servers' ranks of ``exp``: the cluster's last ``parallel.ps_servers``
    (after the layout's GPUs); () under ``dp_mode: allreduce``."""
    if exp.config.parallel.dp_mode != "parameter_server":
        return ()
    first = exp.placement.num_gpus
    return tuple(range(first, first + exp.config.parallel.ps_servers))


def steps_overlap(exp: Any) -> bool:
    """Whether consecutive steps of ``exp`` overlap: schedules with the Zero Bubble
    paper's post-validation (:func:`workloads.registry.overlaps_steps`) and bounded
    staleness have no barrier between steps."""
    return overlaps_steps(exp.schedule.name) or exp.config.training.max_staleness > 0


def run_steps(steps: int, tokens_factor: float) -> int:
    """Steps a run of ``steps`` synchronous-equivalent steps takes when it needs
    ``tokens_factor`` times the tokens (``training.tokens_factor``): ceil(steps·factor)."""
    return max(1, math.ceil(steps * tokens_factor - 1e-9))


def stale_steps(staleness: int) -> int:
    """Steps simulated under bounded staleness ``S``: 2S + 3, so that the middle step, whose
    period is reported, has S + 1 steps before it (a worker's lead fills) and after it."""
    return 2 * staleness + 3


def cycle_stats(sync: dict[str, Any], local: dict[str, Any], sync_every: int) -> dict[str, Any]:
    """The stats of local SGD with H = ``sync_every`` from a synchronising step's and a
    local step's: ``step_time_s`` the mean over a cycle of H steps, ((H - 1)·local +
    sync) / H; the per-second rates scaled to it; ``exposed_comm_s`` and
    ``bubble_fraction`` the cycle's means; adds ``sync_every``, ``sync_step_time_s`` and
    ``local_step_time_s``. Memory, the idle breakdown and the rest are the synchronising
    step's. With H = 1, ``sync`` unchanged."""
    if sync_every == 1:
        return sync
    h = sync_every
    t_sync, t_local = sync["step_time_s"], local["step_time_s"]
    mean = ((h - 1) * t_local + t_sync) / h
    out = dict(sync)
    out["step_time_s"] = mean
    for key in RATE_KEYS:
        if out.get(key) is not None and mean > 0:
            out[key] = out[key] * t_sync / mean
    out["exposed_comm_s"] = {kind: ((h - 1) * local["exposed_comm_s"][kind] + sec) / h
                             for kind, sec in sync["exposed_comm_s"].items()}
    if mean > 0:
        idle = ((h - 1) * local["bubble_fraction"] * t_local
                + sync["bubble_fraction"] * t_sync) / h
        out["bubble_fraction"] = idle / mean
        out["bubble_ratio"] = (out["bubble_fraction"] / (1 - out["bubble_fraction"])
                               if out["bubble_fraction"] < 1 else None)
    out.update({"sync_every": h, "sync_step_time_s": t_sync, "local_step_time_s": t_local})
    return out
