"""Per-stage costs of pipeline ops: compute segments, TP collectives, memory. Pure.

A cost model turns one pipeline op (e.g. ``1F3``) into an ordered list of
segments run by every GPU of a TP group: compute kernels (FLOPs and HBM bytes,
or a fixed duration) and TP collectives. It also gives the bytes each stage
stashes per micro-batch, sends between stages, and reduces across DP.

Sources: FLOPs per layer follow Narayanan et al. 2021 (SC'21), sec. 5.1
(forward 2 FLOPs per multiply-add, backward twice the forward); activation
bytes follow Korthikanti et al. 2022 (MLSys'23), sec. 4, generalised to the
MLP width and activation of the model; model-state bytes follow Rajbhandari et
al. 2020 (ZeRO), sec. 3.1 (16 bytes/param for mixed-precision Adam).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from workloads.program import EQUAL_VOLUMES
from workloads.schedules import BACKWARD, FORWARD, Op
from workloads.seqchunks import equal_cost_bounds

BF16 = 2
"""Bytes per bf16 element."""


@dataclass(frozen=True, slots=True)
class ComputeSeg:
    """A run of compute kernels of one op on one GPU, described by the work they do.

    The device model (:mod:`sim.device`) turns the work into time; a fixed
    ``duration_s`` (synthetic workloads) overrides it.
    """

    label: str
    flops: float = 0.0
    """Dense matrix-multiply FLOPs (GEMMs)."""
    hbm_bytes: float = 0.0
    """Bytes the GEMMs move to and from HBM (weights and activations)."""
    duration_s: float | None = None
    attn_flops: float = 0.0
    """Attention-core FLOPs (QK^T, softmax·V) the attention kernel executes."""
    elementwise_bytes: float = 0.0
    """HBM bytes of memory-bound kernels: norms, residual adds, activations, softmax, RoPE."""
    gemm_dims: tuple[tuple[float, float], ...] = ()
    """``(smallest GEMM dimension, FLOPs)`` pairs splitting ``flops`` by GEMM shape, so the
    device model can apply shape-dependent efficiency (thin TP shards run below peak)."""


def merge_dims(*parts: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
    """Sum FLOPs of equal GEMM dimensions; sorted by dimension (deterministic)."""
    acc: dict[float, float] = {}
    for part in parts:
        for dim, flops in part:
            acc[dim] = acc.get(dim, 0.0) + flops
    return tuple(sorted(acc.items()))


@dataclass(frozen=True, slots=True)
class CommSeg:
    """A collective over the op's TP group (or, ``group="ep"``, its expert-parallel group)."""

    label: str
    kind: str
    op: str
    nbytes: float
    group: str = "tp"
    """``tp``: the op's TP group; ``ep``: the EP group of each GPU (MoE all-to-all)."""
    duration_s: float | None = None
    """A fixed time instead of timing the collective on the network: what a TP collective
    pipelined with its GEMM adds to the block (TP communication overlap,
    :attr:`workloads.transformer.TransformerCosts.tp_comm_exposed_s`); None: timed."""
    skew: tuple[float, bool] = EQUAL_VOLUMES
    """Dropless MoE all-to-all: (routing imbalance, whether the busiest EP rank sends);
    ``nbytes`` is then the busiest rank's volume (:attr:`workloads.program.Collective.skew`)."""


@dataclass(frozen=True, slots=True)
class ParamGather:
    """Marker (ZeRO-3/FSDP): the compute after it needs ``nbytes`` of parameters (bf16, or
    the linear weights in fp8 under ``fp8_param_gather``; this TP rank's shard of one layer)
    all-gathered over the DP group first.

    The lowering issues the all-gather on the DP stream one layer ahead of use
    (prefetch), so it overlaps the previous layer's compute (Rajbhandari et al.
    2020, sec. 5.2 and 7.2; PyTorch FSDP's forward/backward prefetch).
    """

    label: str
    nbytes: float
    expert_nbytes: float = 0.0
    """MoE with ep > 1: the layer's expert parameters on this GPU, gathered over the
    replicas holding the same experts."""


@dataclass(frozen=True, slots=True)
class GradReady:
    """Marker: the compute before it finished ``nbytes`` of weight gradients (bf16), one
    layer's (or the head's or embedding's), ready to be reduced over the DP group.

    Under ZeRO-3 the lowering reduce-scatters them at once (per layer); with
    ``overlap_grad_reduce`` it packs them into buckets reduced while the final
    backward runs (Megatron-LM ``--overlap-grad-reduce``; PyTorch DDP buckets,
    Li et al. 2020, VLDB, sec. 3.2.3).
    """

    label: str
    nbytes: float
    expert_nbytes: float = 0.0
    """MoE with ep > 1: expert gradient bytes, reduced over the replicas holding the same
    experts instead of the whole DP group."""


@dataclass(frozen=True, slots=True)
class RingAttention:
    """Context-parallel attention core (ring attention, Liu et al. 2023; Megatron-LM CP).

    ``steps`` (= cp) blocks of ``block`` compute. Before block j >= 1, each GPU
    of the CP ring receives from its predecessor the K/V block it holds
    (``nbytes`` per pass; in backward also the accumulated dK/dV) and forwards
    it to its successor after it arrived, so the pass of block j + 1 overlaps
    the compute of block j (Megatron's all-gather/reduce-scatter of K/V "turned
    into point-to-point communications in ring topology", docs
    ``api-guide/context_parallel.rst``).
    """

    label: str
    block: ComputeSeg
    steps: int
    nbytes: float
    kind: str = "cp"
    gathered: bool = False
    """All-gather context parallelism (Meta's, Dubey et al. 2024, sec. 3.3.2): the whole
    sequence's K and V (``nbytes`` a GPU, gathered) are all-gathered over the CP group before
    the ``steps`` blocks, which then run back to back; the gather's latency is "exposed in the
    critical path". No passes."""
    scatter_grads: bool = False
    """With :attr:`gathered`, in the backward: dK and dV (``nbytes``) reduce-scattered over
    the CP group after the blocks, exposed too."""


Marker = ParamGather | GradReady
Segment = ComputeSeg | CommSeg | ParamGather | GradReady | RingAttention


def split_layers(num_layers: int, num_stages: int) -> tuple[int, ...]:
    """Layers per stage, as even as possible; earlier stages take the remainder."""
    base, extra = divmod(num_layers, num_stages)
    return tuple(base + (1 if s < extra else 0) for s in range(num_stages))


@dataclass(frozen=True)
class SyntheticCosts:
    """Fixed per-stage, per-micro-batch costs for schedule studies (DESIGN.md ``synthetic``).

    ``backward_s`` is the whole backward; ``weight_grad_s`` the part that
    zero-bubble schedules may defer. With v chunks per rank each chunk costs 1/v.

    Sequence chunks (Seq1F1B, Sun et al. 2024, sec. 3): with ``seq_chunks =
    k > 1`` every op is one of ``k`` chunks of its micro-batch cut along the
    sequence so that each chunk has the same FLOPs; each costs ``1/k`` of the
    micro-batch's time. The cut follows the FLOPs of a causal transformer: a
    share ``attention_share`` of them is attention, whose cost for a token
    grows with its prefix, the rest is per token, so later chunks are shorter
    (:meth:`seq_bounds`). A chunk stashes activations in proportion to its
    tokens (:meth:`seq_chunk_share`); its keys and values are part of them and
    stay until its own backward, which runs after every later chunk's backward
    (those chunks attended to them): this is the key/value memory the later
    chunks keep. Pipeline messages are ``1/k`` of the micro-batch's each (the
    total is exact; per chunk they would follow the token shares).
    """

    forward_s: float
    backward_s: float
    weight_grad_s: float = 0.0
    activation_bytes: float = 0.0
    p2p_message_bytes: float = 0.0
    grad_bytes_per_stage: float = 0.0
    chunks_per_rank: int = 1
    w_retained_fraction: float = 0.5
    """Share of a micro-batch's activations still held between its B and its W."""
    seq_chunks: int = 1
    """k, sequence chunks per micro-batch (Seq1F1B); 1 = whole micro-batches."""
    attention_share: float = 0.25
    """Share of a micro-batch's FLOPs spent in causal attention (QK^T and AV), used only to place
    the sequence-chunk boundaries. 0.25 is s / (s + 12 h), the attention share of a GPT layer
    (Narayanan et al. 2021, sec. 5.1: 24 s h^2 + 4 s^2 h, halved by causal masking), for a 7B
    model (h = 4096) at s = 16k tokens, the long-sequence regime Seq1F1B targets."""

    def op_segments(self, op: Op, split_backward: bool,
                    markers: bool = False) -> tuple[Segment, ...]:
        """The op's fixed-duration compute. ``markers`` is accepted for the cost-model
        protocol; a synthetic op has no layers, so it marks nothing."""
        v = self.chunks_per_rank * (self.seq_chunks if op.seq >= 0 else 1)
        if op.kind == FORWARD:
            t = self.forward_s
        elif op.kind == BACKWARD:
            t = self.backward_s - (self.weight_grad_s if split_backward else 0.0)
        else:
            t = self.weight_grad_s
        return (ComputeSeg(str(op), duration_s=t / v),)

    def activation_bytes_per_mb(self, stage: int) -> float:
        return self.activation_bytes / self.chunks_per_rank

    def seq_bounds(self) -> tuple[float, ...]:
        """Sequence-chunk boundaries as fractions of the sequence: ``0 = x_0 < ... < x_k = 1``.

        Token at position ``x`` (fraction of the sequence) costs ``(1 - a) + 2 a x``
        (``a`` = :attr:`attention_share`; causal attention reads the ``x`` prefix),
        so the FLOPs of ``[0, x)`` are ``G(x) = (1 - a) x + a x^2`` and chunk ``c``
        ends where ``G(x) = (c + 1)/k`` (Sun et al. 2024, sec. 3, solved in closed
        form instead of the reference code's symbolic solver;
        :func:`workloads.seqchunks.equal_cost_bounds`).
        """
        return equal_cost_bounds(self.seq_chunks, self.attention_share)

    def seq_chunk_share(self, op: Op) -> float:
        """Share of its micro-batch's tokens (and stashed activations) ``op``'s chunk holds."""
        if op.seq < 0:
            return 1.0
        bounds = self.seq_bounds()
        return bounds[op.seq + 1] - bounds[op.seq]

    def p2p_bytes(self) -> float:
        return self.p2p_message_bytes / self.seq_chunks

    def grad_bytes(self, stage: int) -> float:
        return self.grad_bytes_per_stage / self.chunks_per_rank

    def static_bytes(self, stages: tuple[int, ...]) -> float:
        return 0.0

    def optimizer_segment(self, stages: tuple[int, ...]) -> ComputeSeg | None:
        return None


def relabeled(seg: ComputeSeg, label: str) -> ComputeSeg:
    """``dataclasses.replace(seg, label=label)`` (the reference): for a :class:`ComputeSeg`
    itself, its constructor with the other fields as they are (what ``replace`` passes it,
    without its per-field calls: ~3x faster; ``tests/test_fold_alike.py``)."""
    if type(seg) is not ComputeSeg:
        return replace(seg, label=label)
    return ComputeSeg(label, seg.flops, seg.hbm_bytes, seg.duration_s, seg.attn_flops,
                      seg.elementwise_bytes, seg.gemm_dims)


def fuse_alike(segs: list[Segment], op_name: str, memo: dict[tuple, tuple]
               ) -> list[Segment]:
    """:func:`fuse_compute` of ``segs``, remembered in ``memo`` by the identities of the
    segments (the entry holds them, so their ids are not reused while it lives): the
    unnamed ops of a cost model's middle stages are the same layer segments over again
    (:meth:`workloads.stage_ops.StageOps.op_work`), so a new cost model fuses one of them.
    Another ``op_name`` relabels the first segment as :func:`fuse_compute` does (a
    ``replace`` of the fused first segment: the same fields, the name its own)."""
    key = tuple(map(id, segs))
    found = memo.get(key)
    if found is None:
        out = fuse_compute(segs, op_name)
        memo[key] = (tuple(segs), tuple(out))
        return out
    out = list(found[1])
    if out and isinstance(out[0], ComputeSeg) and out[0].label != op_name:
        out[0] = relabeled(out[0], op_name)
    return out


def fuse_compute(segs: list[Segment], op_name: str) -> list[Segment]:
    """Merge adjacent compute segments into one (fewer events, same work).

    Runs of compute segments with no communication between them are summed;
    the device model times the sum. The first segment carries the op's name.
    """
    out: list[Segment] = []
    for seg in segs:
        prev = out[-1] if out else None
        if (isinstance(seg, ComputeSeg) and isinstance(prev, ComputeSeg)
                and seg.duration_s is None and prev.duration_s is None):
            out[-1] = ComputeSeg(prev.label, prev.flops + seg.flops,
                                 prev.hbm_bytes + seg.hbm_bytes, None,
                                 prev.attn_flops + seg.attn_flops,
                                 prev.elementwise_bytes + seg.elementwise_bytes,
                                 merge_dims(prev.gemm_dims, seg.gemm_dims))
        else:
            out.append(seg)
    if out and isinstance(out[0], ComputeSeg):
        out[0] = relabeled(out[0], op_name)
    return out
