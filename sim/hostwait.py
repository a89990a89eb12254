"""Host (CPU) overhead of dropless MoE layers: the GPU waiting for the CPU to issue kernels.

In eager PyTorch the CPU issues every kernel of a layer. Megatron-core's dropless MoE layers
synchronise the host with the GPU once per layer (the tokens each expert received, read for
the grouped GEMMs' sizes: ``megatron/core/transformer/moe/experts.py``
``TEGroupedMLP.forward``'s ``tokens_per_expert.tolist()``, the dispatchers'
``_maybe_dtoh_and_synchronize`` and HybridEP's sizing of its output), so the CPU never runs
more than one layer ahead of the GPU: where issuing a part of the layer takes the CPU longer
(``H``) than the GPU takes to run it (``G``), the GPU waits ``H − G`` for it, every layer and
micro-batch. Parts captured in a CUDA graph (``training.cuda_graph_scope``, Megatron-core's
``--cuda-graph-scope`` with ``--cuda-graph-impl transformer_engine``) are replayed without
the CPU issuing their kernels; the routed experts cannot be captured while dropless.

The parts and their host times are data (``sim/data/host_overhead.toml``): a part's ``H`` is
the GPU time the simulator gives it on the layout NVIDIA measured (DeepSeek-V3 on GB200,
``[measurement.experiment]``) plus the step time a change removing only that part's host work
saved there, per MoE layer and micro-batch (:func:`host_times`). A run's wait (:func:`waits`)
is Σ over its parts not captured of max(0, H − G_run), G_run that part's GPU time in the run
(:func:`part_times`), split between the layer's forward and backward as their GPU times are;
the lowering runs it as a fixed ``host wait`` segment of each MoE layer
(:attr:`workloads.transformer.TransformerCosts.moe_host_wait_s`). A framework profile turns it
on (``moe_host_sync``, :mod:`workloads.frameworks`).

Simplifications: the host time of a part is DeepSeek-V3's (MLA attention, 256 experts,
top-8, FP8 with Transformer Engine) on the write-up's Grace CPUs, given to every MoE layer
(another MoE layer issues other kernels, another CPU issues them at another speed); within a
part the CPU and the GPU are taken to run side by side (a part waits max(0, H − G), not the
max-plus of its kernels one by one); the parts of a layer are separate windows; TP
collectives are not counted in G (the CPU runs ahead during them: a larger wait than the
truth where they are long).
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from base.replaced import replaced
from sim.commtime import CollectiveTimer
from workloads.costs import CommSeg, ComputeSeg, Segment
from workloads.lowering.groups import ALL_TO_ALL_ALGO, ep_groups
from workloads.transformer import TransformerCosts

if TYPE_CHECKING:
    from sim.experiment import Experiment

DATA_FILE = Path(__file__).parent / "data" / "host_overhead.toml"
"""The parts of a MoE layer, the measurement of their host times, and the sources."""

PARTS = ("attention", "shared_experts", "routed_experts")
"""A MoE layer's parts as the measurement tells their host work apart."""

GRAPH_SCOPES = ("attn", "moe_router", "moe_preprocess")
"""``training.cuda_graph_scope`` values: Megatron-core's ``--cuda-graph-scope`` options for a
dropless MoE model (``mlp``, ``moe``, ``mamba`` capture parts it has not or cannot)."""


@dataclass(frozen=True)
class PartTimes:
    """GPU seconds of each part of one MoE layer, forward and backward of one micro-batch."""

    forward: tuple[tuple[str, float], ...]
    backward: tuple[tuple[str, float], ...]

    def total(self, part: str) -> float:
        return dict(self.forward)[part] + dict(self.backward)[part]


def _is_expert(seg: ComputeSeg) -> bool:
    """Whether a MoE layer's compute segment is its expert body (router, routed and shared
    experts: the ``... mlp`` / ``... mlp bwd`` segment, or a recomputed expert module)."""
    label = seg.label
    return label.endswith((" mlp", " mlp bwd")) or "moe act" in label


def part_times(costs: TransformerCosts, compute_s: Callable[[ComputeSeg], float],
               comm_s: Callable[[CommSeg], float]) -> PartTimes:
    """The GPU time of each of :data:`PARTS` in one MoE layer of ``costs``, forward and
    backward: attention, the compute outside the expert body (recomputation included); shared
    experts, their GEMMs (three times their forward in the two passes: the input and weight
    gradients; and their rerun under ``recompute_modules`` shared_experts); routed experts,
    the expert body less the shared experts, with the EP all-to-alls (``comm_s``: their time
    as the lowering runs them)."""
    m = costs.model.layer_spec(costs.model.first_dense_layers)
    layer = replace(costs, model=m)
    moe = m.moe
    assert moe is not None
    shared_f = compute_s(layer._shared_expert_gemms()) if moe.shared_experts else 0.0

    def split(segs: Iterable[Segment], shared: float) -> tuple[tuple[str, float], ...]:
        attn = experts = 0.0
        for seg in segs:
            if isinstance(seg, ComputeSeg):
                if seg.label.endswith(" shared experts"):  # recomputed (shared_experts)
                    shared += compute_s(seg)
                elif _is_expert(seg):
                    experts += compute_s(seg)
                else:
                    attn += compute_s(seg)
            elif isinstance(seg, CommSeg) and seg.group == "ep":
                experts += comm_s(seg)
        return (("attention", attn), ("shared_experts", shared),
                ("routed_experts", max(0.0, experts - shared)))
    return PartTimes(split(costs.moe_layer_segments(False), shared_f),
                     split(costs.moe_layer_segments(True), 2 * shared_f))


@cache
def _data() -> dict[str, Any]:
    with DATA_FILE.open("rb") as fh:
        return tomllib.load(fh)


def measured_savings_s() -> dict[str, float]:
    """Per part, the step time the measurement's change saved, per MoE layer and micro-batch:
    (T_before − T_after) / layer_passes, T = tokens per GPU × FLOPs per token / TFLOP/s."""
    data = _data()
    meas = data["measurement"]
    work = meas["tokens_per_gpu"] * meas["flops_per_token"]

    def step(tflops: float) -> float:
        return work / (tflops * 1e12)
    return {p: (step(data["parts"][p]["tflops_before"]) - step(data["parts"][p]["tflops_after"]))
            / meas["layer_passes"] for p in PARTS}


def graph_scope_of(part: str) -> tuple[str, ...]:
    """The ``--cuda-graph-scope`` values that capture ``part`` (empty: none can)."""
    return tuple(_data()["parts"][part]["graph_scope"])


@cache
def host_times() -> tuple[tuple[str, float], ...]:
    """Per part, the CPU seconds to issue it in one MoE layer (forward and backward of one
    micro-batch): its GPU time on the measured layout plus the saving measured there."""
    from sim.calibration import default_profile
    from sim.corpus import CORPUS_DIR
    from sim.device import work_timer
    from sim.experiment import build_experiment  # sim.experiment imports sim.api's modules

    spec = dict(_data()["measurement"]["experiment"])
    model = dict(spec["model"])
    model["hf_config"] = str(CORPUS_DIR.parent / model["hf_config"])
    exp = build_experiment({**spec, "model": model})
    compute_s = work_timer(exp.cluster.gpu, default_profile(exp.cluster.gpu.name),
                           exp.config.training.attention)
    times = part_times(exp.costs, compute_s, a2a_timer(exp, exp.costs))
    saved = measured_savings_s()
    return tuple((p, times.total(p) + saved[p]) for p in PARTS)


def waits(times: PartTimes, scope: Iterable[str]) -> tuple[float, float]:
    """(forward, backward) seconds a MoE layer waits for the CPU per micro-batch: Σ over the
    parts ``scope`` does not capture of max(0, H − G), split as the layer's GPU time is."""
    scope = set(scope)
    host = dict(host_times())
    wait = sum(max(0.0, host[p] - times.total(p)) for p in PARTS
               if not (graph_scope_of(p) and set(graph_scope_of(p)) <= scope))
    fwd = sum(t for _, t in times.forward)
    bwd = sum(t for _, t in times.backward)
    if wait <= 0.0 or fwd + bwd <= 0.0:
        return (0.0, 0.0)
    return (wait * fwd / (fwd + bwd), wait * bwd / (fwd + bwd))


def lowering_costs(exp: Experiment, costs: Any, compute_s: Callable[[ComputeSeg], float]
                   ) -> Any:
    """``costs`` with each MoE layer's host wait (:func:`waits`) where its framework profile
    synchronises the host per MoE layer (``moe_host_sync``); unchanged otherwise. The
    all-to-alls are timed as the lowering runs them (their fixed exposed time under
    ``parallel.moe_a2a_overlap``, else alone on pipeline rank 0's EP groups)."""
    if (not isinstance(costs, TransformerCosts) or costs.model.moe is None
            or not exp.framework.moe_host_sync):
        return costs
    times = part_times(costs, compute_s, a2a_timer(exp, costs))
    return replaced(costs, moe_host_wait_s=waits(times, exp.config.training.cuda_graph_scope))


def a2a_timer(exp: Experiment, costs: TransformerCosts) -> Callable[[CommSeg], float]:
    """A MoE all-to-all's time as the lowering runs it: its fixed time where it has one, else
    timed alone on pipeline rank 0's EP groups (1 GPU groups: none)."""
    groups = ep_groups(exp.placement, 0, costs.ep, costs.expert_tp) if costs.ep > 1 else None

    def a2a_s(seg: CommSeg) -> float:
        if seg.duration_s is not None:
            return seg.duration_s
        if groups is None:
            return 0.0
        timer = (CollectiveTimer.shared(exp.cluster, ALL_TO_ALL_ALGO) if seg.skew[0] == 1.0
                 else CollectiveTimer(exp.cluster, ALL_TO_ALL_ALGO, skew=seg.skew))
        return timer(seg.op, groups, seg.nbytes)
    return a2a_s
