"""Tensor-parallel communication overlap (``parallel.tp_comm_overlap``).

Transformer Engine's userbuffers (Megatron-core ``--tp-comm-overlap``, which NeMo turns on
for its H100 performance recipes) split each sequence-parallel all-gather and
reduce-scatter of a layer into chunks and pipeline them with the GEMM next to it: the
all-gather before the QKV and FC1 GEMMs, the reduce-scatter after proj and FC2, and in the
backward the output-gradient all-gather before the FC2 / proj input-gradient GEMM and the
input-gradient reduce-scatter behind the FC1 / QKV weight-gradient GEMM
(:data:`workloads.layer_work.TP_OVERLAP_GEMMS`). What each does, its chunks and the SMs its
communication takes from the GEMM are data (``sim/data/tp_overlap.toml``, with their source).

A pair of a collective taking ``c`` seconds alone and a GEMM taking ``g`` runs, with the
GEMM slowed by the communication beside it by :mod:`sim.contention`'s rule
(:func:`contended_s`: on the SMs the communication leaves it, ``g' = g·S/(S − k)``, when TE
sets an SM margin of ``k`` of the GPU's ``S`` SMs; ``g' = g`` beside the copy-engine ring
exchange, and where TE 1.x launches the GEMM on every SM (not charged, :func:`contended_s`);
``g + 0.189·min(c, g)`` beside NCCL without userbuffers), in
(:func:`pipelined_s`):

* ``pipeline`` (``n`` chunks, the reduce-scatter after the GEMM):
  ``g'/n + (n − 1)·max(g'/n, c/n) + c/n``, the first GEMM chunk and the last
  reduce-scatter chunk exposed;
* ``ring_exchange`` (``n`` = TP size, copies on the copy engines): the GEMM starts on
  the local chunk while the ``n − 1`` exchanges bring the others:
  ``(n − 1)·max(c/(n − 1), g'/n) + g'/n``;
* ``bulk``: both whole at once, ``max(c, g')``.

Whether the pipelined and bulk GEMMs take the SM margin is the framework's
(:attr:`workloads.frameworks.FrameworkProfile.tp_overlap_sm_margin`): Transformer Engine 2.x
sets it by default, 1.x (Megatron-core r0.8.0's) launches every GEMM on all SMs.

A pipelined GEMM runs as ``n`` chunks of ``1/n`` of its rows, issued round-robin on
``k`` compute streams (:func:`compute_streams`), so that ``min(k, n)`` consecutive chunks
run at once: ``n / min(k, n)`` groups, each at the efficiency the device model gives a
GEMM of the group's rows (:func:`chunked`); ``g`` above is their sum. The block's
compute already counts the whole GEMM, so the collective adds the rest, ``pair − g_whole``
(:func:`exposed_s`): it is emitted with that fixed time (:attr:`CommSeg.duration_s`)
instead of being timed on the network. ``c`` is the collective timed alone on the TP
groups of pipeline rank 0 (every replica's at once, as the collapsed lowering times it),
``g`` from the device model the simulation runs with. Not modelled: the all-gather of the
saved input the backward repeats for the weight gradient (TE's bulk ``qkv_dgrad`` /
``fc1_dgrad``; the simulator does not count that collective), HBM contention between
the copies and the GEMM. The search's screening and ``layers_per_stage: auto`` keep
timing these collectives as blocking.

PyTorch's async TP (a framework whose :attr:`~workloads.frameworks.FrameworkProfile.tp_overlap`
is ``symmetric-memory``: torchtitan's ``enable_async_tensor_parallel`` under torch.compile)
overlaps only the collectives Inductor's ``_micro_pipeline_tp`` pass fuses with a matmul
(``[symmetric_memory]`` of the data file, with its source): each as a ring exchange of ``tp``
chunk GEMMs beside copy-engine copies (``fused_all_gather_matmul`` /
``fused_matmul_reduce_scatter``, the formula above), a fused reduce-scatter followed by the
local sum of the ``tp`` partials it received (:func:`symm_mem_reduce_bytes`, memory-bound);
the others stay NCCL collectives, timed as without overlap.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from base.errors import ConfigError
from base.replaced import replaced
from sim.contention import charge, mechanism
from workloads.costs import BF16, ComputeSeg
from workloads.layer_work import SP_REGATHER_GEMMS, TP_OVERLAP_GEMMS
from workloads.lowering.groups import tp_groups
from workloads.transformer import TransformerCosts

if TYPE_CHECKING:
    from sim.experiment import Experiment

DATA_FILE = Path(__file__).parent / "data" / "tp_overlap.toml"
"""Transformer Engine's overlap methods and the GPUs' SM counts, each with its source."""


@dataclass(frozen=True)
class Method:
    """How Transformer Engine overlaps one GEMM with its collective."""

    name: str
    """``ring_exchange``, ``pipeline`` or ``bulk``."""
    splits: int
    """Chunks the GEMM and the collective are cut into; 0: the TP size."""
    sms: int
    """SMs the communication kernels take."""
    sm_margin: bool
    """Whether the GEMM is launched on the SMs the communication leaves it."""


@cache
def _data() -> dict:
    with DATA_FILE.open("rb") as fh:
        return tomllib.load(fh)


def method_of(layer: str) -> Method:
    """The overlap method of Transformer Engine's GEMM ``layer`` (e.g. ``proj_fprop``)."""
    data = _data()
    name = data["layers"][layer]
    m = data["methods"][name]
    return Method(name, int(m["splits"]), int(m["sms"]), bool(m["sm_margin"]))


def symm_mem_method(layer: str) -> Method | None:
    """The overlap PyTorch's async TP gives Transformer Engine's GEMM ``layer`` (e.g.
    ``proj_fprop``): a ring exchange where Inductor's ``_micro_pipeline_tp`` pass fuses its
    collective with it, None where the collective stays an NCCL one."""
    name = _data()["symmetric_memory"]["layers"].get(layer)
    if name is None:
        return None
    m = _data()["methods"][name]
    return Method(name, int(m["splits"]), int(m["sms"]), bool(m["sm_margin"]))


def symm_mem_reduce_bytes(nbytes: float, tp: int) -> float:
    """HBM bytes of the local reduction after a fused matmul-reduce-scatter of a ``nbytes``
    bf16 output on ``tp`` GPUs: the stacked partials read (``nbytes``, ``tp`` chunks of
    ``nbytes/tp``) and their sum written (``nbytes/tp``), ``[symmetric_memory]`` of the data
    file."""
    return nbytes * (1 + 1 / tp) if _data()["symmetric_memory"]["reduce_after_copy"] else 0.0


def sm_count(gpu: str) -> int | None:
    """Streaming multiprocessors of GPU preset ``gpu`` (None: no entry)."""
    value = _data()["sms"].get(gpu)
    return None if value is None else int(value)


def compute_streams() -> int:
    """CUDA streams Transformer Engine issues a pipelined GEMM's chunks on, round-robin."""
    return int(_data()["compute_streams"])


def chunks(method: Method, tp: int) -> int:
    """Chunks ``method`` cuts a GEMM and its collective into in a TP group of ``tp``."""
    return tp if method.splits == 0 else method.splits


def chunked(gemm: ComputeSeg, n: float) -> ComputeSeg:
    """One of ``n`` row chunks of ``gemm`` (``n`` need not be whole: a group of chunks
    running at once): ``1/n`` of its FLOPs, at the size the device model's efficiency
    curve sees shrunk by ``n^(1/3)`` (the cube side of M·K·N,
    :func:`workloads.kernels.gemm`)."""
    dims = tuple((d / n ** (1 / 3), f / n) for d, f in gemm.gemm_dims)
    return replace(gemm, flops=gemm.flops / n, hbm_bytes=gemm.hbm_bytes / n, gemm_dims=dims)


def pipelined_s(method: Method, comm_s: float, gemm_s: float, tp: int, sms: int) -> float:
    """Seconds of a GEMM (``gemm_s``: its chunks, on every SM) and its collective (``comm_s``
    alone) run overlapped by ``method`` on a GPU of ``sms`` SMs in a TP group of ``tp``
    (module doc), the GEMM slowed by the collective beside it (:func:`contended_s`)."""
    g = contended_s(method, comm_s, gemm_s, sms)
    if method.name in ("bulk", "nccl"):
        return max(comm_s, g)
    n = chunks(method, tp)
    if method.name == "ring_exchange":
        return (n - 1) * max(comm_s / (n - 1), g / n) + g / n
    return g / n + (n - 1) * max(g / n, comm_s / n) + comm_s / n


def exposed_s(costs: TransformerCosts, compute_s: Callable[[ComputeSeg], float],
              collective_s: Callable[[str, float], float], sms: int, sm_margin: bool = True,
              kind: str = "userbuffers") -> tuple[tuple[str, float], ...]:
    """What each sequence-parallel collective of a layer adds beside its block's compute
    when pipelined with its GEMM: ``pipelined_s − g`` (module doc), by the collective's
    name in :data:`~workloads.layer_work.TP_OVERLAP_GEMMS`. ``collective_s(op, nbytes)``
    times a TP collective alone; ``sm_margin`` False launches every GEMM on all SMs
    whatever its method's ``sm_margin`` (Transformer Engine 1.x). ``kind``
    ``symmetric-memory``: PyTorch's async TP (module doc), whose unfused collectives are
    left out (timed on the network as without overlap) and whose fused reduce-scatters add
    their local reduction (:func:`symm_mem_reduce_bytes`)."""
    gemms = costs.tp_overlap_gemms()
    nbytes = BF16 * costs.micro_batch_size * costs.model.seq_length / costs.cp \
        * costs.model.hidden_size
    symm = kind == "symmetric-memory"
    out = []
    for name, (gemm, layer) in TP_OVERLAP_GEMMS.items():
        op = "all_gather" if name.endswith("all-gather") else "reduce_scatter"
        method = symm_mem_method(layer) if symm else method_of(layer)
        if method is None:
            continue
        if not sm_margin:
            method = replace(method, sm_margin=False)
        n = chunks(method, costs.tp)
        streams = SYMM_MEM_STREAMS if symm else compute_streams()
        groups = n / min(streams, n)  # chunks running at once share the GPU
        g_chunks = groups * compute_s(chunked(gemms[gemm], groups))
        moved = nbytes if op == "reduce_scatter" else nbytes / BF16 * costs._tp_gather_bytes
        pair = pipelined_s(method, collective_s(op, moved), g_chunks, costs.tp, sms)
        if symm and op == "reduce_scatter":
            pair += compute_s(ComputeSeg(f"{name} sum", elementwise_bytes=symm_mem_reduce_bytes(
                nbytes, costs.tp)))
        out.append((name, pair - compute_s(gemms[gemm])))
    return tuple(out)


SYMM_MEM_STREAMS = 2
"""CUDA streams PyTorch's async TP issues its chunk GEMMs on: the current stream and the
process group's backend stream, alternating chunk by chunk (``step % 2``) so that two
consecutive chunks' GEMMs (and copies) can run at once
(torch/distributed/_symmetric_memory/__init__.py ``_pipelined_all_gather_and_consume`` and
``_pipelined_produce_and_all2all``: "In addition to computation/communication overlapping,
the strategy allows for computation/computation overlapping, greatly reducing quantization
inefficiency")."""


NCCL_BESIDE = Method("nccl", 1, 0, False)
"""A TP collective launched asynchronously beside a GEMM without userbuffers (NCCL on its own
stream, the GEMM on every SM): both whole at once, ``max(c, g + s·min(c, g))`` with NCCL's
contention share ``s`` (:func:`contended_s`)."""


def contended_s(method: Method, comm_s: float, gemm_s: float, sms: int) -> float:
    """The GEMM's seconds beside its collective by :mod:`sim.contention`'s rule: launched on
    the ``sms − k`` SMs the userbuffers kernels leave it (``sm_margin``), ``g·S/(S − k)``;
    beside a copy-engine ring exchange, ``g``; beside NCCL (:data:`NCCL_BESIDE`), ``g +
    charge(c, g)``. On every SM beside kernels holding ``k`` of them (Transformer Engine 1.x,
    no margin) the rule would give ``g + min(c, g)·k/(S − k)``; tried and not shipped (it
    moves Megatron-Core r0.8.0's H100 rows further from their measurements,
    docs/contention.md): ``g``."""
    if method.name == "nccl":
        return gemm_s + charge("sp_nccl_beside", comm_s, gemm_s)
    if mechanism(f"tp_{method.name}") != "sm_kernels" or not method.sms:
        return gemm_s
    if method.sm_margin:
        return gemm_s * sms / (sms - method.sms)
    return gemm_s  # TE 1.x: not charged (docs/contention.md, tried: corpus 5.74% -> 5.82%)


def regathers(costs: TransformerCosts) -> bool:
    """Whether ``costs``' backward all-gathers its column-parallel GEMMs' saved inputs again
    (:attr:`~TransformerCosts.sp_regather_input` under TP with sequence parallelism, on the
    dense attention + MLP layers :data:`~workloads.layer_work.SP_REGATHER_GEMMS` names)."""
    m = costs.model
    return (costs.sp_regather_input and costs.tp > 1 and costs.sequence_parallel
            and m.moe is None and m.mla is None and not m.parallel_blocks)


def regather_exposed_s(costs: TransformerCosts, compute_s: Callable[[ComputeSeg], float],
                       collective_s: Callable[[str, float], float], sms: int, overlap: bool,
                       sm_margin: bool = True) -> tuple[tuple[str, float], ...]:
    """What the backward's second all-gather of each saved GEMM input adds beside the
    input-gradient GEMM it runs with (:data:`~workloads.layer_work.SP_REGATHER_GEMMS`):
    ``pair − g``, the pair as Transformer Engine's userbuffers method for that GEMM under
    TP communication overlap (``overlap``), else NCCL's all-gather beside it
    (:data:`NCCL_BESIDE`); none where :func:`regathers` is False. The shard is the bf16
    norm output, or under ``precision: fp8`` its fp8 cast, which is what Transformer Engine
    saves (as :meth:`~TransformerCosts.layer_activation_bytes` counts it)."""
    if not regathers(costs):
        return ()
    gemms = costs.tp_overlap_gemms()
    saved = 1.0 if costs.precision == "fp8" else BF16  # TE saves ln_out cast to fp8
    nbytes = saved * costs.micro_batch_size * costs.model.seq_length / costs.cp \
        * costs.model.hidden_size
    out = []
    for name, (gemm, layer) in SP_REGATHER_GEMMS.items():
        method = method_of(layer) if overlap else NCCL_BESIDE
        if not sm_margin:
            method = replace(method, sm_margin=False)
        g = compute_s(gemms[gemm])
        pair = pipelined_s(method, collective_s("all_gather", nbytes), g, costs.tp, sms)
        out.append((name, pair - g))
    return tuple(out)


def reduces_beside(costs: TransformerCosts) -> bool:
    """Whether ``costs``' backward reduce-scatters each column-parallel GEMM's input gradient
    beside its weight-gradient GEMM without userbuffers
    (:attr:`~TransformerCosts.sp_async_grad_reduce_scatter`, on the same layers as
    :func:`regathers`)."""
    return costs.sp_async_grad_reduce_scatter and regathers(replace(costs,
                                                                    sp_regather_input=True))


def async_reduce_exposed_s(costs: TransformerCosts, compute_s: Callable[[ComputeSeg], float],
                           collective_s: Callable[[str, float], float]
                           ) -> tuple[tuple[str, float], ...]:
    """Without TP communication overlap, what each block's backward reduce-scatter of the
    QKV / FC1 input gradient adds beside the weight-gradient GEMM NCCL runs it with
    (``attn bwd reduce-scatter`` and ``mlp bwd reduce-scatter`` of
    :data:`~workloads.layer_work.TP_OVERLAP_GEMMS`, :data:`NCCL_BESIDE`: ``max(c, g + s·min(c,
    g)) − g``);
    none where :func:`reduces_beside` is False."""
    if not reduces_beside(costs):
        return ()
    gemms = costs.tp_overlap_gemms()
    nbytes = BF16 * costs.micro_batch_size * costs.model.seq_length / costs.cp \
        * costs.model.hidden_size
    out = []
    for name in ("attn bwd reduce-scatter", "mlp bwd reduce-scatter"):
        g = compute_s(gemms[TP_OVERLAP_GEMMS[name][0]])
        out.append((name, pipelined_s(NCCL_BESIDE, collective_s("reduce_scatter", nbytes), g,
                                      costs.tp, 1 << 30) - g))
    return tuple(out)


def all_reduces_beside(costs: TransformerCosts) -> bool:
    """Whether ``costs``' backward all-reduces each column-parallel GEMM's input gradient
    beside its weight-gradient GEMM (:attr:`~TransformerCosts.tp_async_grad_all_reduce`):
    tensor parallelism without sequence parallelism, in a dense layer of separate attention
    and MLP blocks."""
    return (costs.tp_async_grad_all_reduce and costs.tp > 1 and not costs.sequence_parallel
            and costs.model.moe is None and not costs.model.parallel_blocks)


def async_all_reduce_exposed_s(costs: TransformerCosts,
                               compute_s: Callable[[ComputeSeg], float],
                               collective_s: Callable[[str, float], float]
                               ) -> tuple[tuple[str, float], ...]:
    """Without sequence parallelism, what each block's backward all-reduce of the QKV / FC1
    input gradient (``attn bwd all-reduce``, ``mlp bwd all-reduce``) adds beside the
    weight-gradient GEMM NCCL runs it with (:data:`NCCL_BESIDE`, as
    :func:`async_reduce_exposed_s`); none where :func:`all_reduces_beside` is False."""
    if not all_reduces_beside(costs):
        return ()
    gemms = costs.tp_overlap_gemms()
    nbytes = BF16 * costs.micro_batch_size * costs.model.seq_length / costs.cp \
        * costs.model.hidden_size
    out = []
    for name, gemm in (("attn bwd all-reduce", "qkv"), ("mlp bwd all-reduce", "fc1")):
        g = compute_s(gemms[gemm])
        out.append((name, pipelined_s(NCCL_BESIDE, collective_s("all_reduce", nbytes), g,
                                      costs.tp, 1 << 30) - g))
    return tuple(out)


def head_beside(costs: TransformerCosts) -> bool:
    """Whether the output layer's backward runs any TP collective beside its GEMMs
    (:func:`head_exposed_s`)."""
    if costs.tp == 1:
        return False
    if costs.sequence_parallel:
        return costs.sp_regather_input or costs.sp_async_grad_reduce_scatter
    return all_reduces_beside(costs)


def head_exposed_s(costs: TransformerCosts, compute_s: Callable[[ComputeSeg], float],
                   collective_s: Callable[[str, float], float]
                   ) -> tuple[tuple[str, float], ...]:
    """What the output layer's backward TP collectives add beside the head's GEMM NCCL runs
    them with (:data:`NCCL_BESIDE`, as :func:`async_reduce_exposed_s`), b·s·h bf16 each
    (:meth:`~workloads.layer_work.LayerWork._head_tp`): its column-parallel linear shares the
    layers' autograd function (Megatron-core ``LinearWithGradAccumulationAndAsyncCommunication``,
    not Transformer Engine's, so never userbuffers), hence the layers' flags. Without SP the
    input gradient's all-reduce beside the weight-gradient GEMM where the layers' are
    (:func:`all_reduces_beside`); under SP the saved input's second all-gather beside the
    input-gradient GEMM (:attr:`~TransformerCosts.sp_regather_input`) and the input
    gradient's reduce-scatter beside the weight-gradient GEMM
    (:attr:`~TransformerCosts.sp_async_grad_reduce_scatter`)."""
    if not head_beside(costs):
        return ()
    g = compute_s(costs.head_gemm())
    nbytes = BF16 * costs.micro_batch_size * costs.model.seq_length / costs.cp \
        * costs.model.hidden_size
    out = []
    if not costs.sequence_parallel:
        pairs = (("head bwd all-reduce", "all_reduce"),)
    else:
        pairs = ((("head bwd input all-gather", "all_gather"),) if costs.sp_regather_input
                 else ()) + ((("head bwd reduce-scatter", "reduce_scatter"),)
                             if costs.sp_async_grad_reduce_scatter else ())
    for name, op in pairs:
        out.append((name, pipelined_s(NCCL_BESIDE, collective_s(op, nbytes), g, costs.tp,
                                      1 << 30) - g))
    return tuple(out)


def check(gpu: str, tp: int, sequence_parallel: bool, why_not: str | None) -> None:
    """ConfigError where ``parallel.tp_comm_overlap`` cannot apply: Megatron's own rule
    (megatron/training/arguments.py: "Tensor parallel communication/GEMM overlap can happen
    only when sequence parallelism is enabled"), a GPU without an SM count, or a model
    whose blocks are not the dense attention + MLP pair (``why_not``)."""
    if tp > 1 and not sequence_parallel:
        raise ConfigError("parallel.tp_comm_overlap: tensor parallel communication/GEMM "
                          "overlap can happen only when sequence parallelism is enabled "
                          "(Megatron-LM); set parallel.sequence_parallel: true")
    if sm_count(gpu) is None and gpu != "ideal":
        raise ConfigError(f"parallel.tp_comm_overlap: no SM count for GPU {gpu!r} "
                          f"({DATA_FILE.name}); Transformer Engine's userbuffers run on "
                          "NVIDIA GPUs")
    if why_not is not None:
        raise ConfigError(f"parallel.tp_comm_overlap: not modelled for {why_not}")


def lowering_costs(exp: Experiment, compute_s: Callable[[ComputeSeg], float],
                   timer: Callable[[str, tuple[tuple[int, ...], ...], float], float]) -> Any:
    """The costs ``exp`` is lowered with: its own, or under ``parallel.tp_comm_overlap`` (or
    with the backward's second all-gathers of :func:`regathers`) with the exposed times of
    its TP collectives (:func:`with_overlap`), the collectives timed by ``timer`` (a
    :class:`~sim.commtime.CollectiveTimer`) on pipeline rank 0's TP groups and the GEMMs by
    ``compute_s``."""
    costs = exp.costs
    if not isinstance(costs, TransformerCosts):
        return costs
    overlap = exp.config.parallel.tp_comm_overlap
    if (not overlap and not regathers(costs) and not reduces_beside(costs)
            and not all_reduces_beside(costs) and not head_beside(costs)):
        return costs
    groups = tp_groups(exp.placement, 0)
    return with_overlap(costs, exp.cluster.gpu.name, compute_s,
                        lambda op, nbytes: timer(op, groups, nbytes),
                        exp.framework.tp_overlap_sm_margin, overlap, exp.framework.tp_overlap)


def with_overlap(costs: TransformerCosts, gpu: str,
                 compute_s: Callable[[ComputeSeg], float],
                 collective_s: Callable[[str, float], float],
                 sm_margin: bool = True, overlap: bool = True,
                 kind: str = "userbuffers") -> TransformerCosts:
    """``costs`` with :attr:`~TransformerCosts.tp_comm_exposed_s` set (no change without
    TP; without sequence parallelism only the backward all-reduces of
    :func:`async_all_reduce_exposed_s`); ``sm_margin``: the
    framework's (:func:`exposed_s`); ``overlap``: TP communication overlap on (the layer's
    SP collectives pipelined with their GEMMs), else only the second all-gathers of
    :func:`regather_exposed_s` and the reduce-scatters NCCL runs beside the weight gradients
    (:func:`async_reduce_exposed_s`)."""
    if costs.tp == 1:
        return costs
    if not costs.sequence_parallel:
        pairs = (async_all_reduce_exposed_s(costs, compute_s, collective_s)
                 + head_exposed_s(costs, compute_s, collective_s))
        return replaced(costs, tp_comm_exposed_s=pairs) if pairs else costs
    sms = sm_count(gpu)
    if sms is None:  # the ideal GPU: no compute time to slow
        sms = 1 << 30
    pairs = (exposed_s(costs, compute_s, collective_s, sms, sm_margin, kind) if overlap
             else async_reduce_exposed_s(costs, compute_s, collective_s))
    pairs += regather_exposed_s(costs, compute_s, collective_s, sms,
                                overlap and kind == "userbuffers", sm_margin)
    pairs += head_exposed_s(costs, compute_s, collective_s)
    return replaced(costs, tp_comm_exposed_s=pairs)

