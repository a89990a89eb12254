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

from dataclasses import dataclass

from workloads.models import ModelSpec
from workloads.schedules import BACKWARD, FORWARD, Op

BF16 = 2
"""Bytes per bf16 element."""


@dataclass(frozen=True, slots=True)
class ComputeSeg:
    """A compute kernel (or fused group) of one op on one GPU."""

    label: str
    flops: float = 0.0
    hbm_bytes: float = 0.0
    duration_s: float | None = None


@dataclass(frozen=True, slots=True)
class CommSeg:
    """A collective over the op's TP group."""

    label: str
    kind: str
    op: str
    nbytes: float


Segment = ComputeSeg | CommSeg


def split_layers(num_layers: int, num_stages: int) -> tuple[int, ...]:
    """Layers per stage, as even as possible; earlier stages take the remainder."""
    base, extra = divmod(num_layers, num_stages)
    return tuple(base + (1 if s < extra else 0) for s in range(num_stages))


@dataclass(frozen=True)
class SyntheticCosts:
    """Fixed per-stage, per-micro-batch costs for schedule studies (DESIGN.md ``synthetic``).

    ``backward_s`` is the whole backward; ``weight_grad_s`` the part that
    zero-bubble schedules may defer. With v chunks per rank each chunk costs 1/v.
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

    def op_segments(self, op: Op, split_backward: bool) -> tuple[Segment, ...]:
        v = self.chunks_per_rank
        if op.kind == FORWARD:
            t = self.forward_s
        elif op.kind == BACKWARD:
            t = self.backward_s - (self.weight_grad_s if split_backward else 0.0)
        else:
            t = self.weight_grad_s
        return (ComputeSeg(str(op), duration_s=t / v),)

    def activation_bytes_per_mb(self, stage: int) -> float:
        return self.activation_bytes / self.chunks_per_rank

    def p2p_bytes(self) -> float:
        return self.p2p_message_bytes

    def grad_bytes(self, stage: int) -> float:
        return self.grad_bytes_per_stage / self.chunks_per_rank

    def static_bytes(self, stages: tuple[int, ...]) -> float:
        return 0.0

    def optimizer_segment(self, stages: tuple[int, ...]) -> ComputeSeg | None:
        return None


@dataclass(frozen=True)
class TransformerCosts:
    """Costs of a dense transformer split into pipeline stages and TP shards."""

    model: ModelSpec
    micro_batch_size: int
    tp: int
    dp: int
    stage_layers: tuple[int, ...]
    """Transformer blocks in each stage (model chunk)."""
    sequence_parallel: bool = False
    zero_stage: int = 1
    recompute: str = "none"
    """``none``, ``selective`` (attention core recomputed) or ``full`` (whole layer)."""
    attention: str = "flash2"
    w_retained_fraction: float = 0.5

    # ------------------------------------------------------------- per layer
    @property
    def _bsh(self) -> float:
        return self.micro_batch_size * self.model.seq_length * self.model.hidden_size

    def _flash(self) -> bool:
        return self.attention in ("flash1", "flash2")

    def _gemm_flops(self) -> tuple[float, float]:
        """Forward GEMM FLOPs of one layer on one TP rank: (attention projections, MLP)."""
        m, t = self.model, self.tp
        bs = self.micro_batch_size * m.seq_length
        h = m.hidden_size
        attn = 2 * bs * h * (2 * h + 2 * m.kv_dim) / t
        mlp = 2 * bs * h * m.ffn_hidden_size * m.mlp_matrices / t
        return attn, mlp

    def _core_flops(self) -> float:
        """Forward attention-core FLOPs (QK^T and AV) the hardware executes on one TP rank.

        Model FLOPs count 4·b·s²·h; FlashAttention's causal kernels skip the
        masked upper triangle, so they execute about half (Dao 2023, sec. 3.1).
        """
        m = self.model
        full = 4 * self.micro_batch_size * m.seq_length**2 * m.hidden_size / self.tp
        return full / 2 if self._flash() else full

    def _layer_weight_bytes(self) -> float:
        return BF16 * self.model.layer_params() / self.tp

    def _scores_bytes(self) -> float:
        """Attention score/softmax bytes materialised by non-flash kernels: 5·a·s²·b / t."""
        m = self.model
        if self._flash():
            return 0.0
        return 5 * m.num_attention_heads * m.seq_length**2 * self.micro_batch_size / self.tp

    def layer_activation_bytes(self) -> float:
        """Bytes one layer stashes per micro-batch (Korthikanti et al. 2022, eq. 1-4, generalised).

        Replicated part: norm inputs (4), attention and MLP inputs (4), dropout
        masks (2, GPT only): 10 sbh for GPT. TP-split part: Q, K, V and the
        attention output (8 sbh) plus the MLP intermediates (2 bytes × width ×
        matrices: 16 sbh for GPT's 4h GeLU MLP): 24 sbh/t. Scores 5as²b/t unless
        flash or selective recompute. SP splits the replicated part too.
        """
        m, t = self.model, self.tp
        bsh = self._bsh
        if self.recompute == "full":
            return BF16 * bsh / (t if self.sequence_parallel else 1)
        dropout = 2 if m.norm == "layernorm" else 0
        replicated = (8 + dropout) * bsh
        mlp_width = m.ffn_hidden_size / m.hidden_size
        split = (8 + BF16 * mlp_width * m.mlp_matrices) * bsh / t
        if self.sequence_parallel:
            replicated /= t
        scores = 0.0 if self.recompute == "selective" else self._scores_bytes()
        return replicated + split + scores

    # ------------------------------------------------------------- segments
    def _block(self, label: str, compute: ComputeSeg) -> list[Segment]:
        """A TP-sharded block and its collectives (Megatron f/g operators).

        Without SP: compute, then an all-reduce of the b·s·h output. With SP
        (Korthikanti et al. 2022, sec. 4.2.2): all-gather the sequence-split
        input, compute, reduce-scatter the output; same bytes on the wire.
        """
        if self.tp == 1:
            return [compute]
        nbytes = BF16 * self._bsh
        if self.sequence_parallel:
            return [CommSeg(f"{label} all-gather", "tp", "all_gather", nbytes), compute,
                    CommSeg(f"{label} reduce-scatter", "tp", "reduce_scatter", nbytes)]
        return [compute, CommSeg(f"{label} all-reduce", "tp", "all_reduce", nbytes)]

    def _layer_forward(self, name: str, recompute: bool = False) -> list[Segment]:
        attn_gemm, mlp_gemm = self._gemm_flops()
        act = 0.0 if recompute else self.layer_activation_bytes()
        weights = self._layer_weight_bytes()
        share = attn_gemm / (attn_gemm + mlp_gemm)
        tag = "recompute " if recompute else ""
        attn = ComputeSeg(f"{tag}{name} attn", attn_gemm + self._core_flops(),
                          weights * share + act / 2 + self._scores_bytes())
        mlp = ComputeSeg(f"{tag}{name} mlp", mlp_gemm, weights * (1 - share) + act / 2)
        return self._block(f"{name} attn", attn) + self._block(f"{name} mlp", mlp)

    def _layer_backward(self, name: str, weight_grad_deferred: bool) -> list[Segment]:
        """Backward of one layer: 2x forward GEMM FLOPs (input and weight gradients).

        With a deferred weight gradient (zero-bubble B op) only the input
        gradient runs here; the W op runs the rest.
        """
        attn_gemm, mlp_gemm = self._gemm_flops()
        weights = self._layer_weight_bytes()
        act = self.layer_activation_bytes()
        share = attn_gemm / (attn_gemm + mlp_gemm)
        wg = 0.0 if weight_grad_deferred else 1.0
        segs: list[Segment] = []
        if self.recompute == "full":
            segs += self._layer_forward(name, recompute=True)
        elif self.recompute == "selective":
            segs.append(ComputeSeg(f"recompute {name} core", self._core_flops(), 0.0))
        mlp = ComputeSeg(f"{name} mlp bwd", mlp_gemm * (1 + wg),
                         weights * (1 - share) * 2 + act / 2)
        attn = ComputeSeg(f"{name} attn bwd", attn_gemm * (1 + wg) + 2 * self._core_flops(),
                          weights * share * 2 + act / 2 + 2 * self._scores_bytes())
        return segs + self._block(f"{name} mlp bwd", mlp) + self._block(f"{name} attn bwd", attn)

    def _head_flops(self) -> float:
        m = self.model
        return 2 * self.micro_batch_size * m.seq_length * m.hidden_size * m.vocab_size / self.tp

    def op_segments(self, op: Op, split_backward: bool) -> tuple[Segment, ...]:
        s = op.stage
        last = s == len(self.stage_layers) - 1
        layers = range(sum(self.stage_layers[:s]), sum(self.stage_layers[: s + 1]))
        segs: list[Segment] = []
        if op.kind == FORWARD:
            for layer in layers:
                segs += self._layer_forward(f"L{layer}")
            if last:
                segs.append(ComputeSeg("logits+loss", self._head_flops(),
                                       BF16 * self.model.vocab_size * self.model.hidden_size
                                       / self.tp))
        elif op.kind == BACKWARD:
            if last:
                wg = 0.0 if split_backward else 1.0
                segs.append(ComputeSeg("logits bwd", self._head_flops() * (1 + wg)))
            for layer in reversed(layers):
                segs += self._layer_backward(f"L{layer}", weight_grad_deferred=split_backward)
        else:
            attn_gemm, mlp_gemm = self._gemm_flops()
            flops = len(layers) * (attn_gemm + mlp_gemm) + (self._head_flops() if last else 0.0)
            segs.append(ComputeSeg("weight grads", flops,
                                   len(layers) * 2 * self._layer_weight_bytes()))
        return tuple(_fuse_compute(segs, str(op)))

    # ------------------------------------------------------------- memory and messages
    def activation_bytes_per_mb(self, stage: int) -> float:
        m = self.model
        total = self.stage_layers[stage] * self.layer_activation_bytes()
        if stage == len(self.stage_layers) - 1:
            total += 4 * self.micro_batch_size * m.seq_length * m.vocab_size / self.tp
        return total

    def p2p_bytes(self) -> float:
        """Activation (or its gradient) between stages, per TP rank.

        Megatron's scatter/gather optimisation sends 1/t of it (Narayanan et al.
        2021, sec. 4.1); with SP it is already split.
        """
        return BF16 * self._bsh / self.tp

    def stage_params(self, stage: int) -> float:
        """Parameters of a stage held by one TP rank."""
        m, t = self.model, self.tp
        n = self.stage_layers[stage] * m.layer_params() / t
        if stage == 0:
            n += m.embedding_params() / t
        if stage == len(self.stage_layers) - 1:
            n += m.head_params() / t
            if m.tied_embeddings and len(self.stage_layers) > 1:
                n += m.vocab_size * m.hidden_size / t
        return n

    def grad_bytes(self, stage: int) -> float:
        return BF16 * self.stage_params(stage)

    def bytes_per_param(self) -> float:
        """Model-state bytes per parameter, mixed-precision Adam under ZeRO (Rajbhandari 2020)."""
        d = self.dp
        return {0: 16.0, 1: 4 + 12 / d, 2: 2 + 14 / d, 3: 16 / d}[self.zero_stage]

    def static_bytes(self, stages: tuple[int, ...]) -> float:
        return self.bytes_per_param() * sum(self.stage_params(s) for s in stages)

    def optimizer_segment(self, stages: tuple[int, ...]) -> ComputeSeg | None:
        """AdamW update: memory-bound; reads grad, master, m, v and writes master, m, v, weight."""
        n = sum(self.stage_params(s) for s in stages)
        if self.zero_stage >= 1:
            n /= self.dp
        return ComputeSeg("optimizer", 10 * n, 28 * n)


def _fuse_compute(segs: list[Segment], op_name: str) -> list[Segment]:
    """Merge adjacent compute segments into one kernel group (fewer events).

    Runs of compute segments with no communication between them are summed and
    timed as one roofline (max of summed FLOP time and summed byte time), which
    lets a memory-bound kernel overlap a compute-bound neighbour: slightly
    optimistic, as fused or concurrent kernels are. The first segment carries
    the op's name.
    """
    out: list[Segment] = []
    for seg in segs:
        if out and isinstance(seg, ComputeSeg) and isinstance(out[-1], ComputeSeg) \
                and seg.duration_s is None and out[-1].duration_s is None:
            prev = out[-1]
            out[-1] = ComputeSeg(prev.label, prev.flops + seg.flops, prev.hbm_bytes + seg.hbm_bytes)
        else:
            out.append(seg)
    if out and isinstance(out[0], ComputeSeg):
        out[0] = ComputeSeg(op_name, out[0].flops, out[0].hbm_bytes, out[0].duration_s)
    return out
