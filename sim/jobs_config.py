"""A multi-job file: several experiments sharing one cluster. Schema only (pydantic, strict).

```yaml
name: two-jobs
cluster: {preset: dgx-a100-80g, num_gpus: 32, topology: fat-tree, oversubscription: 4.0}
jobs:
  - name: a                  # each job: an experiment without cluster and faults ...
    gpus: 0-15               # ... and the shared cluster's GPUs it runs on
    model: {preset: gpt3-1.3b}
    parallel: {tp: 4, pp: 2}
    training: {global_batch_size: 64}
  - name: b
    gpus: [16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31]
    ...
```

What the jobs do together is in :mod:`sim.jobs`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from base.errors import ConfigError
from base.schema import Strict
from sim.config import ModelConfig, ParallelConfig, TrainingConfig, validated
from topologies.config import ClusterConfig

MAX_JOBS = 64
"""Most jobs a file may list (each is lowered and simulated at full fidelity)."""


class JobConfig(Strict):
    """One job on the shared cluster: an experiment's model, layout, training and schedule,
    and the GPUs it runs on."""

    name: str
    """The job's name (unique in the file); names its stats in ``jobs``."""
    gpus: list[int] | str
    """The shared cluster's GPUs the job runs on, in the order of its ranks: a list of
    global GPU ids, or ranks and inclusive ranges such as ``0-7,16-23``. Jobs may not
    share a GPU."""
    model: ModelConfig
    """The job's model (as an experiment's ``model``)."""
    parallel: ParallelConfig = ParallelConfig()
    """The job's layout over its own GPUs (``dp`` derived from their count)."""
    training: TrainingConfig = TrainingConfig()
    """The job's batch sizes, recomputation and kernels."""
    schedule: str = "1f1b"
    """The job's pipeline schedule."""


class JobsConfig(Strict):
    """A multi-job file: jobs simulated together on one cluster, their traffic sharing its
    links (:mod:`sim.jobs`)."""

    name: str = "jobs"
    """Shown in outputs."""
    cluster: ClusterConfig
    """The shared cluster (any kind an experiment's ``cluster`` may be)."""
    jobs: list[JobConfig] = Field(min_length=1, max_length=MAX_JOBS)
    """The jobs: each an experiment without ``cluster`` and ``faults``, with ``gpus``."""


def parse_jobs(data: Any) -> JobsConfig:
    """Validate a parsed multi-job mapping; raise ConfigError naming key and value."""
    return validated(JobsConfig, data)


def gpu_ids(spec: list[int] | str, num_gpus: int, where: str) -> tuple[int, ...]:
    """The GPU ids of a job's ``gpus`` (a list, or ranks and ranges ``0-7,16-23``), checked:
    each a GPU of the cluster (0..num_gpus-1), none twice; ConfigError naming ``where``."""
    ids: list[int] = []
    if isinstance(spec, str):
        for part in spec.split(","):
            low, dash, high = part.strip().partition("-")
            try:
                first, last = int(low), int(high if dash else low)
            except ValueError:
                raise ConfigError(f"{where}={spec!r}: expected GPU ids and ranges like "
                                  "0-7,16-23") from None
            if last < first or first < 0:
                raise ConfigError(f"{where}={spec!r}: {part.strip()!r} is not an increasing "
                                  "range of GPU ids")
            if last >= num_gpus:
                raise ConfigError(f"{where}={spec!r}: GPU {last} is not in the cluster (GPUs "
                                  f"0..{num_gpus - 1})")
            ids.extend(range(first, last + 1))
    else:
        ids = list(spec)
    if not ids:
        raise ConfigError(f"{where}: no GPUs given")
    bad = [g for g in ids if not 0 <= g < num_gpus]
    if bad:
        raise ConfigError(f"{where}: GPU {bad[0]} is not in the cluster (GPUs "
                          f"0..{num_gpus - 1})")
    twice = sorted({g for g in ids if ids.count(g) > 1}) if len(set(ids)) < len(ids) else []
    if twice:
        raise ConfigError(f"{where}: GPU {twice[0]} is listed twice")
    return tuple(ids)
