"""A multimodal model's encoder: presets, its op costs, and the cost model of encoder + LLM.

The encoder (a vision transformer) runs on the LLM's GPUs, as in Optimus (Feng et al.
2024, sec. 4.1): ``parallel.encoder`` gives it its own TP degree (1 or the LLM's),
pipeline stages (dividing the LLM's pp; encoder pipeline ``q``'s stage ``j`` on LLM
rank ``q·pp_e + j``) and data parallelism (the rest). Per LLM micro-batch of ``b``
samples, the ``pp/pp_e · tp/tp_e`` encoder replicas on one LLM pipeline's GPUs split
its samples, so each GPU runs its stage's layers for ``b · pp_e · tp_e / (pp · tp)``
samples (:attr:`TransformerEncoder.samples`, possibly fractional: a share of the work).
Each stage's layers are cut into ``pieces`` ops (:class:`~workloads.schedules.EncoderLayout`).

Not modelled: the patch embedding and the projector into the LLM's width (small next to
the blocks); the features the encoder sends are its last hidden states. The flash
attention kernels' cost assumes causal attention (half the score matrix); a ViT's is
bidirectional, but at 256 patches the attention core is under 2% of a ViT-22B layer's
FLOPs. The encoder's gradients are reduced with the LLM stage's gradients of the same
GPU, over the LLM's DP group (a ring's time depends on the bytes, hardly on the group).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from workloads.costs import BF16, CommSeg, ComputeSeg, Segment, split_layers
from workloads.lowering.opcosts import CostModel
from workloads.memory import model_state_bytes_per_param
from workloads.models import ModelSpec
from workloads.schedules import ENCODER_BACKWARD, ENCODER_FORWARD, EncoderLayout, Op
from workloads.transformer import TransformerCosts


def _vit(name: str, layers: int, width: int, heads: int, mlp: int, tokens: int) -> ModelSpec:
    """A ViT encoder (pre-norm LayerNorm, GeLU MLP, learned positions, no output head):
    ``tokens`` patches per image."""
    return ModelSpec(name, layers, width, heads, heads, mlp, 0, tokens, ffn_type="gelu",
                     norm="layernorm", position_embedding="learned")


ENCODER_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        # Dosovitskiy et al. 2021, table 1; 224 px images: 196 patches of 16, 256 of 14.
        _vit("vit-b-16", 12, 768, 12, 3072, 196),
        _vit("vit-l-16", 24, 1024, 16, 4096, 196),
        _vit("vit-h-14", 32, 1280, 16, 5120, 256),
        # Zhai et al. 2022 ("Scaling Vision Transformers"), table 2: ViT-g/14 (1.0B),
        # ViT-G/14 (1.8B).
        _vit("vit-g-14", 40, 1408, 16, 6144, 256),
        _vit("vit-bigg-14", 48, 1664, 16, 8192, 256),
        # Chen et al. 2022 (PaLI), sec. 3.1: ViT-e, 3.9B.
        _vit("vit-e-14", 56, 1792, 16, 15360, 256),
        # Dehghani et al. 2023, table 1: ViT-22B (21.7B; its parallel attention/MLP layout,
        # QK norm and missing biases are not modelled), patch 14 at 224 px; the encoder of
        # Optimus's largest experiment (Feng et al. 2024, sec. 6).
        _vit("vit-22b", 48, 6144, 48, 24576, 256),
    )
}
"""Encoder presets by name (``model.encoder.preset``)."""


def _share(seg: Segment, factor: float) -> Segment:
    """``seg``'s work and bytes times ``factor`` (a GPU's share of the micro-batch)."""
    if isinstance(seg, CommSeg):
        return replace(seg, nbytes=seg.nbytes * factor)
    assert isinstance(seg, ComputeSeg)
    return replace(seg, flops=seg.flops * factor, hbm_bytes=seg.hbm_bytes * factor,
                   attn_flops=seg.attn_flops * factor,
                   elementwise_bytes=seg.elementwise_bytes * factor,
                   gemm_dims=tuple((d, f * factor) for d, f in seg.gemm_dims))


@dataclass(frozen=True)
class TransformerEncoder:
    """A transformer encoder's op costs on one GPU of its layout."""

    blocks: TransformerCosts
    """The encoder's blocks for one sample, on tp_e GPUs."""
    layout: EncoderLayout
    stage_layers: tuple[int, ...]
    """Layers of each encoder stage."""
    samples: float
    """Samples of each LLM micro-batch one GPU encodes (its share)."""
    shards: int
    """dp_e: replicas holding the same encoder weights (ZeRO shards over them)."""
    zero_stage: int

    def piece_layers(self, rank: int, piece: int) -> int:
        """Layers of encoder piece ``piece`` on pipeline rank ``rank``."""
        j = self.layout.stage_of(rank)
        return split_layers(self.stage_layers[j], self.layout.pieces)[piece]

    def segments(self, op: Op) -> tuple[Segment, ...]:
        """An encoder piece's layers (forward, or backward with weight gradients)."""
        backward = op.kind == ENCODER_BACKWARD
        segs: list[Segment] = []
        for i in range(self.piece_layers(op.stage, op.seq)):
            label = f"enc{op.seq}.{i} {'bwd' if backward else 'fwd'}"
            segs += (_share(x, self.samples) for x in self.blocks.block_segments(backward, label))
        return tuple(segs)

    def stash_bytes(self, op: Op) -> float:
        """Activations a piece's forward keeps until its backward."""
        return (self.blocks.layer_activation_bytes() * self.piece_layers(op.stage, op.seq)
                * self.samples)

    def message_bytes(self) -> float:
        """Hidden states (or their gradient) a GPU sends per micro-batch at an encoder stage
        boundary or to the LLM (Megatron's scatter/gather: 1/tp_e of them)."""
        m = self.blocks.model
        return BF16 * m.seq_length * m.hidden_size * self.samples / self.blocks.tp

    def params(self, rank: int) -> float:
        """Encoder parameters on one GPU of pipeline rank ``rank``."""
        j = self.layout.stage_of(rank)
        return self.stage_layers[j] * self.blocks.model.layer_params() / self.blocks.tp

    def static_bytes(self, rank: int) -> float:
        """Model state of the encoder part on one GPU (ZeRO over the dp_e replicas)."""
        return self.params(rank) * model_state_bytes_per_param(self.zero_stage, self.shards)

    def optimizer_params(self, rank: int) -> float:
        """Parameters whose optimizer state one GPU updates (sharded under ZeRO >= 1)."""
        return self.params(rank) / (self.shards if self.zero_stage >= 1 else 1)


@dataclass(frozen=True)
class SyntheticEncoder:
    """An encoder of fixed per-rank costs (``model.encoder.synthetic``), for schedule studies."""

    layout: EncoderLayout
    forward_s: float
    """One rank's encoder forward of one micro-batch, all pieces."""
    backward_s: float
    activation_bytes: float
    output_bytes: float

    def segments(self, op: Op) -> tuple[Segment, ...]:
        """A fixed-duration piece: an even share of the rank's time."""
        t = self.forward_s if op.kind == ENCODER_FORWARD else self.backward_s
        return (ComputeSeg(str(op), duration_s=t / self.layout.pieces),)

    def stash_bytes(self, op: Op) -> float:
        """An even share of the rank's activations per micro-batch."""
        return self.activation_bytes / self.layout.pieces

    def message_bytes(self) -> float:
        """Each encoder message, as given."""
        return self.output_bytes

    def static_bytes(self, rank: int) -> float:
        """No model state (synthetic costs have no weights)."""
        return 0.0

    def params(self, rank: int) -> float:
        """No parameters."""
        return 0.0

    def optimizer_params(self, rank: int) -> float:
        """No parameters to update."""
        return 0.0


Encoder = TransformerEncoder | SyntheticEncoder


@dataclass(frozen=True)
class MultimodalCosts:
    """The cost model of encoder + LLM (:class:`~workloads.lowering.CostModel`): encoder ops
    (``E``, ``G``) cost the encoder's, every other op the LLM's; each GPU holds both
    models' state; the encoder's gradients are reduced and updated with its LLM stage's.
    One chunk per pipeline rank (stage ``s`` is rank ``s``)."""

    llm: CostModel
    """The LLM's cost model (:class:`~workloads.transformer.TransformerCosts` or synthetic)."""
    encoder: Encoder
    cp: int = 1
    ep: int = 1
    overlap_grad_reduce: bool = False

    @property
    def w_retained_fraction(self) -> float:
        """The LLM's (:mod:`workloads.memory`)."""
        return self.llm.w_retained_fraction

    def op_segments(self, op: Op, split_backward: bool,
                    markers: bool = False) -> tuple[Segment, ...]:
        """An encoder piece's segments, or the LLM op's."""
        if op.kind in (ENCODER_FORWARD, ENCODER_BACKWARD):
            return self.encoder.segments(op)
        return self.llm.op_segments(op, split_backward, markers)

    def activation_bytes_per_mb(self, stage: int) -> float:
        """The LLM stage's stash per micro-batch (encoder pieces: :meth:`encoder_stash_bytes`)."""
        return self.llm.activation_bytes_per_mb(stage)

    def encoder_stash_bytes(self, op: Op) -> float:
        """Activations an encoder piece keeps (:func:`workloads.memory.stash_bytes`)."""
        return self.encoder.stash_bytes(op)

    def transient_bytes(self, op: Op) -> float:
        """The LLM op's working memory (none for encoder ops: a layer's gradients are
        counted in the LLM's, which is larger)."""
        own = getattr(self.llm, "transient_bytes", None)
        if own is None or op.kind in (ENCODER_FORWARD, ENCODER_BACKWARD):
            return 0.0
        return float(own(op))

    def p2p_bytes(self) -> float:
        """The LLM's pipeline message."""
        return self.llm.p2p_bytes()

    def seq_p2p_bytes(self, op: Op) -> float:
        """Messages of encoder ops (:func:`workloads.lowering.opcosts.op_p2p_bytes`)."""
        return self.encoder.message_bytes()

    def feature_p2p_bytes(self) -> float:
        """The features' gradient the LLM's first stage sends each encoder's last stage."""
        return self.encoder.message_bytes()

    def grad_bytes(self, stage: int) -> float:
        """The LLM stage's gradients and the encoder's on the same GPU (bf16)."""
        return (self.llm.grad_bytes(stage)
                + BF16 * self.encoder.params(stage))

    def static_bytes(self, stages: tuple[int, ...]) -> float:
        """Both models' state on a GPU of these stages (stage ``s`` is rank ``s``)."""
        return (self.llm.static_bytes(stages)
                + sum(self.encoder.static_bytes(s) for s in stages))

    def optimizer_segment(self, stages: tuple[int, ...]) -> ComputeSeg | None:
        """The LLM's AdamW update plus the encoder's (28 bytes per parameter, as
        :meth:`~workloads.transformer.TransformerCosts.optimizer_segment`)."""
        own = self.llm.optimizer_segment(stages)
        extra = 28 * sum(self.encoder.optimizer_params(s) for s in stages)
        if not extra:
            return own
        if own is None:
            return ComputeSeg("optimizer", elementwise_bytes=extra)
        return replace(own, elementwise_bytes=own.elementwise_bytes + extra)
