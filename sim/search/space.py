"""The search space: an experiment's context and the layouts that divide it correctly.

:func:`enumerate_layouts` lists every layout of tp, pp, dp, cp, ep, vpp, micro-batch
size, sequence parallelism, ZeRO stage, recomputation and schedule that divides
correctly (see :mod:`sim.search`); :func:`probe_support` finds once which values the
simulator accepts for the experiment's model; :class:`SearchContext` holds what every
step of a search of one experiment needs.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from base.errors import ConfigError, ScheduleError
from sim.config import ExperimentConfig, parse_config, set_dotted
from sim.device import DeviceProfile
from sim.experiment import (
    balanced_layers,
    build_experiment,
    check_attention_kernel,
    check_precision,
    fp8_speedup,
)
from sim.search.layouts import (
    CONFIG_KEYS,
    RECOMPUTE,
    SHORT_NAMES,
    ZERO_STAGES,
    Layout,
    Pins,
)
from sim.search.layouts import key_text as _key_text
from sim.search.plan import build_schedule
from topologies.build import build_cluster
from topologies.cluster import Cluster
from topologies.config import MAX_GPUS
from topologies.placement import Placement
from workloads.frameworks import FrameworkProfile, apply_framework, framework, stage_layers
from workloads.models import ModelSpec
from workloads.registry import LLM_SCHEDULES, SCHEDULES
from workloads.schedules import Schedule
from workloads.seqchunks import FLASH_KERNELS
from workloads.transformer import TransformerCosts

NEUTRAL_GPUS = 4
_LAYOUT_PARALLEL_KEYS = frozenset({*(k.rpartition(".")[2] for k in CONFIG_KEYS.values()),
                                   "layers_per_stage"})


def _neutral(data: Mapping[str, Any], gpus: int, gbs: int, **settings: Any) -> dict[str, Any]:
    """The experiment on an ideal cluster of ``gpus`` with a small layout: cheap to build."""
    out = {k: v for k, v in data.items() if k not in ("cluster", "parallel", "schedule")}
    out["cluster"] = {"preset": "ideal", "num_gpus": gpus}
    training = {k: v for k, v in (data.get("training") or {}).items()
                if k not in ("micro_batch_size", "num_microbatches", "recompute",
                             "recompute_num_layers", "recompute_every_k_layers")}
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
            if not 1 <= gpus <= MAX_GPUS:
                raise ConfigError(f"--gpus={gpus}: must be between 1 and {MAX_GPUS:,} "
                                  "(topologies.config.MAX_GPUS)")
            data = set_dotted(data, "cluster.num_gpus", gpus)
            data = set_dotted(data, "parallel.dp", None)
        if not isinstance(data.get("model"), Mapping) or "synthetic" in data["model"]:
            raise ConfigError("model: sim search needs a transformer model (preset or explicit "
                              "shape), not a synthetic one")
        cfg = parse_config(data)
        if cfg.parallel.layers_per_stage == "auto":
            raise ConfigError("parallel.layers_per_stage='auto': sim search does not split "
                              "layers by the network and memory yet; use 'balanced', a list "
                              "or no split")
        if cfg.model.encoder is not None:
            raise ConfigError("model.encoder: sim search does not search a multimodal model's "
                              "layouts; compare its schedules with sim compare")
        if cfg.parallel.tp_comm_overlap or cfg.parallel.microbatch_group_size is not None:
            key = ("tp_comm_overlap" if cfg.parallel.tp_comm_overlap
                   else "microbatch_group_size")
            raise ConfigError(f"parallel.{key}: sim search does not search with it yet (its "
                              "screening bounds time TP collectives as blocking and every "
                              "layout its own micro-batch groups); leave it out")
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
        check_precision(cfg.training.precision, cluster)
        unsupported, vpps = probed or probe_support(data, template.model.num_layers)
        return cls(data, Path(base_dir) if base_dir else None, cfg, template.model, cluster,
                   gbs, template.costs, unsupported, vpps)

    _memo: dict[tuple[Any, ...], Any] = field(default_factory=dict, init=False, repr=False)
    """Caches of :meth:`rank_types`, :meth:`stage_schedule` and balanced splits (each a pure
    function of its key; per instance, so per worker)."""

    @property
    def framework(self) -> FrameworkProfile:
        """The experiment's training framework (``training.framework``)."""
        return framework(self.config.training.framework, self.config.training.precision)

    def costs_for(self, layout: Layout, num_stages: int) -> TransformerCosts:
        """The cost model of ``layout`` (as :func:`sim.experiment.build_experiment` makes it:
        the file's ``layers_per_stage`` list, its ``balanced`` split, or the even split)."""
        given = self.config.parallel.layers_per_stage
        stages = (tuple(given) if isinstance(given, list | tuple) and len(given) == num_stages
                  else stage_layers(self.framework, self.model.num_layers, num_stages))
        extra = {k: getattr(layout, k) for k in ("cp", "ep") if hasattr(self.costs, k)}
        costs = replace(self.costs, micro_batch_size=layout.micro_batch_size, tp=layout.tp,
                        dp=layout.dp, stage_layers=stages,
                        sequence_parallel=layout.sequence_parallel and layout.tp > 1,
                        zero_stage=layout.zero_stage, recompute=layout.recompute,
                        recompute_num_layers=self.config.training.recompute_num_layers,
                        recompute_every_k_layers=self.config.training.recompute_every_k_layers,
                        fp8_speedup=fp8_speedup(self.cluster) if self.costs.precision == "fp8"
                        else 1.0, **extra)
        costs = apply_framework(costs, self.framework, self.global_batch_size
                                // (layout.micro_batch_size * layout.dp),
                                self.config.training.vocab_parallel_loss)
        if given == "balanced":
            costs = replace(costs, stage_layers=self._balanced(layout, costs))
        return costs

    def _balanced(self, layout: Layout, costs: TransformerCosts) -> tuple[int, ...]:
        """``parallel.layers_per_stage: balanced``: the split :func:`sim.experiment.
        balanced_layers` gives ``layout`` (it depends on the cost model, which rank holds
        each stage, the placement and the GPUs, not on the number of micro-batches, so it
        is computed on a small build of the schedule and cached)."""
        key = ("balanced", costs, layout.schedule, layout.pp, layout.vpp, layout.placement)
        hit = self._memo.get(key)
        if hit is None:
            sched = self.stage_schedule(layout.schedule, layout.pp, layout.vpp,
                                        self.global_batch_size
                                        // (layout.micro_batch_size * layout.dp))
            hit = costs.stage_layers if sched is None else balanced_layers(
                costs, sched, self.placement(layout.tp, layout.cp, layout.dp, layout.pp,
                                             layout.placement),
                self.cluster)
            self._memo[key] = hit
        return hit

    def placement(self, tp: int, cp: int, dp: int, pp: int, order: str | None = None
                  ) -> Placement:
        """Where the layout's ranks go: in ``order`` (a searched placement), else the file's
        ``parallel.placement`` order."""
        return Placement.from_order(order or self.config.parallel.placement, tp=tp, cp=cp,
                                    dp=dp, pp=pp)

    def stage_schedule(self, name: str, p: int, v: int, m: int | None = None
                       ) -> Schedule | None:
        """A small build of schedule ``name`` for ``p`` ranks and ``v`` chunks (``2p`` or ``4p``
        micro-batches, else ``m``), for what does not depend on the number of micro-batches:
        which rank holds each stage and whether the backward is split; None if the builder
        refuses all of them."""
        k = self.config.training.seq_chunks

        def build(counts: tuple[int, ...]) -> Schedule | None:
            for count in counts:
                try:
                    return build_schedule(name, p, count, v, k)
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

    def rank_types(self, tp: int, cp: int, dp: int, pp: int, order: str | None = None
                   ) -> tuple[tuple[int, ...], ...]:
        """Per pipeline rank: the GPU types its GPUs have, as indices into
        ``cluster.gpu_types`` (``((0,),) * pp`` on a uniform cluster), with the ranks placed
        in ``order`` (None: the file's). A rank with more than one type mixes GPU types
        (:func:`topologies.placement.mixed_pipeline_ranks`)."""
        key = ("types", tp, cp, dp, pp, order)
        hit = self._memo.get(key)
        if hit is None:
            if not self.cluster.heterogeneous:
                hit = ((0,),) * pp
            else:
                index = {spec: i for i, spec in enumerate(self.cluster.gpu_types)}
                pl = self.placement(tp, cp, dp, pp, order)
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
    for name in LLM_SCHEDULES:  # a multimodal schedule needs an encoder, which search refuses
        ok = []
        for v in (1, 2, 3):
            try:
                if build_schedule(name, 2, 4, v, seq_chunks).chunks_per_rank == v:
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
    unknown = [s for s in pins.get("schedule", ()) if s not in SCHEDULES]
    if unknown:
        raise ConfigError(f"--fix schedule={unknown[0]!r}: unknown schedule; choose from "
                          f"{', '.join(SCHEDULES)}")
    n, model, gbs = ctx.cluster.num_gpus, ctx.model, ctx.global_batch_size
    supported = {d: [v for v in values if f"{SHORT_NAMES.get(d, d)}={v}" not in ctx.unsupported]
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
    # each layout's key (Layout.key) from the texts of its values, which the loops share:
    # ~3x cheaper than formatting each key whole, and the parent of a search needs them all
    sp_text = {sp: f"sp={_key_text(sp)} " for sp in sps}
    zero_text = {zero: f"zero={_key_text(zero)} " for zero in zeros}
    rc_text = {rc: f"recompute={_key_text(rc)} " for rc in recomputes}
    orders = pins.get("placement", (None,))
    order_text = {o: "" if o is None else f" placement={o}" for o in orders}
    new = Layout.with_key
    for ep in eps:
        head = f"tp={_key_text(tp)} pp={_key_text(pp)} dp={_key_text(dp)} cp={_key_text(cp)} " \
               f"ep={_key_text(ep)} vpp="
        for mbs in _allowed(pins, "micro_batch_size", _divisors(gbs // dp)):
            mbs_text = f"mbs={_key_text(mbs)} "
            for schedule, vpp in variants:
                if cp > 1 and SCHEDULES[schedule].seq_chunks:
                    continue  # CP and sequence chunks do not compose
                vpp_text = f"{head}{_key_text(vpp)} "
                tail = f"schedule={_key_text(schedule)}"
                for sp in sps:
                    sp_t = vpp_text + sp_text[sp]
                    for zero in zeros:
                        zero_t = sp_t + zero_text[zero] + mbs_text
                        for rc in recomputes:
                            rc_t = zero_t + rc_text[rc] + tail
                            for order in orders:
                                yield new((tp, pp, dp, cp, ep, vpp, sp, zero, mbs, rc,
                                           schedule, order), rc_t + order_text[order])
