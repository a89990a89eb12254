"""Layout search: enumerate an experiment's valid layouts, screen them, simulate, rank.

``sim search`` answers "which layout should I run?" for an experiment's model,
cluster and global batch (issue 6). Four steps:

1. **Enumerate** (:func:`enumerate_layouts`): tp, pp, dp, cp, ep, vpp,
   micro-batch size, sequence parallelism, ZeRO stage, recomputation and
   schedule, keeping combinations that divide correctly: ``tp·pp·cp·dp`` =
   GPUs, ``micro_batch_size·dp`` divides the global batch, tp divides the
   attention heads (and, with sequence parallelism, the sequence), ``pp·vpp``
   stages fit in the layers, and the schedule builder accepts ``(pp, m, vpp)``.
   CP needs a flash kernel and ``2·cp`` equal sequence chunks; EP a
   mixture-of-experts model whose experts it divides (with any ZeRO stage).
   Values the simulator does not support (e.g. EP on a dense model, ZeRO-3
   on a synthetic one) are found by probing a tiny experiment once
   (:func:`probe_support`) and are left out, counted as ``unsupported``.
   Exact duplicates are dropped unless pinned: sequence parallelism without
   TP (a no-op), several ZeRO stages with ``dp = 1`` (identical), schedules
   other than 1F1B with ``pp = 1`` (one rank: the same order of work, GPipe
   only holding more), interleaving with ``vpp = 1`` (plain 1F1B).
   ``vpp`` of the interleaved schedule ranges over ``v >= 2`` with
   ``pp·v`` dividing the layers (Megatron-LM's rule); V schedules use 2.
   Unless pinned, CP degrees whose ring attention cannot hide its K/V
   passes on the fastest link are left out (fewer than ``(kv/h)·F/B``
   tokens per rank, :func:`cp_min_tokens`: ``cp = 1`` only for GPT-3's
   2,048 tokens on A100, 522,456 layouts down to 90,360). A
   ``parallel.layers_per_stage`` list in the file fixes the stage count ``pp·vpp``;
   ``balanced`` splits each layout's layers as ``sim run`` does
   (:func:`sim.experiment.balanced_layers`, on the real cluster).
2. **Screen and judge** (:class:`Screener`) with bounds that need no simulation,
   on the executor's workers (:class:`SearchWorker`): screening in compact
   chunks of whole ``(tp, cp, micro-batch)`` groups (:func:`_screen_chunks`: a
   group's op times and TP collectives are computed by one worker), judging in
   chunks ahead of the sweep's frontier.
   Screening is cheap and schedule-free: the average static state per rank
   plus one micro-batch of activations must fit, and a loose step-time bound
   (compute of the first and last pipeline rank, the forward chain before
   them, their TP collectives, optimizer and ZeRO gather) orders the
   layouts best first. When a layout's turn comes it is judged: its schedule
   is built and walked in program order as the engine allocates memory (an
   exact lower bound of the peak memory, :meth:`Screener.memory_bound_bytes`),
   and with pruning a list schedule of its ops gives a tight lower bound of
   the step time (:meth:`Screener.step_bound_s`); layouts that cannot fit, or
   whose throughput bound is below the K-th best already simulated, are not
   simulated. Property tests check every bound against the simulator.
3. **Simulate** the rest (collapsed fidelity by default) on an executor of
   :mod:`sim.executors`; idle workers simulate ahead, speculatively, what the
   sweep will probably want (:class:`_Sweep`). Every wanted result (or error)
   goes to a :class:`ResultStore` (SQLite, one transaction per result) as it
   arrives; a restarted sweep with the same store skips what is there.
4. **Rank** feasible layouts by throughput (tokens/s; ties: less memory, then
   the layout key).

Mixed-GPU clusters (``cluster.nodes``): each pipeline rank's ops are timed in the
bounds on the fastest GPU type among its GPUs (every GPU of the rank takes at
least that long, so the bounds stay bounds), and the memory walk checks each
rank against the smallest memory among its GPUs (a layout fits only if every
GPU fits). A layout whose pipeline ranks mix GPU types cannot be collapsed
(:func:`sim.api.simulate`): with fidelity ``collapsed`` it is ``invalid``
without simulation; ``auto`` simulates it in full. Without a given device
profile every GPU type is timed with its own, as ``sim run`` does.

Pins (:func:`parse_pins`, :func:`pins_from_file`) restrict any dimension to
given values. Pruning happens in rounds of ``round_size`` layouts, each round
judged on the results of the rounds before it, so the set of simulated
layouts (not only the top K), every bound and every figure are the same
whatever executor or number of workers runs the sweep (work done ahead that
the rounds do not want is discarded, never stored).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import sqlite3
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from base.errors import ConfigError, ScheduleError, SimError
from sim.api import AUTO_FULL_MAX_GPUS, FIDELITIES, simulate
from sim.calibration import default_profile
from sim.commtime import CollectiveTimer
from sim.config import ExperimentConfig, parse_config, set_dotted
from sim.device import DeviceProfile, compute_time_s
from sim.executors import Executor, InlineExecutor, Task, WorkerFailure
from sim.experiment import (
    balanced_layers,
    build_experiment,
    check_attention_kernel,
    schedule_builders,
)
from topologies.build import build_cluster
from topologies.cluster import Cluster
from topologies.hardware import GiB
from topologies.placement import Placement
from workloads.costs import CommSeg, ComputeSeg, RingAttention, split_layers
from workloads.models import ModelSpec
from workloads.schedules import BACKWARD, FORWARD, WEIGHT_GRAD, Op, Schedule, schedule_deps
from workloads.schedules_advanced import OVERLAPPING_STEPS
from workloads.seqchunks import FLASH_KERNELS
from workloads.transformer import TransformerCosts

__all__ = ["CSV_FIGURES", "DIMS", "Candidate", "Evaluation", "Evaluator", "JudgeChunk", "Layout",
           "ResultStore", "Row", "ScreenChunk", "SearchContext", "SearchResult", "SearchWorker",
           "Screener", "SimulateOne", "WorkerSpec", "cp_min_tokens", "enumerate_layouts",
           "parse_pins", "pins_from_file", "probe_support", "rows_csv", "search"]

# ----------------------------------------------------------------------------- layouts

DIMS = ("tp", "pp", "dp", "cp", "ep", "vpp", "sequence_parallel", "zero_stage",
        "micro_batch_size", "recompute", "schedule")
"""The searched dimensions, in the order of a layout key."""
CONFIG_KEYS = {
    "tp": "parallel.tp", "pp": "parallel.pp", "dp": "parallel.dp", "cp": "parallel.cp",
    "ep": "parallel.ep", "vpp": "parallel.vpp",
    "sequence_parallel": "parallel.sequence_parallel", "zero_stage": "parallel.zero_stage",
    "micro_batch_size": "training.micro_batch_size", "recompute": "training.recompute",
    "schedule": "schedule",
}
"""Experiment-file key of each dimension."""
_SHORT = {"sequence_parallel": "sp", "zero_stage": "zero", "micro_batch_size": "mbs"}
ALIASES = {**{d: d for d in DIMS}, **{v: k for k, v in CONFIG_KEYS.items()},
           **{v: k for k, v in _SHORT.items()}}
"""Names accepted by ``--fix``: the dimension, its file key, or the short name in layout keys."""
RECOMPUTE = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)
OOM_SLACK = 1e-9
"""Relative slack of the memory pre-filter: a bound this close to the capacity is not rejected
(the engine sums the same bytes in another order)."""


@dataclass(frozen=True)
class Layout:
    """One point of the search space: how the step is split over the GPUs."""

    tp: int
    pp: int
    dp: int
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    sequence_parallel: bool = False
    zero_stage: int = 1
    micro_batch_size: int = 1
    recompute: str = "none"
    schedule: str = "1f1b"

    @cached_property
    def key(self) -> str:
        """Canonical text form, e.g. ``tp=8 pp=8 dp=16 ... recompute=none schedule=1f1b``
        (computed once per instance: the sweep's dictionaries are keyed by it)."""
        return " ".join(f"{_SHORT.get(d, d)}={_text(getattr(self, d))}" for d in DIMS)

    @classmethod
    def from_key(cls, key: str) -> Layout:
        """Inverse of :attr:`key`."""
        values = dict(part.split("=", 1) for part in key.split())
        return cls(**{d: _parse_value(d, values[_SHORT.get(d, d)]) for d in DIMS})

    def changes(self, global_batch_size: int) -> dict[str, Any]:
        """Dotted experiment-file changes that select this layout (for ``with_changes``)."""
        out: dict[str, Any] = {CONFIG_KEYS[d]: getattr(self, d) for d in DIMS}
        out["training.global_batch_size"] = global_batch_size
        out["training.num_microbatches"] = None
        return out

    def settings(self) -> dict[str, Any]:
        """``{"parallel": {...}, "training": {...}, "schedule": name}``, as in experiment files."""
        out: dict[str, Any] = {"parallel": {}, "training": {}}
        for d in DIMS:
            section, _, name = CONFIG_KEYS[d].rpartition(".")
            if section:
                out[section][name] = getattr(self, d)
            else:
                out[name] = getattr(self, d)
        return out

    def label(self) -> str:
        """Short human-readable form for tables: ``tp8 pp8 dp16 v1 mbs1 sp zero1 none 1f1b``."""
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        parts += [f"cp{self.cp}"] if self.cp > 1 else []
        parts += [f"ep{self.ep}"] if self.ep > 1 else []
        parts += [f"v{self.vpp}", f"mbs{self.micro_batch_size}"]
        parts += ["sp"] if self.sequence_parallel else []
        parts += [f"z{self.zero_stage}", f"rc:{self.recompute}", self.schedule]
        return " ".join(parts)


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


_BOOLS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False,
          "on": True, "off": False}


def _parse_value(dim: str, text: str) -> Any:
    """Parse a ``--fix`` value of ``dim``; ConfigError naming the key and value."""
    key = CONFIG_KEYS[dim]
    text = text.strip()
    if dim == "sequence_parallel":
        if text.lower() not in _BOOLS:
            raise ConfigError(f"--fix {key}={text!r}: expected true or false")
        return _BOOLS[text.lower()]
    if dim == "recompute":
        if text not in RECOMPUTE:
            raise ConfigError(f"--fix {key}={text!r}: choose one of {', '.join(RECOMPUTE)}")
        return text
    if dim == "schedule":
        if not text:
            raise ConfigError(f"--fix {key}: empty schedule name")
        return text
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"--fix {key}={text!r}: expected an integer") from None
    low = 0 if dim == "zero_stage" else 1
    if value < low or (dim == "zero_stage" and value > 3):
        bounds = "0..3" if dim == "zero_stage" else ">= 1"
        raise ConfigError(f"--fix {key}={value}: must be {bounds}")
    return value


Pins = Mapping[str, tuple[Any, ...]]
"""Allowed values per pinned dimension."""


def parse_pins(specs: Iterable[str]) -> dict[str, tuple[Any, ...]]:
    """Parse ``--fix`` arguments: ``"parallel.tp=8,schedule=1f1b"``, ``"mbs=1|2"``.

    Pins are separated by commas, alternatives by ``|``; names may be the
    dimension (``micro_batch_size``), its file key (``training.micro_batch_size``)
    or the short form of layout keys (``mbs``, ``sp``, ``zero``). A dimension pinned
    again keeps the values both pins allow (``tp=1|2|4`` then ``tp=2|8`` is ``tp=2``).
    """
    pins: dict[str, tuple[Any, ...]] = {}
    for spec in specs:
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, eq, values = part.partition("=")
            dim = ALIASES.get(name.strip())
            if not eq or dim is None:
                raise ConfigError(f"--fix {part!r}: expected KEY=VALUE with KEY one of "
                                  f"{', '.join(CONFIG_KEYS.values())}")
            parsed = tuple(dict.fromkeys(_parse_value(dim, v) for v in values.split("|")))
            if dim in pins:  # pinned again: keep the values both allow
                both = tuple(v for v in pins[dim] if v in parsed)
                if not both:
                    raise ConfigError(f"--fix {CONFIG_KEYS[dim]}: pinned to "
                                      f"{'|'.join(map(_text, pins[dim]))} and to "
                                      f"{'|'.join(map(_text, parsed))}, which share no value")
                parsed = both
            pins[dim] = parsed
    return pins


def pins_from_file(data: Mapping[str, Any]) -> dict[str, tuple[Any, ...]]:
    """Pins for every searched key the experiment file sets (``--pin-from-file``)."""
    pins: dict[str, tuple[Any, ...]] = {}
    for dim, key in CONFIG_KEYS.items():
        node: Any = data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        if node is not None:
            pins[dim] = (node,)
    return pins


# ----------------------------------------------------------------------------- context

NEUTRAL_GPUS = 4
_LAYOUT_PARALLEL_KEYS = frozenset({*(k.rpartition(".")[2] for k in CONFIG_KEYS.values()),
                                   "layers_per_stage"})


def _neutral(data: Mapping[str, Any], gpus: int, gbs: int, **settings: Any) -> dict[str, Any]:
    """The experiment on an ideal cluster of ``gpus`` with a small layout: cheap to build."""
    out = {k: v for k, v in data.items() if k not in ("cluster", "parallel", "schedule")}
    out["cluster"] = {"preset": "ideal", "num_gpus": gpus}
    training = {k: v for k, v in (data.get("training") or {}).items()
                if k not in ("micro_batch_size", "num_microbatches", "recompute")}
    out["training"] = {**training, "micro_batch_size": 1, "global_batch_size": gbs}
    parallel = {k: v for k, v in settings.items() if k != "schedule"}
    # the file's other parallel settings (gradient buckets, placement) shape the cost model
    # too; the searched keys and the per-stage layer split (stage count) are the layout's
    kept = {k: v for k, v in (data.get("parallel") or {}).items()
            if k not in _LAYOUT_PARALLEL_KEYS}
    out["parallel"] = {**kept, "tp": 1, "pp": 1, "dp": gpus, **parallel}
    out["schedule"] = settings.get("schedule", "1f1b")
    return out


@dataclass(frozen=True, eq=False)
class SearchContext:
    """What a search of one experiment needs: its model, cluster, batch and support table."""

    data: dict[str, Any]
    """The experiment mapping (with ``--gpus`` applied); layouts are changes to it."""
    base_dir: Path | None
    config: ExperimentConfig
    model: ModelSpec
    cluster: Cluster
    global_batch_size: int
    costs: TransformerCosts
    """The cost model as the experiment builds it, for one GPU; :meth:`costs_for` varies it."""
    unsupported: dict[str, str]
    """``"dim=value"`` -> why the simulator refuses it (e.g. ``"cp=2"``)."""
    schedule_vpps: dict[str, tuple[int, ...]]
    """Supported schedule -> the vpp values its builder takes (``()``: any v >= 2)."""

    @classmethod
    def build(cls, data: Mapping[str, Any], base_dir: str | Path | None = None,
              gpus: int | None = None,
              probed: tuple[dict[str, str], dict[str, tuple[int, ...]]] | None = None
              ) -> SearchContext:
        """Validate the experiment mapping and probe what the simulator supports (unless
        ``probed`` gives the result of :func:`probe_support`, as workers do)."""
        data = dict(data)
        if gpus is not None:
            if gpus < 1:
                raise ConfigError(f"--gpus={gpus}: must be at least 1")
            data = set_dotted(data, "cluster.num_gpus", gpus)
            data = set_dotted(data, "parallel.dp", None)
        if not isinstance(data.get("model"), Mapping) or "synthetic" in data["model"]:
            raise ConfigError("model: sim search needs a transformer model (preset or explicit "
                              "shape), not a synthetic one")
        cfg = parse_config(data)
        gbs = cfg.training.global_batch_size
        if gbs is None:
            try:
                gbs = build_experiment(data, Path(base_dir) if base_dir else None
                                       ).global_batch_size
            except ConfigError as exc:
                raise ConfigError(f"training.global_batch_size: sim search needs it (or a valid "
                                  f"layout with training.num_microbatches): {exc}") from None
        template = build_experiment(_neutral(data, 1, 1, dp=1))
        if not isinstance(template.costs, TransformerCosts) or template.model is None:
            raise ConfigError("model: sim search needs a transformer model")
        cluster = build_cluster(cfg.cluster)
        check_attention_kernel(cfg.training.attention, cluster)
        unsupported, vpps = probed or probe_support(data, template.model.num_layers)
        return cls(data, Path(base_dir) if base_dir else None, cfg, template.model, cluster,
                   gbs, template.costs, unsupported, vpps)

    _memo: dict[tuple[Any, ...], Any] = field(default_factory=dict, init=False, repr=False)
    """Caches of :meth:`rank_types`, :meth:`stage_schedule` and balanced splits (each a pure
    function of its key; per instance, so per worker)."""

    def costs_for(self, layout: Layout, num_stages: int) -> TransformerCosts:
        """The cost model of ``layout`` (as :func:`sim.experiment.build_experiment` makes it:
        the file's ``layers_per_stage`` list, its ``balanced`` split, or the even split)."""
        given = self.config.parallel.layers_per_stage
        stages = (tuple(given) if isinstance(given, list | tuple) and len(given) == num_stages
                  else split_layers(self.model.num_layers, num_stages))
        extra = {k: getattr(layout, k) for k in ("cp", "ep") if hasattr(self.costs, k)}
        costs = replace(self.costs, micro_batch_size=layout.micro_batch_size, tp=layout.tp,
                        dp=layout.dp, stage_layers=stages,
                        sequence_parallel=layout.sequence_parallel and layout.tp > 1,
                        zero_stage=layout.zero_stage, recompute=layout.recompute, **extra)
        if given == "balanced":
            costs = replace(costs, stage_layers=self._balanced(layout, costs))
        return costs

    def _balanced(self, layout: Layout, costs: TransformerCosts) -> tuple[int, ...]:
        """``parallel.layers_per_stage: balanced``: the split :func:`sim.experiment.
        balanced_layers` gives ``layout`` (it depends on the cost model, which rank holds
        each stage, the placement and the GPUs, not on the number of micro-batches, so it
        is computed on a small build of the schedule and cached)."""
        key = ("balanced", costs, layout.schedule, layout.pp, layout.vpp)
        hit = self._memo.get(key)
        if hit is None:
            sched = self.stage_schedule(layout.schedule, layout.pp, layout.vpp,
                                        self.global_batch_size
                                        // (layout.micro_batch_size * layout.dp))
            hit = costs.stage_layers if sched is None else balanced_layers(
                costs, sched, self.placement(layout.tp, layout.cp, layout.dp, layout.pp),
                self.cluster)
            self._memo[key] = hit
        return hit

    def placement(self, tp: int, cp: int, dp: int, pp: int) -> Placement:
        """Where the layout's ranks go (the file's ``parallel.placement`` order)."""
        return Placement.from_order(self.config.parallel.placement, tp=tp, cp=cp, dp=dp, pp=pp)

    def stage_schedule(self, name: str, p: int, v: int, m: int | None = None
                       ) -> Schedule | None:
        """A small build of schedule ``name`` for ``p`` ranks and ``v`` chunks (``2p`` or ``4p``
        micro-batches, else ``m``), for what does not depend on the number of micro-batches:
        which rank holds each stage and whether the backward is split; None if the builder
        refuses all of them."""
        builder = schedule_builders()[name]
        extra = (self.config.training.seq_chunks,) if name == "seq1f1b" else ()

        def build(counts: tuple[int, ...]) -> Schedule | None:
            for count in counts:
                try:
                    return builder(p, count, v, *extra)
                except (ScheduleError, ValueError):
                    continue
            return None

        key = ("schedule", name, p, v)
        if key not in self._memo:
            self._memo[key] = build((2 * p, 4 * p))
        if self._memo[key] is not None or m is None:
            return self._memo[key]
        if (key, m) not in self._memo:
            self._memo[key, m] = build((m,))
        return self._memo[key, m]

    def rank_types(self, tp: int, cp: int, dp: int, pp: int) -> tuple[tuple[int, ...], ...]:
        """Per pipeline rank: the GPU types its GPUs have, as indices into
        ``cluster.gpu_types`` (``((0,),) * pp`` on a uniform cluster). A rank with more
        than one type mixes GPU types (:func:`topologies.placement.mixed_pipeline_ranks`)."""
        key = ("types", tp, cp, dp, pp)
        hit = self._memo.get(key)
        if hit is None:
            if not self.cluster.heterogeneous:
                hit = ((0,),) * pp
            else:
                index = {spec: i for i, spec in enumerate(self.cluster.gpu_types)}
                pl = self.placement(tp, cp, dp, pp)
                seen: list[dict[int, None]] = [{} for _ in range(pp)]
                for g in range(pl.num_gpus):
                    seen[pl.coords(g)["pp"]][index[self.cluster.gpu_of(g)]] = None
                hit = tuple(tuple(sorted(t)) for t in seen)
            self._memo[key] = hit
        return hit

    def fingerprint(self, fidelity: str, profile: DeviceProfile) -> str:
        """Identifies results: the experiment minus the searched keys, fidelity and profile."""
        data = self.data
        for key in (*CONFIG_KEYS.values(), "training.num_microbatches", "name"):
            data = set_dotted(data, key, None)
        data = set_dotted(data, "training.global_batch_size", self.global_batch_size)
        blob = json.dumps({"experiment": data, "fidelity": fidelity, "profile": asdict(profile)},
                          sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def probe_support(data: Mapping[str, Any], num_layers: int
                  ) -> tuple[dict[str, str], dict[str, tuple[int, ...]]]:
    """Which dimension values and schedules the simulator accepts for this model.

    Each probe builds the experiment on a tiny ideal cluster with one value
    changed; a :class:`ConfigError` marks the value unsupported (with its
    message). Schedules: the vpp values their builder takes at ``p = 2`` (1, 2
    or any), then one build with the first of them.
    """
    unsupported: dict[str, str] = {}
    probes = {"cp=2": {"cp": 2, "dp": 1}, "ep=2": {"ep": 2},
              "zero=3": {"zero_stage": 3}}
    for name, settings in probes.items():
        try:
            build_experiment(_neutral(data, 2, 2, **{"dp": 2, **settings}))
        except ConfigError as exc:
            unsupported[name] = str(exc)
    vpps: dict[str, tuple[int, ...]] = {}
    seq_chunks = (data.get("training") or {}).get("seq_chunks", 4)
    for name, builder in schedule_builders().items():
        ok = []
        for v in (1, 2, 3):
            try:
                extra = (seq_chunks,) if name == "seq1f1b" else ()
                if builder(2, 4, v, *extra).chunks_per_rank == v:
                    ok.append(v)
            except (ScheduleError, ConfigError, ValueError, TypeError):
                continue
        if not ok:
            unsupported[f"schedule={name}"] = "its builder accepts no vpp at pp=2"
            continue
        v0 = ok[0] if ok[0] > 1 or len(ok) == 1 else ok[1]
        try:
            if 2 * v0 > num_layers:
                raise ConfigError(f"needs {2 * v0} stages, the model has {num_layers} layers")
            build_experiment(_neutral(data, 2, 4, dp=1, pp=2, vpp=v0, schedule=name))
        except ConfigError as exc:
            unsupported[f"schedule={name}"] = str(exc)
            continue
        vpps[name] = () if len(ok) > 2 else tuple(ok)
    return unsupported, vpps


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _allowed(pins: Pins, dim: str, values: Iterable[Any], dedupe: Sequence[Any] | None = None
             ) -> list[Any]:
    """``values`` restricted to the pins of ``dim``; unpinned, to ``dedupe`` if given."""
    values = list(values)
    if dim in pins:
        return [v for v in values if v in pins[dim]]
    if dedupe is not None:
        return [v for v in values if v in dedupe]
    return values


def cp_min_tokens(ctx: SearchContext) -> float:
    """Fewest sequence tokens per CP rank (``seq_length / cp``) at which ring attention can
    hide its K/V passes behind its blocks, on the fastest link a ring can use.

    Each of the ``cp - 1`` passes of a rank's ring (:class:`workloads.costs.RingAttention`)
    brings the K and V of ``t = s/cp`` tokens, ``4·b·t·kv/tp`` bytes (bf16), while the
    rank computes one block, at most ``4·b·t²·h/tp`` FLOPs (QKᵀ and PV of a full block;
    causal, load-balanced blocks do less). At the GPU's dense BF16 peak ``F`` and its NVLink
    bandwidth per direction ``B`` the pass hides only if ``t ≥ (kv/h)·F/B``: 1,040 tokens
    for multi-head attention on A100 (312 TFLOP/s, 300 GB/s), 1/8 of that with 8-fold GQA.
    Below it every pass is exposed, on any placement: enumeration drops such CP degrees
    unless ``cp`` is pinned (:func:`enumerate_layouts`).
    """
    model = ctx.model
    ratios = []
    for gpu in ctx.cluster.gpu_types:  # a mixed cluster: the GPU type that hides most
        if not gpu.nvlink_bandwidth_Bps or not math.isfinite(gpu.nvlink_bandwidth_Bps):
            return 0.0
        ratios.append(gpu.peak_bf16_flops / gpu.nvlink_bandwidth_Bps)
    return model.kv_dim / model.hidden_size * min(ratios)


def _schedule_variants(ctx: SearchContext, pins: Pins, pp: int) -> list[tuple[str, int]]:
    """(schedule, vpp) pairs for ``pp`` pipeline ranks."""
    layers = ctx.model.num_layers
    names = [n for n in ctx.schedule_vpps if "schedule" not in pins or n in pins["schedule"]]
    if pp == 1 and "schedule" not in pins:
        names = [n for n in names if n == "1f1b"] or names[:1]
    out = []
    for name in names:
        vpps: Sequence[int] = ctx.schedule_vpps[name]
        if not vpps:  # any v: interleaving, v >= 2 with pp*v dividing the layers (Megatron)
            vpps = [v for v in range(2, layers // pp + 1) if layers % (pp * v) == 0]
            if "vpp" in pins:
                vpps = [v for v in pins["vpp"] if pp * v <= layers]
        out += [(name, v) for v in _allowed(pins, "vpp", vpps) if pp * v <= layers]
    given = ctx.config.parallel.layers_per_stage
    if isinstance(given, list | tuple):  # the file's per-stage split fixes the count pp·vpp
        out = [(name, v) for name, v in out if pp * v == len(given)]
    return out


def enumerate_layouts(ctx: SearchContext, pins: Pins | None = None) -> Iterator[Layout]:
    """Every layout of the search space that divides correctly, in a deterministic order.

    Not checked here (the screener does): whether the schedule builder accepts
    the number of micro-batches.
    """
    pins = pins or {}
    unknown = [s for s in pins.get("schedule", ()) if s not in schedule_builders()]
    if unknown:
        raise ConfigError(f"--fix schedule={unknown[0]!r}: unknown schedule; choose from "
                          f"{', '.join(schedule_builders())}")
    n, model, gbs = ctx.cluster.num_gpus, ctx.model, ctx.global_batch_size
    supported = {d: [v for v in values if f"{_SHORT.get(d, d)}={v}" not in ctx.unsupported]
                 for d, values in (("cp", _divisors(n)), ("ep", _divisors(n)),
                                   ("zero_stage", ZERO_STAGES))}
    ring = ctx.config.training.attention in FLASH_KERNELS  # CP runs inside it
    cps = [c for c in supported["cp"]
           if c == 1 or (ring and model.seq_length % (2 * c) == 0)]  # 2·cp equal chunks
    min_tokens = cp_min_tokens(ctx)  # unpinned: CP degrees whose ring can hide its passes
    useful_cps = [c for c in cps if c == 1 or model.seq_length / c >= min_tokens]
    for tp in _allowed(pins, "tp", _divisors(n)):
        if model.num_attention_heads % tp:
            continue
        for cp in _allowed(pins, "cp", [c for c in cps if (n // tp) % c == 0],
                           dedupe=[1] if "cp=2" in ctx.unsupported else useful_cps):
            if cp > 1 and (n // tp) % cp:
                continue
            for pp in _allowed(pins, "pp", _divisors(n // (tp * cp))):
                if pp > model.num_layers:
                    continue
                dp = n // (tp * cp * pp)
                if dp not in pins.get("dp", (dp,)) or gbs % dp:
                    continue
                yield from _inner_layouts(ctx, pins, supported, tp, cp, pp, dp)


def _inner_layouts(ctx: SearchContext, pins: Pins, supported: Mapping[str, list[int]],
                   tp: int, cp: int, pp: int, dp: int) -> Iterator[Layout]:
    seq, gbs = ctx.model.seq_length, ctx.global_batch_size
    moe = getattr(ctx.model, "moe", None)
    eps = _allowed(pins, "ep", [e for e in supported["ep"] if dp % e == 0 and (
        e == 1 or (moe is not None and moe.num_experts % e == 0))],
        dedupe=[1] if "ep=2" in ctx.unsupported else None)
    sps = _allowed(pins, "sequence_parallel", [False, True] if seq % tp == 0 else [False],
                   dedupe=None if tp > 1 else [False])
    zeros = _allowed(pins, "zero_stage", supported["zero_stage"])
    if dp == 1 and "zero_stage" not in pins:
        zeros = zeros[:1]
    recomputes = _allowed(pins, "recompute", RECOMPUTE)
    variants = _schedule_variants(ctx, pins, pp)
    for ep in eps:
        for mbs in _allowed(pins, "micro_batch_size", _divisors(gbs // dp)):
            for schedule, vpp in variants:
                if cp > 1 and schedule == "seq1f1b":  # CP and sequence chunks do not compose
                    continue
                for sp in sps:
                    for zero in zeros:
                        for rc in recomputes:
                            yield Layout(tp, pp, dp, cp, ep, vpp, sp, zero, mbs, rc, schedule)


# ----------------------------------------------------------------------------- screening

_KINDS = (FORWARD, BACKWARD, WEIGHT_GRAD)
_SLOT = {k: i for i, k in enumerate(_KINDS)}
PLAN_CACHE_OPS = 1_000_000
"""Ops of the built schedules a :class:`Screener` keeps (about 120-250 bytes each; least
recently used are dropped beyond it). GPT-3 175B on 1,024 GPUs judges 251 distinct
schedules of 320,000 ops in all: kept whole, none is built twice (a cap of 64 schedules
built 787)."""


@dataclass(frozen=True)
class _Plan:
    """A built schedule in the form the bounds use: ops as indices, in dependency order."""

    name: str
    num_microbatches: int
    stage_rank: tuple[int, ...]
    split_backward: bool
    exact: bool
    """False with sequence chunks (activation shares per chunk are not modelled here)."""
    rank_stages: tuple[tuple[int, ...], ...]
    in_flight: tuple[np.ndarray, ...]
    """Per rank: the distinct (in-flight counts per local stage, op slot) rows of
    :func:`_in_flight`."""
    order: tuple[int, ...]
    """Op indices in an order where every op follows its producers and its rank predecessors."""
    op_rank: tuple[int, ...]
    op_slot: tuple[int, ...]
    """``3·stage + kind`` (F, B, W): index of the op's duration in a table."""
    op_deps: tuple[tuple[int, ...], ...]
    last_op: tuple[int, ...]
    """Per rank: its last op in program order."""
    final_op: tuple[int, ...]
    """Per rank: its last weight-gradient op (last backward without split), whose stage's
    DP gradient collective ends the rank's step."""


def _plan_size(plan: _Plan | str) -> int:
    """Ops of a plan (1 for a refusal): what the plan cache counts."""
    return 1 if isinstance(plan, str) else max(1, len(plan.op_rank))


def _build_plan(name: str, p: int, m: int, v: int, w: float, seq_chunks: int) -> _Plan:
    """Build the schedule and index it; ScheduleError if the builder refuses or it deadlocks."""
    builder = schedule_builders()[name]
    sched = builder(p, m, v, seq_chunks) if name == "seq1f1b" else builder(p, m, v)
    if sched.chunks_per_rank != v:
        raise ScheduleError(f"schedule {name!r} has {sched.chunks_per_rank} chunks per rank, "
                            f"not vpp={v}")
    index: dict[Op, int] = {}
    flat: list[Op] = []
    op_rank: list[int] = []
    for r, ops in enumerate(sched.rank_ops):
        for op in ops:
            index[op] = len(flat)
            flat.append(op)
            op_rank.append(r)
    deps = tuple(tuple(index[d] for d in schedule_deps(sched, op)) for op in flat)
    rank_stages = tuple(tuple(s for s, owner in enumerate(sched.stage_rank) if owner == r)
                        for r in range(sched.num_ranks))
    final_kind = WEIGHT_GRAD if sched.split_backward else BACKWARD
    last, final, in_flight = [], [], []
    for r, ops in enumerate(sched.rank_ops):
        last.append(index[ops[-1]] if ops else -1)
        finals = [index[op] for op in ops if op.kind == final_kind]
        final.append(finals[-1] if finals else -1)
        in_flight.append(_in_flight(ops, rank_stages[r], sched.split_backward, w))
    return _Plan(name, m, sched.stage_rank, sched.split_backward, sched.seq_chunks == 1,
                 rank_stages, tuple(in_flight), _topological(sched.rank_ops, index, deps, name),
                 tuple(op_rank), tuple(3 * op.stage + _SLOT[op.kind] for op in flat), deps,
                 tuple(last), tuple(final))


def _in_flight(ops: Sequence[Op], stages: tuple[int, ...], split: bool, w: float) -> np.ndarray:
    """Walk a rank's program order as the engine allocates memory; one row per distinct
    moment an op starts: the in-flight micro-batches of each local stage (columns follow
    ``stages``) and, last column, the op's slot ``3·stage + kind`` (for the working memory
    it holds while it runs).

    A forward stashes one micro-batch of its stage when it starts; a backward frees it
    when it ends (``1 - w`` of it when the weight gradient is split off; the W frees the
    rest, ``w`` = :attr:`TransformerCosts.w_retained_fraction`). Ops on a rank run one at
    a time, so memory peaks at some op's start.
    """
    local = {s: i for i, s in enumerate(stages)}
    live = [0.0] * len(stages)
    points = []
    for op in ops:
        j = local[op.stage]
        if op.kind == FORWARD:
            live[j] += 1.0
        points.append((*live, 3.0 * op.stage + _SLOT[op.kind]))
        if op.kind == BACKWARD:
            live[j] -= (1.0 - w) if split else 1.0
        elif op.kind == WEIGHT_GRAD:
            live[j] -= w
    if not points:
        return np.zeros((1, len(stages) + 1))
    return np.unique(np.array(points, dtype=float), axis=0)


def _topological(rank_ops: Sequence[Sequence[Op]], index: Mapping[Op, int],
                 deps: Sequence[tuple[int, ...]], name: str) -> tuple[int, ...]:
    """Op indices in the order a run of the ranks' programs can complete them."""
    n = len(index)
    done = bytearray(n)
    pos = [0] * len(rank_ops)
    order: list[int] = []
    while len(order) < n:
        progressed = False
        for r, ops in enumerate(rank_ops):
            while pos[r] < len(ops):
                i = index[ops[pos[r]]]
                if not all(done[j] for j in deps[i]):
                    break
                done[i] = 1
                order.append(i)
                pos[r] += 1
                progressed = True
        if not progressed:
            raise ScheduleError(f"schedule {name!r} deadlocks (ops wait on each other)")
    return tuple(order)


def _list_run(plan: _Plan, table: Sequence[float]) -> list[float]:
    """End time of every op when each op starts as soon as its rank is free and its producers
    are done, taking ``table[slot]`` seconds, and messages take no time (a list schedule)."""
    end = [0.0] * len(plan.op_rank)
    free = [0.0] * len(plan.rank_stages)
    rank, slot, deps = plan.op_rank, plan.op_slot, plan.op_deps
    for i in plan.order:
        r = rank[i]
        t = free[r]
        for j in deps[i]:
            if end[j] > t:
                t = end[j]
        t += table[slot[i]]
        end[i] = free[r] = t
    return end


@dataclass(frozen=True)
class Candidate:
    """A layout and what screening (and later judging) found out about it."""

    layout: Layout
    status: str
    """``ok`` (to simulate), ``memory`` (cannot fit), ``invalid`` (see ``reason``) or
    ``pruned`` (cannot reach the top K)."""
    reason: str = ""
    memory_bound_gib: float | None = None
    """Lower bound of the peak memory of the fullest GPU, GiB."""
    tokens_bound: float | None = None
    """Upper bound of the throughput, tokens/s."""


def _op_shape(costs: TransformerCosts) -> tuple[Any, ...]:
    """The layout settings an op's segments depend on (cache keys; not dp, not stages)."""
    return (costs.micro_batch_size, costs.tp, costs.sequence_parallel, costs.recompute,
            costs.zero_stage, getattr(costs, "cp", 1), getattr(costs, "ep", 1))


def _work_shape(costs: TransformerCosts) -> tuple[Any, ...]:
    """What an op's compute and TP collectives depend on besides its stage's layer count:
    :meth:`TransformerCosts.op_segments` without markers does not read the ZeRO stage or
    dp (ZeRO-3's gathers are markers), so layouts that differ only there share cache
    entries (a test checks the independence)."""
    return (costs.micro_batch_size, costs.tp, costs.sequence_parallel, costs.recompute,
            getattr(costs, "cp", 1), getattr(costs, "ep", 1))


def _state_shape(costs: TransformerCosts) -> tuple[Any, ...]:
    """What the model state (:meth:`TransformerCosts.static_bytes`) and the optimizer step
    depend on: parameters per GPU and how ZeRO shards them, not the micro-batch, SP or
    recomputation (a test checks the independence)."""
    return (costs.tp, getattr(costs, "cp", 1), getattr(costs, "ep", 1), costs.dp,
            costs.zero_stage, costs.stage_layers)


class Screener:
    """Bounds of a layout's peak memory and step time, without simulating it.

    :meth:`screen` is cheap and needs no schedule: it rejects layouts whose
    average static state already overflows the GPU and gives a loose
    throughput bound that orders the search. :meth:`judge`, run when a layout's
    turn comes, builds its schedule for the exact memory walk and a
    list-schedule step bound. ``comm`` (valid for collapsed fidelity): time the
    TP and DP collectives of the first and the last pipeline rank as a
    collapsed simulation does (:class:`sim.commtime.CollectiveTimer`, all
    replicas' groups at once) and add them to the step bounds; other ranks'
    ops count their compute only, which keeps the bound a bound (a shorter op
    never makes a list schedule longer) and the cost independent of ``pp``.
    Caches live on the instance.
    """

    def __init__(self, ctx: SearchContext, profile: DeviceProfile | None = None,
                 comm: bool = True, collapsed_only: bool = False) -> None:
        """``profile``: the device profile of every GPU type (None: each type's default, as
        ``simulate`` times a mixed cluster; reserved memory and fragmentation come from
        rank 0's, as in its stats). ``collapsed_only``: every simulation is collapsed
        (fidelity ``collapsed``), so a layout whose pipeline ranks mix GPU types, which
        ``simulate`` refuses to collapse, is screened out as ``invalid``."""
        self.ctx = ctx
        self.profile = profile or default_profile(ctx.cluster.gpu.name)
        self.comm = comm
        self.collapsed_only = collapsed_only
        types = ctx.cluster.gpu_types
        self._types = types
        """The cluster's GPU types; ranks' types are indices into it (ctx.rank_types)."""
        self._profiles = tuple(profile or default_profile(t.name) for t in types)
        self._type_capacity_gib = tuple(t.hbm_capacity_bytes / GiB for t in types)
        self._uniform = not ctx.cluster.heterogeneous
        self.timer = CollectiveTimer(ctx.cluster)
        self._comm: dict[tuple, float] = {}
        self._opt: dict[tuple, float] = {}
        self._loose: dict[tuple, tuple[list[float], list[float]]] = {}
        self._groups: dict[tuple[str, int, int, int, int], tuple[tuple[int, ...], ...]] = {}
        self._plans: OrderedDict[tuple[str, int, int, int], _Plan | str] = OrderedDict()
        self._plan_ops = 0
        """Ops of the plans kept (:data:`PLAN_CACHE_OPS`)."""
        self._op_cache: dict[tuple, tuple[float, tuple[tuple[str, float], ...]]] = {}
        self._static: dict[tuple, float] = {}
        self._split: frozenset[str] | None = None
        self._capacity_gib = max(self._type_capacity_gib)
        """The largest GPU memory of the cluster (all of them on a uniform cluster)."""
        self._tokens = ctx.global_batch_size * ctx.model.seq_length

    def num_microbatches(self, layout: Layout) -> int:
        return self.ctx.global_batch_size // (layout.micro_batch_size * layout.dp)

    def _fits(self, gib: float, capacity_gib: float | None = None) -> bool:
        """Whether ``gib`` fits ``capacity_gib`` (default: the largest GPU's memory)."""
        cap = self._capacity_gib if capacity_gib is None else capacity_gib
        return gib <= cap * (1 + OOM_SLACK)

    def rank_types(self, layout: Layout) -> tuple[tuple[int, ...], ...]:
        """Per pipeline rank, the GPU types of its GPUs (indices into the cluster's types)."""
        return self.ctx.rank_types(layout.tp, layout.cp, layout.dp, layout.pp)

    def mixed(self, layout: Layout) -> bool:
        """Whether some pipeline rank of ``layout`` mixes GPU types."""
        return not self._uniform and any(len(t) > 1 for t in self.rank_types(layout))

    def _gib(self, allocated_bytes: float) -> float:
        """GiB of an estimate from :meth:`memory_bound_bytes` or the quick bound: the
        allocator's bytes (fragmentation already on the dynamic part) plus reserved."""
        return (allocated_bytes + self.profile.reserved_bytes) / GiB

    def _allocated(self, static_bytes: float, dynamic_bytes: float) -> float:
        """Bytes the caching allocator holds: the static state as is, the dynamic memory
        (activations, working buffers) with the fragmentation overhead (as
        :func:`sim.stats.compute_stats` counts it)."""
        return static_bytes + dynamic_bytes * (1 + self.profile.fragmentation)

    # --------------------------------------------------------------- schedules
    def plan(self, layout: Layout) -> _Plan | str:
        """The built schedule of ``layout``, or why the builder refuses it (LRU-cached)."""
        key = (layout.schedule, layout.pp, self.num_microbatches(layout), layout.vpp)
        plan = self._plans.get(key)
        if plan is None:
            try:
                plan = _build_plan(*key, self.ctx.costs.w_retained_fraction,
                                   self.ctx.config.training.seq_chunks)
            except ScheduleError as exc:
                plan = f"schedule={layout.schedule!r}: {exc}"
            self._plans[key] = plan
            self._plan_ops += _plan_size(plan)
            while self._plan_ops > PLAN_CACHE_OPS and len(self._plans) > 1:
                self._plan_ops -= _plan_size(self._plans.popitem(last=False)[1])
        else:
            self._plans.move_to_end(key)
        return plan

    def _stage_rank(self, name: str, p: int, v: int) -> tuple[int, ...] | None:
        """Which rank holds each stage (it does not depend on m): from a small build."""
        sched = self.ctx.stage_schedule(name, p, v)  # cached there
        return None if sched is None else sched.stage_rank

    # --------------------------------------------------------------- memory
    def quick_memory_bound_gib(self, costs: TransformerCosts, pp: int) -> float:
        """Schedule-free bound: the average static state per rank plus one micro-batch of the
        lightest stage (some rank holds at least the average, every rank at least one).
        :meth:`screen` holds it against the largest GPU memory of the cluster (on a mixed
        cluster the fullest rank may sit on its biggest GPUs); :meth:`judge` checks every
        rank against its own GPUs."""
        stages = tuple(range(len(costs.stage_layers)))
        key = ("static", *_state_shape(costs))
        static = self._static.get(key)
        if static is None:
            static = self._static[key] = costs.static_bytes(stages)
        key = ("act", *_op_shape(costs), costs.stage_layers)
        act = self._static.get(key)
        if act is None:
            act = self._static[key] = min(costs.activation_bytes_per_mb(s) for s in stages)
        return self._gib(self._allocated(static / pp, act))

    def memory_bound_bytes(self, costs: TransformerCosts, plan: _Plan) -> list[float]:
        """Lower bound of each pipeline rank's peak memory, bytes, with the allocator's
        fragmentation on the dynamic part (:meth:`_allocated`), before reserved memory.

        The static state of the rank's stages (:meth:`TransformerCosts.static_bytes`)
        plus, at the start of each op in the rank's program order (:func:`_in_flight`),
        the stashed activations (``activation_bytes_per_mb`` of each stage times its
        in-flight count) and the op's working memory (``transient_bytes``, if the
        cost model has it); the largest of these. The engine allocates exactly this
        way (ops on a rank run one at a time in program order), so the bound is
        tight for the current memory model and stays a bound if the engine tracks
        more.
        """
        transient = getattr(costs, "transient_bytes", None)
        out = []
        for stages, rows in zip(plan.rank_stages, plan.in_flight, strict=True):
            key = ("rank static", *_state_shape(costs), stages)
            static = self._static.get(key)
            if static is None:
                static = self._static[key] = costs.static_bytes(stages)
            if plan.exact:
                act = np.array([costs.activation_bytes_per_mb(s) for s in stages])
                slots = rows[:, -1].astype(int)
                extra = np.zeros(len(rows))
                if transient is not None:
                    per_slot = {k: transient(Op(k // 3, _KINDS[k % 3], 0))
                                for k in np.unique(slots).tolist()}
                    extra = np.array([per_slot[k] for k in slots.tolist()])
                dynamic = float((rows[:, :-1] @ act + extra).max())
                out.append(self._allocated(static, dynamic))
            else:
                out.append(static)
        return out

    # --------------------------------------------------------------- time
    def _op_time(self, costs: TransformerCosts, stage: int, kind: str, split: bool,
                 types: tuple[int, ...] = (0,)) -> tuple[float, tuple[tuple[str, float], ...]]:
        """(compute seconds, ((TP collective, bytes), ...)) of one op of ``stage``.

        Compute is timed by the device model as ``simulate`` times it, on the fastest of
        the GPU types ``types`` (those of the rank that runs the op: each of its GPUs
        takes at least that long). The
        collectives are those between the op's first and last compute segment:
        a collapsed simulation folds them into the op as blocking communication
        (:func:`workloads.lowering._fold`); the leading and trailing ones run on
        their own stream and are left out (a bound may only leave work out).
        """
        last = stage == len(costs.stage_layers) - 1
        key = (*_work_shape(costs), costs.stage_layers[stage], last, kind, split, types)
        hit = self._op_cache.get(key)
        if hit is not None:
            return hit
        kernel = costs.attention
        segs = costs.op_segments(Op(stage, kind, 0), split)
        at = [i for i, seg in enumerate(segs) if isinstance(seg, ComputeSeg)]
        work: list[tuple[ComputeSeg, int]] = []
        comms = []
        for i, seg in enumerate(segs):
            if isinstance(seg, ComputeSeg):
                work.append((seg, 1))
            elif isinstance(seg, RingAttention):  # its blocks' compute; the passes may hide
                work.append((seg.block, seg.steps))
            elif isinstance(seg, CommSeg) and seg.group == "tp" and at and at[0] < i < at[-1]:
                comms.append((seg.op, seg.nbytes))
            # other collectives (EP all-to-all) and ZeRO-3 markers: left out

        def seconds(seg: ComputeSeg, t: int) -> float:
            return seg.duration_s if seg.duration_s is not None else compute_time_s(
                self._types[t], self._profiles[t], seg.flops, seg.hbm_bytes, seg.attn_flops,
                seg.elementwise_bytes, kernel, seg.gemm_dims)

        compute = min(sum(k * seconds(seg, t) for seg, k in work) for t in types)
        out = self._op_cache[key] = (compute, tuple(comms))
        return out

    def _placement(self, layout: Layout) -> Placement:
        return Placement.from_order(self.ctx.config.parallel.placement, tp=layout.tp,
                                    cp=layout.cp, dp=layout.dp, pp=layout.pp)

    def _dp_timed(self, layout: Layout) -> bool:
        """Whether the bounds time the DP collectives: the plain end-of-step gradient
        collective (and ZeRO-1/2's parameter all-gather) of the collapsed lowering. Not
        with ZeRO-3, overlapped gradient buckets, CP or EP, whose gradient traffic is
        split up or goes over other groups (left out: a bound may only leave work out)."""
        return (layout.dp > 1 and layout.zero_stage < 3 and layout.cp == 1 and layout.ep == 1
                and not self.ctx.config.parallel.overlap_grad_reduce)

    def _comm_ranks(self, layout: Layout) -> frozenset[int]:
        """Pipeline ranks whose collectives the bounds time (all others: compute only). None
        (an empty set) where a pipeline rank mixes GPU types: ``simulate`` runs such a
        layout in full fidelity, which the collapsed collective times do not bound."""
        return frozenset({0, layout.pp - 1}) if self.comm and not self.mixed(layout) \
            else frozenset()

    def _group_set(self, dim: str, layout: Layout, r: int) -> tuple[tuple[int, ...], ...]:
        """Every replica's ``dim`` group of pipeline rank ``r``, as the collapsed lowering
        passes them to the timer (TP: one group per DP replica; DP: one per TP lane)."""
        key = (dim, layout.tp, layout.dp, layout.pp, r)
        groups = self._groups.get(key)
        if groups is None:
            pl = self._placement(layout)
            if dim == "tp":
                groups = tuple(pl.group("tp", pl.gpu(pp=r, dp=e)) for e in range(layout.dp))
            else:
                groups = tuple(tuple(pl.gpu(tp=u, dp=e, pp=r) for e in range(layout.dp))
                               for u in range(layout.tp))
            self._groups[key] = groups
        return groups

    def _collective_s(self, dim: str, layout: Layout, r: int, op: str, nbytes: float,
                      one: bool = False) -> float:
        """``op`` on every replica's ``dim`` group of pipeline rank ``r`` (the timer's time,
        cached under a small key: the timer's own key holds every GPU of the groups).

        ``one``: on the first replica's group alone, a lower bound of that (the other
        replicas' flows can only compete with its flows) and 30-300 times cheaper to time
        for 1,024 GPUs; equal to it when the groups share no link (e.g. TP inside servers).
        """
        key = (dim, layout.tp, layout.dp, layout.pp, r, op, nbytes, one)
        t = self._comm.get(key)
        if t is None:
            groups = self._group_set(dim, layout, r)
            t = self._comm[key] = self.timer(op, groups[:1] if one else groups, nbytes)
        return t

    def _tp_comm_s(self, costs: TransformerCosts, stage: int, kind: str, split: bool,
                   layout: Layout, r: int, one: bool = False) -> float:
        """The TP collectives a collapsed simulation folds into one op of ``stage`` on rank r
        (``one``: see :meth:`_collective_s`)."""
        key = ("op", *_work_shape(costs), costs.stage_layers[stage],
               stage == len(costs.stage_layers) - 1, kind, split, layout.dp, layout.pp, r, one)
        t = self._comm.get(key)
        if t is None:
            comms = self._op_time(costs, stage, kind, split)[1]
            t = self._comm[key] = sum(self._collective_s("tp", layout, r, op, nbytes, one)
                                      for op, nbytes in comms)
        return t

    def _table(self, layout: Layout, costs: TransformerCosts, plan: _Plan) -> list[float]:
        """Seconds of one op per ``3·stage + kind`` slot: compute, plus the TP collectives a
        collapsed simulation folds into the op on the ranks of :meth:`_comm_ranks`."""
        kinds = _KINDS if plan.split_backward else _KINDS[:2]
        timed = self._comm_ranks(layout) if layout.tp > 1 else frozenset()
        types = self.rank_types(layout)
        table = [0.0] * (3 * len(plan.stage_rank))
        for s, r in enumerate(plan.stage_rank):
            for kind in kinds:
                compute = self._op_time(costs, s, kind, plan.split_backward, types[r])[0]
                if r in timed:
                    compute += self._tp_comm_s(costs, s, kind, plan.split_backward, layout, r)
                table[3 * s + _SLOT[kind]] = compute
        return table

    def _optimizer_s(self, costs: TransformerCosts, stages: tuple[int, ...],
                     types: tuple[int, ...] = (0,)) -> float:
        """The optimizer step of a rank holding ``stages``, on the fastest of its ``types``."""
        key = (*_state_shape(costs), stages, types)
        t = self._opt.get(key)
        if t is None:
            seg = costs.optimizer_segment(stages)
            t = 0.0 if seg is None else min(compute_time_s(
                self._types[i], self._profiles[i], seg.flops, seg.hbm_bytes, seg.attn_flops,
                seg.elementwise_bytes, costs.attention, seg.gemm_dims) for i in types)
            self._opt[key] = t
        return t

    def step_bound_s(self, layout: Layout, costs: TransformerCosts, plan: _Plan) -> float:
        """Lower bound of the simulated step time of ``layout``, seconds.

        A list schedule of the plan (:func:`_list_run`): every op takes its
        compute time (plus, with ``comm``, its TP collectives), starts as soon
        as its rank is free and its producers are done, and messages between
        stages take no time. The engine runs the same ops in the same program
        order under the same dependencies, with messages and contention that
        only delay them, so each op ends no earlier there. Each rank then runs
        its optimizer step; with ``comm`` and ``dp > 1`` the optimizer also
        waits for the DP gradient collective of the rank's last stage, and
        ZeRO's parameter all-gather follows it. The step is at least the
        latest of these over ranks.

        Schedules whose consecutive steps overlap (:data:`OVERLAPPING_STEPS`: the step
        time is the period of back-to-back steps): every rank still runs its whole
        step's work once per period, so the bound is the busiest rank's ops
        (as timed above) plus its optimizer step.
        """
        if not plan.exact:
            return 0.0
        table = self._table(layout, costs, plan)
        types = self.rank_types(layout)
        if layout.schedule in OVERLAPPING_STEPS:
            busy = [self._optimizer_s(costs, stages, types[r])
                    for r, stages in enumerate(plan.rank_stages)]
            for i, r in enumerate(plan.op_rank):
                busy[r] += table[plan.op_slot[i]]
            return max(busy)
        end = _list_run(plan, table)
        timed = self._comm_ranks(layout) if self._dp_timed(layout) else frozenset()
        bound = 0.0
        for r, stages in enumerate(plan.rank_stages):
            last = end[plan.last_op[r]] if plan.last_op[r] >= 0 else 0.0
            opt = self._optimizer_s(costs, stages, types[r])
            rank_end = last + opt
            if r in timed and plan.final_op[r] >= 0:
                rs, ag = self._dp_collectives_s(layout, costs, r, plan)
                rank_end = max(last, end[plan.final_op[r]] + rs) + opt + ag
            bound = max(bound, rank_end)
        return bound

    def _dp_collectives_s(self, layout: Layout, costs: TransformerCosts, r: int, plan: _Plan
                          ) -> tuple[float, float]:
        """(The gradient collective of rank r's last stage, ZeRO's parameter all-gather),
        seconds, as the collapsed lowering times them."""
        final_stage = plan.op_slot[plan.final_op[r]] // 3
        nbytes = costs.grad_bytes(final_stage)
        grad_op = "reduce_scatter" if layout.zero_stage >= 1 else "all_reduce"
        rs = self._collective_s("dp", layout, r, grad_op, nbytes) if nbytes > 0 else 0.0
        ag = 0.0
        if layout.zero_stage >= 1:
            ag = self._collective_s("dp", layout, r, "all_gather",
                                    sum(costs.grad_bytes(s) for s in plan.rank_stages[r]))
        return rs, ag

    def loose_step_bound_s(self, layout: Layout, costs: TransformerCosts) -> float:
        """Schedule-free lower bound of the step time, seconds.

        On the first and the last pipeline rank (a bound on any rank bounds the
        step): the forwards of the stages before the rank's first stage run
        before it can start, then its ``m`` micro-batches of ops on its stages
        (with ``comm``, plus their TP collectives, timed on one replica's group:
        :meth:`_collective_s` with ``one``), its optimizer step and, with
        ``comm`` and ZeRO, its parameter all-gather. Schedules with overlapping steps:
        the rank's work alone (a period has no fill, see :meth:`step_bound_s`).
        """
        m = self.num_microbatches(layout)
        split = layout.schedule in self._split_schedules()
        stage_rank = self._stage_rank(layout.schedule, layout.pp, layout.vpp)
        types = self.rank_types(layout)
        stage_types = None
        if not self._uniform:  # each stage on its rank's GPUs (unknown rank: any type)
            every = tuple(range(len(self._types)))
            stage_types = (tuple(types[r] for r in stage_rank) if stage_rank is not None
                           else (every,) * len(costs.stage_layers))
        forward_chain, per_mb = self._stage_times(costs, split, stage_types)
        if stage_rank is None:
            return m * sum(per_mb) / layout.pp
        timed = self._comm_ranks(layout)
        bound = 0.0
        for r in sorted({0, layout.pp - 1}):
            mine = tuple(s for s, owner in enumerate(stage_rank) if owner == r)
            busy = sum(per_mb[s] for s in mine)
            if r in timed and layout.tp > 1:
                kinds = _KINDS if split else _KINDS[:2]
                busy += sum(self._tp_comm_s(costs, s, k, split, layout, r, one=True)
                            for s in mine for k in kinds)
            end = m * busy + self._optimizer_s(costs, mine, types[r])
            if layout.schedule in OVERLAPPING_STEPS:  # a period: no fill, see step_bound_s
                bound = max(bound, end)
                continue
            end += forward_chain[mine[0]]
            if r in timed and layout.zero_stage >= 1 and self._dp_timed(layout):
                end += self._collective_s("dp", layout, r, "all_gather",
                                          sum(costs.grad_bytes(s) for s in mine))
            bound = max(bound, end)
        return bound

    def _stage_times(self, costs: TransformerCosts, split: bool,
                     stage_types: tuple[tuple[int, ...], ...] | None = None
                     ) -> tuple[list[float], list[float]]:
        """(compute of the forwards before each stage, compute of one micro-batch per stage),
        each stage on the fastest of its ``stage_types`` (None: the uniform cluster's GPU)."""
        key = (*_work_shape(costs), costs.stage_layers, split, stage_types)
        hit = self._loose.get(key)
        if hit is None:
            kinds = _KINDS if split else _KINDS[:2]
            stages = range(len(costs.stage_layers))
            of = stage_types or ((0,),) * len(costs.stage_layers)
            per_mb = [sum(self._op_time(costs, s, k, split, of[s])[0] for k in kinds)
                      for s in stages]
            chain = [0.0]
            for s in stages:
                chain.append(chain[-1] + self._op_time(costs, s, FORWARD, split, of[s])[0])
            hit = self._loose[key] = (chain, per_mb)
        return hit

    def _split_schedules(self) -> frozenset[str]:
        """Schedules that split the backward into B and W (their W is timed apart)."""
        if self._split is None:
            split = set()
            for name, vpps in self.ctx.schedule_vpps.items():
                try:
                    if _build_plan(name, 2, 4, (vpps or (2,))[0], 0.5, 1).split_backward:
                        split.add(name)
                except (ScheduleError, ValueError):
                    continue
            self._split = frozenset(split)
        return self._split

    # --------------------------------------------------------------- verdicts
    def screen(self, layout: Layout) -> Candidate:
        """Cheap check: the schedule-free memory bound and a loose throughput bound."""
        if self.collapsed_only and self.mixed(layout):
            mixed = [r for r, t in enumerate(self.rank_types(layout)) if len(t) > 1]
            return Candidate(layout, "invalid", reason=(
                f"fidelity 'collapsed': pipeline ranks {mixed} mix GPU types (one GPU "
                "cannot stand for its rank); search with --fidelity auto or full"))
        costs = self.ctx.costs_for(layout, layout.pp * layout.vpp)
        quick = self.quick_memory_bound_gib(costs, layout.pp)
        if not self._fits(quick):
            return Candidate(layout, "memory", memory_bound_gib=quick)
        step = self.loose_step_bound_s(layout, costs)
        return Candidate(layout, "ok", memory_bound_gib=quick,
                         tokens_bound=self._tokens / step if step > 0 else math.inf)

    def judge(self, candidate: Candidate, threshold: float = 0.0) -> Candidate:
        """Full check before simulating: the schedule is built and walked for the exact memory
        bound, then the list-schedule step bound gives ``tokens_bound``; a layout that cannot
        reach ``threshold`` (tokens/s, if > 0) comes back ``pruned``. Apart from that last
        comparison the verdict does not depend on ``threshold``, so a sweep may judge
        layouts before it knows their threshold."""
        layout = candidate.layout
        plan = self.plan(layout)
        if isinstance(plan, str):
            return replace(candidate, status="invalid", reason=plan)
        costs = self.ctx.costs_for(layout, layout.pp * layout.vpp)
        per_rank = [self._gib(b) for b in self.memory_bound_bytes(costs, plan)]
        gib = max(per_rank)
        if self._uniform:
            fits = self._fits(gib)
        else:  # every GPU within its own memory: each rank's smallest
            fits = all(self._fits(g, min(self._type_capacity_gib[t] for t in types))
                       for g, types in zip(per_rank, self.rank_types(layout), strict=True))
        if not fits:
            return replace(candidate, status="memory", memory_bound_gib=gib)
        step = self.step_bound_s(layout, costs, plan)
        tokens = self._tokens / step if step > 0 else math.inf
        # the list-schedule bound and the loose one bound the same step: keep the tighter
        tokens = min(tokens, candidate.tokens_bound or math.inf)
        candidate = replace(candidate, memory_bound_gib=gib, tokens_bound=tokens)
        if threshold > 0 and tokens < threshold:
            return replace(candidate, status="pruned")
        return candidate


# ----------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class Evaluation:
    """The outcome of simulating one layout (what workers return and the store keeps)."""

    key: str
    status: str
    """``ok`` (fits), ``oom`` (simulated, does not fit), ``invalid`` (the experiment refused
    the layout) or ``error`` (the simulation raised)."""
    stats: dict[str, Any] | None = None
    """The ``sim run --json`` object, for ``ok`` and ``oom``."""
    error: str = ""
    elapsed_s: float = 0.0
    """Wall time of the evaluation (not part of the result's identity)."""

    def same_result(self, other: Evaluation) -> bool:
        return (self.key, self.status, self.stats, self.error) == (
            other.key, other.status, other.stats, other.error)


class Evaluator:
    """Simulates layouts of one experiment: the callable a worker builds once.

    Builds the cluster once and shares it between the layouts' experiments, so
    its route cache is reused (it depends only on the cluster description).
    """

    def __init__(self, data: Mapping[str, Any], global_batch_size: int,
                 fidelity: str = "collapsed", profile: DeviceProfile | None = None,
                 base_dir: str | None = None) -> None:
        """``profile``: the device profile (None: ``simulate``'s default for the GPU)."""
        self.data = dict(data)
        self.global_batch_size = global_batch_size
        self.fidelity = fidelity
        self.profile = profile
        self.base_dir = Path(base_dir) if base_dir else None
        self.cluster = build_cluster(parse_config(self.data).cluster)
        self._stand_in = {"preset": "ideal", "num_gpus": self.cluster.num_gpus}
        self._timer = CollectiveTimer(self.cluster)
        """Collective timings on the shared cluster, reused by every layout's simulation."""

    def experiment(self, layout: Layout) -> Any:
        """The experiment of ``layout`` on the shared cluster.

        :func:`sim.experiment.build_experiment` would build the cluster graph again
        for every layout (0.07 s for 1,024 GPUs); what it derives from the cluster is
        only its size, so the layout is built on an ideal stand-in of the same size
        and the real cluster (built once, with its route cache) is put in its place,
        with the real configuration. A ``balanced`` layer split depends on the cluster's
        GPUs and links: it is computed on the real cluster
        (:func:`sim.experiment.balanced_layers`).
        """
        data = self.data
        for key, value in layout.changes(self.global_batch_size).items():
            data = set_dotted(data, key, value)
        config = parse_config(data)
        balanced = config.parallel.layers_per_stage == "balanced"
        stand_in = {**data, "cluster": self._stand_in}
        if balanced:  # the split is the real cluster's (its GPU types and TP links)
            stand_in = set_dotted(stand_in, "parallel.layers_per_stage", None)
        exp = build_experiment(stand_in, self.base_dir)
        exp = replace(exp, config=config, data=dict(data), cluster=self.cluster)
        if balanced and isinstance(exp.costs, TransformerCosts):
            exp = replace(exp, costs=replace(exp.costs, stage_layers=balanced_layers(
                exp.costs, exp.schedule, exp.placement, self.cluster)))
        return exp

    def __call__(self, layout: Layout) -> Evaluation:
        """Simulate ``layout``; never raises: refusals and failures come back as results."""
        start = time.perf_counter()
        try:
            stats = simulate(self.experiment(layout), self.profile, fidelity=self.fidelity,
                             collective_timer=self._timer).stats
        except ConfigError as exc:
            return Evaluation(layout.key, "invalid", error=str(exc),
                              elapsed_s=time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001 - a failing layout must not stop the sweep
            kind = "" if isinstance(exc, SimError) else f"{type(exc).__name__}: "
            return Evaluation(layout.key, "error", error=f"{kind}{exc}",
                              elapsed_s=time.perf_counter() - start)
        return Evaluation(layout.key, "oom" if stats["oom"] else "ok", stats,
                          elapsed_s=time.perf_counter() - start)


# ----------------------------------------------------------------------------- workers


@dataclass(frozen=True)
class ScreenChunk:
    """Work item: screen these layouts (:meth:`Screener.screen`).

    Layouts travel as tuples of their :data:`DIMS` values (a pickled :class:`Layout`
    is six times larger), and the verdicts come back as ``(status, reason,
    memory_bound_gib, tokens_bound)`` tuples (:func:`_compact`): the caller has the
    layouts already."""

    layouts: tuple[tuple[Any, ...], ...]


@dataclass(frozen=True)
class JudgeChunk:
    """Work item: judge these candidates (:meth:`Screener.judge`, no threshold)."""

    candidates: tuple[Candidate, ...]
    indices: tuple[int, ...] = ()
    """Where the candidates are in the sweep's order (for the sweep; workers ignore it)."""


@dataclass(frozen=True)
class SimulateOne:
    """Work item: simulate this layout (the evaluator)."""

    layout: Layout


@dataclass(frozen=True)
class WorkerSpec:
    """What a :class:`SearchWorker` needs to rebuild the sweep's context (picklable)."""

    data: dict[str, Any]
    base_dir: str | None
    global_batch_size: int
    fidelity: str
    profile: DeviceProfile | None
    """The device profile (None: each GPU type's default, on a mixed cluster)."""
    comm: bool
    """Time collectives in the step bounds (:class:`Screener`)."""
    unsupported: tuple[tuple[str, str], ...]
    schedule_vpps: tuple[tuple[str, tuple[int, ...]], ...]
    evaluator: Callable[..., Callable[[Layout], Evaluation]] = Evaluator
    """The simulation factory, called as ``evaluator(data, global_batch_size, fidelity,
    profile, base_dir)``."""


class SearchWorker:
    """The callable every worker of a sweep builds once: it screens chunks of layouts, judges
    chunks of candidates and simulates layouts, keeping the screener's caches (collective
    times, op times, schedules) and the evaluator's cluster for the worker's lifetime.

    Its context is rebuilt from the :class:`WorkerSpec` without probing the simulator
    again (the probe results travel in the spec); the screener and the evaluator are
    built on first use. Every answer is a pure function of the item, so it is the same
    in whichever worker computes it.
    """

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self._screener: Screener | None = None
        self._evaluate: Callable[[Layout], Evaluation] | None = None

    @property
    def screener(self) -> Screener:
        if self._screener is None:
            sp = self.spec
            ctx = SearchContext.build(sp.data, sp.base_dir,
                                      probed=(dict(sp.unsupported), dict(sp.schedule_vpps)))
            self._screener = Screener(ctx, sp.profile, comm=sp.comm,
                                      collapsed_only=sp.fidelity == "collapsed")
        return self._screener

    def __call__(self, item: ScreenChunk | JudgeChunk | SimulateOne) -> Any:
        if isinstance(item, ScreenChunk):
            screen = self.screener.screen
            return [_compact(screen(Layout(*values))) for values in item.layouts]
        if isinstance(item, JudgeChunk):
            return [self.screener.judge(c) for c in item.candidates]
        if self._evaluate is None:
            sp = self.spec
            self._evaluate = sp.evaluator(sp.data, sp.global_batch_size, sp.fidelity,
                                          sp.profile, sp.base_dir)
        return self._evaluate(item.layout)


# ----------------------------------------------------------------------------- store


class ResultStore:
    """Simulation results in SQLite, keyed by (experiment fingerprint, layout key).

    Every :meth:`put` is its own transaction, so a sweep killed at any moment
    keeps every result it reported. ``path=None`` (or ``":memory:"``) keeps the
    results in memory.
    """

    SCHEMA = """
        CREATE TABLE IF NOT EXISTS results (
            experiment TEXT NOT NULL,
            layout TEXT NOT NULL,
            status TEXT NOT NULL,
            stats TEXT,
            error TEXT NOT NULL DEFAULT '',
            elapsed_s REAL NOT NULL DEFAULT 0,
            PRIMARY KEY (experiment, layout)
        )"""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = ":memory:" if path in (None, ":memory:") else str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = sqlite3.connect(self.path, timeout=30.0)
            if self.path != ":memory:":
                self._conn.execute("PRAGMA journal_mode=WAL")
                self._conn.execute("PRAGMA synchronous=NORMAL")
            with self._conn:
                self._conn.execute(self.SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"--db {self.path!r}: not a usable SQLite database: {exc}"
                              ) from None

    def load(self, experiment: str) -> dict[str, Evaluation]:
        """Every stored result of ``experiment``, by layout key."""
        rows = self._conn.execute(
            "SELECT layout, status, stats, error, elapsed_s FROM results WHERE experiment = ?",
            (experiment,))
        return {key: Evaluation(key, status, json.loads(stats) if stats else None, error, elapsed)
                for key, status, stats, error, elapsed in rows}

    def put(self, experiment: str, ev: Evaluation) -> None:
        """Store one result in its own transaction (replacing an older one)."""
        with self._conn:
            self._conn.execute(
                "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?)",
                (experiment, ev.key, ev.status,
                 None if ev.stats is None else json.dumps(ev.stats, sort_keys=True),
                 ev.error, ev.elapsed_s))

    def count(self, experiment: str | None = None) -> int:
        if experiment is None:
            return self._conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        return self._conn.execute("SELECT COUNT(*) FROM results WHERE experiment = ?",
                                  (experiment,)).fetchone()[0]

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------------- the sweep


@dataclass(frozen=True)
class Row:
    """One layout of a finished search: how it was judged and, if simulated, its figures."""

    layout: Layout
    status: str
    """``ok``, ``oom``, ``error``, ``invalid`` (refused when built), ``memory`` (rejected by
    the memory bound) or ``pruned`` (its throughput bound is below the K-th best)."""
    stats: dict[str, Any] | None = None
    error: str = ""
    memory_bound_gib: float | None = None
    tokens_bound: float | None = None
    rank: int | None = None
    """1 = best feasible layout; None for layouts that are not feasible."""
    elapsed_s: float = 0.0
    """Wall time of its simulation (0 if not simulated by this run or the stored one)."""

    def figure(self, key: str) -> Any:
        return None if self.stats is None else self.stats.get(key)

    def as_dict(self) -> dict[str, Any]:
        """Flat mapping for the CSV and the plot."""
        out: dict[str, Any] = {"rank": self.rank, "status": self.status, "key": self.layout.key}
        out.update({d: getattr(self.layout, d) for d in DIMS})
        for k in CSV_FIGURES:
            out[k] = self.figure(k)
        out["memory_bound_gib"] = self.memory_bound_gib
        out["tokens_per_s_bound"] = self.tokens_bound
        out["error"] = self.error
        return out


CSV_FIGURES = ("step_time_s", "tokens_per_s", "mfu", "tflops_per_gpu", "peak_memory_gib",
               "memory_capacity_gib", "bubble_fraction", "num_microbatches")
"""Figures of ``sim run --json`` copied into the CSV and the ``top`` list."""


@dataclass
class SearchResult:
    """Everything a search found: rows (ranked feasible first) and counts."""

    experiment: str
    num_gpus: int
    global_batch_size: int
    rows: list[Row]
    elapsed_s: float
    enumerated: int
    """Layouts that divide correctly (before screening)."""
    unsupported: dict[str, str]
    pins: dict[str, tuple[Any, ...]]
    resumed: int = 0
    """Results taken from the store instead of simulated."""
    simulated: int = 0
    """Layouts simulated by this run."""
    counts: dict[str, int] = field(default_factory=dict)
    """Rows per status."""
    screen_s: float = 0.0
    """Wall time of building the context, enumerating and screening (on the executor)."""
    speculated: int = 0
    """Simulations started ahead of the serial order by an idle worker."""
    discarded: int = 0
    """Of those, results the serial order did not want (wasted work, never stored)."""
    wasted_judged: int = 0
    """Candidates judged ahead of the frontier past the point where the sweep stopped."""

    @property
    def feasible(self) -> list[Row]:
        return [r for r in self.rows if r.rank is not None]

    @property
    def best(self) -> Row | None:
        feasible = self.feasible
        return feasible[0] if feasible else None

    @property
    def evaluated(self) -> int:
        """Valid layouts judged: by the memory bound, the throughput bound or a simulation."""
        return sum(n for s, n in self.counts.items() if s != "invalid")

    def top(self, k: int) -> list[Row]:
        return self.feasible[:k]

    def summary(self, top: int = 10) -> dict[str, Any]:
        """The ``sim search --json`` object."""
        best = self.best
        return {
            "experiment": self.experiment,
            "num_gpus": self.num_gpus,
            "global_batch_size": self.global_batch_size,
            "enumerated": self.enumerated,
            "evaluated": self.evaluated,
            "simulated": self.simulated,
            "resumed": self.resumed,
            "feasible": len(self.feasible),
            "counts": dict(sorted(self.counts.items())),
            "elapsed_s": self.elapsed_s,
            "screen_s": self.screen_s,
            "speculated": self.speculated,
            "discarded": self.discarded,
            "layouts_per_s": self.evaluated / self.elapsed_s if self.elapsed_s > 0 else None,
            "pins": {CONFIG_KEYS[d]: list(v) for d, v in sorted(self.pins.items())},
            "unsupported": dict(sorted(self.unsupported.items())),
            "best": None if best is None else _best_json(best),
            "top": [{"rank": r.rank, "key": r.layout.key, **{k: r.figure(k) for k in CSV_FIGURES}}
                    for r in self.top(top)],
        }


def _best_json(row: Row) -> dict[str, Any]:
    return {"key": row.layout.key, **row.layout.settings(), "stats": row.stats}


def rows_csv(rows: Sequence[Row]) -> str:
    """All rows as CSV text (header first; empty cells for missing figures)."""
    buf = io.StringIO()
    header = ["rank", "status", "key", *DIMS, *CSV_FIGURES, "memory_bound_gib",
              "tokens_per_s_bound", "error"]
    writer = csv.DictWriter(buf, header, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        d = row.as_dict()
        writer.writerow({k: "" if d[k] is None else (_text(d[k]) if isinstance(d[k], bool)
                                                      else d[k]) for k in header})
    return buf.getvalue()


def _rank_rows(rows: list[Row]) -> list[Row]:
    """Feasible rows by throughput (then less memory, then key), numbered; the rest after."""
    def throughput(r: Row) -> float:
        return r.figure("tokens_per_s") or 0.0

    feasible = sorted((r for r in rows if r.status == "ok"),
                      key=lambda r: (-throughput(r), r.figure("peak_memory_gib"), r.layout.key))
    order = {"oom": 0, "error": 1, "pruned": 2, "memory": 3, "invalid": 4}
    rest = sorted((r for r in rows if r.status != "ok"),
                  key=lambda r: (order.get(r.status, 9), r.layout.key))
    return [replace(r, rank=i + 1) for i, r in enumerate(feasible)] + rest


Progress = Callable[[int, int], None]
"""``progress(done, total)``: layouts judged so far out of those that passed screening."""


def _kth_best(results: Iterable[Evaluation], k: int) -> float:
    tokens = sorted((ev.stats["tokens_per_s"] or 0.0 for ev in results
                     if ev.status == "ok" and ev.stats), reverse=True)
    return tokens[k - 1] if len(tokens) >= k else 0.0


def search(
    data: Mapping[str, Any],
    *,
    base_dir: str | Path | None = None,
    gpus: int | None = None,
    pins: Pins | None = None,
    top: int = 10,
    fidelity: str = "collapsed",
    profile: DeviceProfile | None = None,
    executor: Executor | None = None,
    store: ResultStore | None = None,
    prune: bool = True,
    round_size: int = 16,
    progress: Progress | None = None,
    evaluator: Callable[..., Callable[[Layout], Evaluation]] = Evaluator,
) -> SearchResult:
    """Search the layouts of the experiment mapping ``data`` (see the module docstring).

    ``top``: K, the number of best layouts that pruning keeps exact (the
    K best feasible layouts are always simulated). ``prune=False`` simulates
    every layout that passes the memory bound. ``executor`` defaults to this
    process; ``store`` to an in-memory database. ``evaluator`` is the worker
    factory, called as ``evaluator(data, global_batch_size, fidelity, profile,
    base_dir)`` (a hook for tests).
    """
    start = time.perf_counter()
    if top < 1:
        raise ConfigError(f"--top={top}: must be at least 1")
    if fidelity not in FIDELITIES:
        raise ConfigError(f"--fidelity={fidelity!r}: choose one of {', '.join(FIDELITIES)}")
    if round_size < 1:
        raise ConfigError(f"round_size={round_size}: must be at least 1")
    pins = dict(pins or {})
    ctx = SearchContext.build(data, base_dir, gpus)
    given = profile
    profile = profile or default_profile(ctx.cluster.gpu.name)
    # a mixed cluster without a given profile: every GPU type with its own, as sim run
    workers_profile = given if ctx.cluster.heterogeneous else profile
    collapsed = fidelity == "collapsed" or (
        fidelity == "auto" and ctx.cluster.num_gpus > AUTO_FULL_MAX_GPUS)
    layouts = list(enumerate_layouts(ctx, pins))
    if not layouts:
        pinned = ", ".join(f"{CONFIG_KEYS[d]}={'|'.join(map(_text, v))}" for d, v in pins.items())
        raise ConfigError(f"no layout of {ctx.cluster.num_gpus} GPUs divides correctly"
                          + (f" with --fix {pinned}" if pinned else "")
                          + f" (global batch {ctx.global_batch_size}, "
                          f"{ctx.model.num_attention_heads} heads, {ctx.model.num_layers} layers)")
    spec = WorkerSpec(ctx.data, str(ctx.base_dir) if ctx.base_dir else None,
                      ctx.global_batch_size, fidelity, workers_profile, collapsed,
                      tuple(sorted(ctx.unsupported.items())),
                      tuple(sorted(ctx.schedule_vpps.items())), evaluator)
    task = Task(SearchWorker, (spec,))
    executor = executor or InlineExecutor()
    local = _LocalFallback(spec)
    candidates = _screen_all(layouts, executor, task, local)
    todo = sorted((c for c in candidates if c.status == "ok"),
                  key=lambda c: (-(c.tokens_bound or 0.0), c.layout.key))
    screen_s = time.perf_counter() - start
    fingerprint = ctx.fingerprint(fidelity, profile)
    own_store = store is None
    store = store or ResultStore()
    done = store.load(fingerprint)
    resumed = sum(1 for c in todo if c.layout.key in done)
    sweep = _Sweep(todo, done, store, fingerprint, top, prune, round_size,
                   progress or (lambda _done, _total: None), local)
    try:
        sweep.run(executor, task)
    finally:
        if own_store:
            store.close()
    rows = _collect_rows(candidates, sweep.results, sweep.judged)
    counts = Counter(r.status for r in rows)
    return SearchResult(ctx.config.name, ctx.cluster.num_gpus, ctx.global_batch_size, rows,
                        time.perf_counter() - start, len(layouts), ctx.unsupported, pins,
                        resumed, sweep.simulated, dict(counts), screen_s,
                        sweep.speculated, sweep.discarded, sweep.wasted_judged)


SCREEN_CHUNKS_PER_WORKER = 8
"""Screening is split into about this many chunks per worker (load balance against cache
reuse: see :func:`_screen_chunks`)."""
SCREEN_CHUNK_MIN = 256
JUDGE_CHUNK = 8
"""Candidates per judging work item."""
LOOKAHEAD = 64
"""How far past the sweep's frontier candidates are judged before any speculation."""
FAR_LOOKAHEAD = 512
"""How far past the frontier idle workers judge, and simulate speculatively."""


class _LocalFallback:
    """A :class:`SearchWorker` in this process, built only if a worker is lost mid-chunk."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self._worker: SearchWorker | None = None

    def __call__(self, item: Any) -> Any:
        if self._worker is None:
            self._worker = SearchWorker(self.spec)
        return self._worker(item)


def _screen_all(layouts: Sequence[Layout], executor: Executor, task: Task,
                local: Callable[[Any], Any]) -> list[Candidate]:
    """Screen every layout, in chunks spread over the executor's workers; the candidates
    come back in the order of ``layouts`` whatever ran them. A chunk whose worker was lost
    is screened here."""
    parts = _screen_chunks(layouts, executor.workers)
    chunks = [ScreenChunk(tuple(tuple(getattr(layouts[i], d) for d in DIMS) for i in part))
              for part in parts]
    verdicts: list[tuple[Any, ...] | None] = [None] * len(layouts)
    # handed out last chunk first: the widest TP groups come last, whose collectives make
    # them the costliest, and a costly chunk should not come last
    last = len(chunks) - 1
    for i, outcome in executor.run(task, chunks[::-1]):
        part = parts[last - i]
        got = outcome if isinstance(outcome, list) else local(chunks[last - i])
        for j, verdict in zip(part, got, strict=True):
            verdicts[j] = verdict
    missing = sum(1 for v in verdicts if v is None)
    if missing:  # the chunks cover every layout: this is a bug, not a user error
        raise SimError(f"screening lost {missing} of {len(layouts)} layouts")
    return [Candidate(lay, *verdict)  # type: ignore[misc]  # none is None: checked above
            for lay, verdict in zip(layouts, verdicts, strict=True)]


def _compact(c: Candidate) -> tuple[Any, ...]:
    """A screening verdict without its layout (what travels back from a worker)."""
    return (c.status, c.reason, c.memory_bound_gib, c.tokens_bound)


def _screen_group(lay: Layout) -> tuple[int, int, int]:
    """Layouts that share most of the screener's cached work: the op times and their TP
    collectives depend on tp, cp and the micro-batch size (and the stage's layer count,
    which many pp·vpp share), not on pp, ZeRO or the schedule."""
    return (lay.tp, lay.cp, lay.micro_batch_size)


def _screen_chunks(layouts: Sequence[Layout], workers: int) -> list[list[int]]:
    """Indices into ``layouts`` of the screening chunks (every index in one chunk).

    About :data:`SCREEN_CHUNKS_PER_WORKER` chunks per worker (one for one worker), made of
    whole groups of :func:`_screen_group` (layouts ordered by group, then index): the
    screener's caches are per worker, so a group screened by one worker computes its op
    times and times its collectives once. A group larger than a chunk is split into even
    pieces.
    """
    n = len(layouts)
    if workers <= 1 or n == 0:
        return [list(range(n))] if n else []
    size = max(SCREEN_CHUNK_MIN, -(-n // (SCREEN_CHUNKS_PER_WORKER * workers)))
    order = sorted(range(n), key=lambda i: (_screen_group(layouts[i]), i))
    groups: list[tuple[int, int]] = []  # [start, end) positions in order
    start = 0
    for k in range(1, n + 1):
        if k == n or _screen_group(layouts[order[k]]) != _screen_group(layouts[order[start]]):
            groups.append((start, k))
            start = k
    spans: list[tuple[int, int]] = []
    a = b = 0  # the chunk being filled: [a, b)
    for gs, ge in groups:
        if ge - gs > size:  # a big group: its own even pieces
            if b > a:
                spans.append((a, b))
            pieces = -(-(ge - gs) // size)
            cuts = [gs + (ge - gs) * k // pieces for k in range(pieces + 1)]
            spans += list(zip(cuts, cuts[1:], strict=False))
            a = b = ge
        elif b - a + ge - gs > size:
            spans.append((a, b))
            a, b = gs, ge
        else:
            b = ge
    if b > a:
        spans.append((a, b))
    return [order[a:b] for a, b in spans]


class _Sweep:
    """Judges and simulates the screened candidates ``todo`` (best bound first) in rounds.

    The semantics (what is simulated) are those of a serial sweep: the first round is
    the K best bounds, the next ``round_size`` each; each round is judged against the
    K-th best throughput of the rounds before it (:func:`_kth_best`); stored results are
    reused; a layout that cannot fit or cannot reach the threshold is set aside, the
    others are simulated and stored one by one as they finish; the sweep stops at the
    first layout whose screening bound is below the threshold (the order is by that
    bound). So the set of simulated layouts, not only the top K, is the same whatever
    executor or number of workers runs it.

    What workers do ahead of that serial order, to stay busy: judging (its verdict and
    bound do not depend on the threshold, only the final comparison does) runs up to
    :data:`LOOKAHEAD` candidates past the frontier, in chunks; and a free worker
    simulates, speculatively, the next judged candidate that would be simulated under
    the best threshold known so far (a lower bound of its round's threshold, which
    only grows). A speculative result is kept only if the serial order reaches its
    layout and simulates it; otherwise it is discarded, never stored. One process
    (:class:`~sim.executors.InlineExecutor`) never speculates.
    """

    def __init__(self, todo: list[Candidate], done: Mapping[str, Evaluation],
                 store: ResultStore, fingerprint: str, top: int, prune: bool,
                 round_size: int, report: Progress, local: Callable[[Any], Any]) -> None:
        self.todo, self.done, self.store, self.fingerprint = todo, done, store, fingerprint
        self.top, self.prune, self.report, self.local = top, prune, report, local
        n = len(todo)
        # round i covers todo[bounds[i]:bounds[i + 1]]; the first is the K best bounds
        self.bounds = [0, *range(min(top, n), n, round_size), n]
        self.results: dict[str, Evaluation] = {}
        self.judged: dict[str, Candidate] = {}
        self.verdicts: list[Candidate | None] = [None] * n
        self.spec: dict[int, Evaluation] = {}
        """Speculative results not (yet) wanted, by index into todo."""
        self.sent: set[int] = set()
        """Indices whose simulation was handed to a worker."""
        self.need: list[int] = []
        """Indices the serial order simulates, not yet handed out."""
        self.waiting: set[int] = set()
        """Indices the serial order simulates, result not in yet."""
        self.judge_next = 0
        self.pos = 0
        """The frontier: every index before it is decided."""
        self.round = 0
        self.threshold = 0.0
        self._known, self._known_at = 0.0, 0
        """K-th best of all results so far (a lower bound of every later round's threshold),
        and the number of results it was computed from."""
        self._index = {c.layout.key: i for i, c in enumerate(todo)}
        self.finished = 0
        self.simulated = self.speculated = self.discarded = self.wasted_judged = 0

    # ------------------------------------------------------------- serial order
    def _round_of(self, i: int) -> int:
        r = self.round
        while self.bounds[r + 1] <= i:
            r += 1
        return r

    def advance(self) -> None:
        """Decide candidates in the serial order as far as the outcomes so far allow."""
        self._advance()
        self.report(self.finished, len(self.todo))

    def _advance(self) -> None:
        todo, n = self.todo, len(self.todo)
        while self.pos < n:
            i = self.pos
            r = self._round_of(i)
            if r != self.round:
                if self.waiting:
                    return  # the round's threshold needs the previous rounds' results
                self.round = r
                self.threshold = _kth_best(self.results.values(), self.top) if self.prune \
                    else 0.0
            c = todo[i]
            key = c.layout.key
            if key in self.done:
                self.results[key] = self.done[key]
            elif self.threshold > 0 and (c.tokens_bound or 0.0) < self.threshold:
                self._stop(i)
                return
            elif (v := self.verdicts[i]) is None:
                return
            elif v.status == "ok" and self.threshold > 0 and (v.tokens_bound or 0.0) \
                    < self.threshold:
                self.judged[key] = replace(v, status="pruned")
            elif v.status == "ok":
                self.judged[key] = v
                self.pos += 1
                if i in self.spec:
                    self._keep(i, self.spec.pop(i))
                else:
                    self.waiting.add(i)
                    if i not in self.sent:
                        self.need.append(i)
                continue
            else:
                self.judged[key] = v
            self.finished += 1
            self.pos += 1

    def _stop(self, first: int) -> None:
        """Ordered by the screening bound: no layout from ``first`` on can reach the
        threshold; stored results are still taken."""
        for c in self.todo[first:]:
            if c.layout.key in self.done:
                self.results[c.layout.key] = self.done[c.layout.key]
            else:
                self.judged[c.layout.key] = replace(c, status="pruned")
        self.wasted_judged = sum(1 for v in self.verdicts[first:] if v is not None)
        self.pos = len(self.todo)
        self.finished = len(self.todo)

    def _keep(self, i: int, ev: Evaluation) -> None:
        """A result the serial order wants: store it (its own transaction) and count it."""
        self.store.put(self.fingerprint, ev)
        self.results[ev.key] = ev
        self.waiting.discard(i)
        self.simulated += 1
        self.finished += 1

    # ------------------------------------------------------------- work for workers
    def _floor(self, i: int) -> float:
        """A lower bound of the threshold that ``todo[i]`` will be judged against: its
        round's own if that round is being decided, else the K-th best result so far
        (thresholds only grow as results come in)."""
        if not self.prune:
            return 0.0
        if self.bounds[self.round] <= i < self.bounds[self.round + 1]:
            return self.threshold
        if self._known_at != len(self.results):
            self._known_at = len(self.results)
            self._known = _kth_best(self.results.values(), self.top)
        return max(self.threshold, self._known)

    def feed(self) -> JudgeChunk | SimulateOne | None:
        """The most useful work for a free worker: a simulation the serial order waits
        for, judging up to :data:`LOOKAHEAD` past the frontier, a speculative simulation,
        judging further ahead (up to :data:`FAR_LOOKAHEAD`, so that the judged candidates
        that speculation picks from do not run out while the serial order waits), or
        nothing."""
        todo, n = self.todo, len(self.todo)
        if self.need:
            i = self.need.pop(0)
            self.sent.add(i)
            return SimulateOne(todo[i].layout)
        near = self._judge_chunk(min(n, self.pos + LOOKAHEAD))
        if near is not None:
            return near
        far = min(n, self.pos + FAR_LOOKAHEAD)
        for i in range(self.pos, far):
            v, floor = self.verdicts[i], self._floor(i)
            if (todo[i].tokens_bound or 0.0) < floor:
                break
            if v is None:
                if todo[i].layout.key in self.done:
                    continue  # never judged: its stored result is taken
                break
            if (v.status == "ok" and (v.tokens_bound or 0.0) >= floor and i not in self.sent
                    and todo[i].layout.key not in self.done):
                self.sent.add(i)
                self.speculated += 1
                return SimulateOne(todo[i].layout)
        return self._judge_chunk(far)

    def _judge_chunk(self, end: int) -> JudgeChunk | None:
        """The next up to :data:`JUDGE_CHUNK` candidates not judged yet, before ``end``."""
        todo = self.todo
        self.judge_next = max(self.judge_next, self.pos)
        chunk: list[int] = []
        while self.judge_next < end and len(chunk) < JUDGE_CHUNK:
            j = self.judge_next
            if (todo[j].tokens_bound or 0.0) < self._floor(j):
                break  # at or past the stop: never judged
            if todo[j].layout.key not in self.done:
                chunk.append(j)
            self.judge_next += 1
        return JudgeChunk(tuple(todo[j] for j in chunk), tuple(chunk)) if chunk else None

    def on_outcome(self, item: JudgeChunk | SimulateOne, outcome: Any) -> None:
        """Take a worker's answer (a lost worker's judging is redone here), then advance."""
        if isinstance(item, JudgeChunk):
            verdicts = outcome if isinstance(outcome, list) else self.local(item)
            for i, v in zip(item.indices, verdicts, strict=True):
                self.verdicts[i] = v
        else:
            i = self._index[item.layout.key]
            ev = _as_evaluation(outcome, item.layout)
            if i in self.waiting:
                self._keep(i, ev)
            else:
                self.spec[i] = ev
        self.advance()

    def run(self, executor: Executor, task: Task) -> None:
        """Run the sweep to its end on ``executor`` (``task`` builds a :class:`SearchWorker`)."""
        self.report(0, len(self.todo))
        self.advance()
        for item, outcome in executor.stream(task, self.feed):
            self.on_outcome(item, outcome)
        if self.pos < len(self.todo) or self.waiting:
            raise SimError(f"search stalled at layout {self.pos} of {len(self.todo)}")
        self.discarded = len(self.spec)


def _as_evaluation(outcome: Any, layout: Layout) -> Evaluation:
    if isinstance(outcome, Evaluation):
        return outcome
    message = outcome.message if isinstance(outcome, WorkerFailure) else repr(outcome)
    return Evaluation(layout.key, "error", error=message)


def _collect_rows(candidates: Sequence[Candidate], results: Mapping[str, Evaluation],
                  judged: Mapping[str, Candidate]) -> list[Row]:
    rows = []
    for c in candidates:
        c = judged.get(c.layout.key, c)
        ev = results.get(c.layout.key)
        if ev is not None:
            rows.append(Row(c.layout, ev.status, ev.stats, ev.error, c.memory_bound_gib,
                            c.tokens_bound, elapsed_s=ev.elapsed_s))
        else:
            rows.append(Row(c.layout, c.status, error=c.reason,
                            memory_bound_gib=c.memory_bound_gib, tokens_bound=c.tokens_bound))
    return _rank_rows(rows)
