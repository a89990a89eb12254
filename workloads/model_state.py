"""Model state of the transformer cost model: parameters, gradients, ZeRO, optimizer. Pure.

What each GPU holds of the parameters, gradients and optimizer state of its pipeline stages,
and what data parallelism moves of them: the gradient bytes a layer (or the head, or the
embedding) has ready for its reduction, the parameters ZeRO-3 gathers before it, a stage's
gradients for the step-end reduction, and the optimizer's memory-bound update.

Sources:
- Model states: mixed-precision Adam, 16 bytes per parameter, ZeRO-1/2/3 sharding,
  Rajbhandari et al. 2020 sec. 3.1; ZeRO-3's gathered working set, sec. 5.3.
"""

from __future__ import annotations

from workloads.costs import BF16, ComputeSeg, ParamGather, Segment
from workloads.kernels import per_instance_by
from workloads.memory import model_state_bytes_per_param
from workloads.schedules import BACKWARD, FORWARD, WEIGHT_GRAD, Op


class ModelState:
    """Model state of a :class:`~workloads.transformer.TransformerCosts` (a mixin of it):
    the parameters and gradients of its stages and layers on one GPU, the DP units that
    gradient buckets and ZeRO-3 gather and reduce, ZeRO's sharded state and working set, the
    framework's copies around ZeRO-3's collectives, and the optimizer step."""

    @property
    def _layer_params_tp(self) -> float:
        """Parameters of one transformer block on one TP rank (with the experts apart: without
        the experts, which are reduced apart)."""
        m = self.model
        experts = m.layer_expert_params() if self._experts_apart else 0
        return (m.layer_params() - experts) / self.tp

    def _layer_expert_grad_bytes(self) -> float:
        """One layer's expert gradient bytes on one GPU with the experts apart (E/ep experts,
        split over the expert TP degree), else 0."""
        if not self._experts_apart:
            return 0.0
        return BF16 * self.model.layer_expert_params() / self._etp / self.ep

    def _stage_gather(self, stage: int) -> ParamGather:
        """A stage's parameters as one all-gather (``overlap_param_gather`` on every stage but
        the first): Megatron-core buckets the gradients and parameters of pipeline rank 0's
        first model chunk only, every other model chunk is one bucket
        (megatron/core/distributed/distributed_data_parallel.py,
        ``DistributedDataParallel.__init__``: ``bucket_size = None`` when the pipeline rank is
        above 0, and ``disable_bucketing=(model_chunk_idx > 0)`` from
        megatron/training/training.py ``get_model``; core r0.8.0 to main)."""
        layers = self._stage_layers(stage)
        nbytes = sum(self._layer(i)._gather_bytes(stage, i) for i in layers)
        expert = sum(self._layer(i)._layer_expert_grad_bytes() for i in layers)
        if stage == len(self.stage_layers) - 1:
            nbytes += self._head_gather_bytes()
        return ParamGather(f"stage{stage} params", nbytes, expert)

    def _head_gather_bytes(self) -> float:
        """bf16 bytes the head needs gathered: final norm and the h x V output projection
        (the embedding matrix itself when tied), on one TP rank."""
        m = self.model
        return BF16 * (m.norm_params + m.vocab_size * m.hidden_size) / self.tp

    def _gather_bytes(self, stage: int, layer: int) -> float:
        """Forward gather before ``layer``: its parameters (:attr:`_layer_gather_bytes`), with
        the input embedding (and learned positions, bf16) before the first layer of stage 0."""
        extra = self.model.embedding_params() / self.tp if layer == 0 and stage == 0 else 0.0
        return self._layer_gather_bytes + BF16 * extra

    @property
    def _fp8_gathered(self) -> bool:
        """Whether the parameter all-gathers move the layers' linear weights in fp8
        (:attr:`fp8_param_gather` under ``precision: fp8`` and ZeRO-3 over several shards,
        a dense model)."""
        return (self.fp8_param_gather and self.precision == "fp8" and self.zero_stage == 3
                and self._shards > 1 and self.model.moe is None and self.model.mla is None)

    @property
    def _layer_gather_bytes(self) -> float:
        """Bytes of one layer's parameters as ZeRO-3 gathers them on one TP rank: bf16, or
        with :attr:`_fp8_gathered` the attention and MLP weights in fp8 (1 byte) and the
        norms in bf16 (torchao's ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``
        casts only the Float8Linear weights)."""
        if not self._fp8_gathered:
            return BF16 * self._layer_params_tp
        m = self.model
        linear = (m.attention_params() + m.mlp_params()) / self.tp
        return linear + BF16 * (self._layer_params_tp - linear)

    def _head_grad_bytes(self, stage: int) -> float:
        """Gradient bytes of the last stage beyond its layers and embedding: final norm,
        output projection, and the embedding copy a pipelined last stage keeps
        (:attr:`_last_stage_embedding`)."""
        m, t = self.model, self.tp
        n = m.head_params() / t
        if self._last_stage_embedding:
            n += m.vocab_size * m.hidden_size / t
        return self.grad_reduce_bytes * n

    @property
    def _last_stage_embedding(self) -> bool:
        """Whether a pipelined last stage keeps a copy of the input embedding: tied to its
        output head, or read by its multi-token prediction modules (Megatron-core builds the
        embedding on the stage that runs them, core_v0.14.0 megatron/core/models/gpt/
        gpt_model.py ``GPTModel.__init__``: ``if self.pre_process or self.mtp_process``, its
        gradient shared with stage 0's as a tied embedding's)."""
        return len(self.stage_layers) > 1 and (self.model.tied_embeddings
                                               or self.model.mtp_layers > 0)

    def _layer_grad_bytes(self, stage: int, layer: int) -> float:
        """Gradient bytes ready after ``layer``'s backward; the first layer of stage 0 also
        carries the embedding's (its backward is a scatter-add, not timed);
        :attr:`grad_reduce_bytes` per element."""
        extra = self.model.embedding_params() / self.tp if layer == 0 and stage == 0 else 0.0
        return self.grad_reduce_bytes * (self._layer_params_tp + extra)

    def zero3_working_bytes(self, op: Op) -> float:
        """Gathered ZeRO-3 state an op holds while it runs, on one TP rank (bf16).

        Parameters are gathered one unit (layer, embedding, head) ahead of use
        and freed after it (Rajbhandari et al. 2020, sec. 5.3), so at most two
        consecutive units are whole at once: F and B hold the largest sum of two
        consecutive gather units; B and W also hold one unit's whole gradient
        until its reduce-scatter (the largest). Uniform layers, no embedding or
        head on the stage: F = 2·P, B = 3·P, W = P with P = 2·layer_params/t.
        The backward gathers no embedding (its gradient is a scatter-add). None
        without DP (nothing is sharded).
        """
        if self.zero_stage != 3 or self._shards == 1 or op.kind not in (FORWARD, BACKWARD,
                                                                    WEIGHT_GRAD):
            return 0.0
        if self._unsharded_stages:
            return 0.0
        last = op.stage == len(self.stage_layers) - 1
        layers = self._stage_layers(op.stage)
        # ep > 1: this GPU's experts, gathered apart
        each = [self._layer(i) for i in layers]
        grads = [c._layer_grad_bytes(op.stage, i) + c._layer_expert_grad_bytes()
                 for c, i in zip(each, layers, strict=True)]
        if last:
            grads.append(self._head_grad_bytes(op.stage))
        if op.kind == WEIGHT_GRAD:
            return max(grads)
        units = [(c._gather_bytes(op.stage, i) if op.kind == FORWARD
                  else c._layer_gather_bytes) + c._layer_expert_grad_bytes()
                 for c, i in zip(each, layers, strict=True)]
        if last:
            units.append(self._head_gather_bytes())
        pairs = max((a + b for a, b in zip(units, units[1:], strict=False)), default=units[0])
        return pairs + (max(grads) if op.kind == BACKWARD else 0.0)

    def unreduced_grad_bytes(self, op: Op) -> float:
        """With :attr:`reduces_every_microbatch`: what a backward (B or W) holds of its
        gradients before they are reduce-scattered, on one TP rank: the largest unit's (a
        layer's; the head's on the last stage; an embedding-only first stage's embedding),
        whole in the reduction dtype, as :meth:`zero3_working_bytes` counts it under ZeRO-3;
        else 0."""
        if not self.reduces_every_microbatch or op.kind not in (BACKWARD, WEIGHT_GRAD):
            return 0.0
        layers = self._stage_layers(op.stage)
        grads = [self._layer(i)._layer_grad_bytes(op.stage, i)
                 + self._layer(i)._layer_expert_grad_bytes() for i in layers]
        if op.stage == len(self.stage_layers) - 1:
            grads.append(self._head_grad_bytes(op.stage))
        if op.stage == 0 and not layers:
            grads.append(self.grad_reduce_bytes * self.model.embedding_params() / self.tp)
        return max(grads, default=0.0)

    def _zero3_copies(self, name: str, backward: bool, marked: bool = False) -> list[Segment]:
        """The framework's own memory-bound kernels around a layer's ZeRO-3 collectives
        (:attr:`zero3_gather_copy_bytes` per gathered parameter, forward and backward, and
        :attr:`zero3_reduce_copy_bytes` per parameter before the reduce-scatter, backward),
        as one compute segment; none without ZeRO-3 over more than one shard. A ZeRO-2 that
        reduces every micro-batch has its backward's compute slowed by the layer's
        reduce-scatter beside it (:attr:`zero3_overlap_s`), and no copies of its own.

        With :attr:`zero3_once_per_step` only the ops that gather or reduce have them
        (``marked``: a stage's first forward, its gather's copy-out and contention; its final
        backward, the reduce-scatter's copy-in, with no contention: the reduce-scatters follow
        the backward's compute, :meth:`op_segments`); the other ops none. That copy-in
        (``foreach_reduce_scatter_copy_in``) then reads the gradient accumulated in the reduce
        dtype (:attr:`unsharded_grad_accum_bytes`), not the bf16 one: :attr:`grad_reduce_bytes`
        - 2 bytes more than :attr:`zero3_reduce_copy_bytes` (8 in fp32, not 6)."""
        if self.zero_stage != 3 or self._shards == 1:
            contention = self.zero3_overlap_s[1] if backward else 0.0
            if self.reduces_every_microbatch and contention:
                return [ComputeSeg(f"{name} dp overlap", duration_s=contention)]
            return []
        once = self._unsharded_stages
        if once and not marked:
            return []
        segs: list[Segment] = []
        gather_copy = 0.0 if once and backward else self.zero3_gather_copy_bytes
        reduce_copy = self.zero3_reduce_copy_bytes
        if once and reduce_copy:  # the copy-in reads the accumulated gradient, reduce dtype
            reduce_copy += self.grad_reduce_bytes - BF16
        per_param = gather_copy + (reduce_copy if backward else 0.0)
        if per_param:
            params = self._layer_params_tp + (self.model.layer_expert_params() / self._etp
                                              / self.ep if self._experts_apart else 0.0)
            nbytes = per_param * params
            if self._fp8_gathered:  # the copy-out of fp8 weights moves half a bf16 one's bytes
                nbytes -= (gather_copy
                           * (1.0 - self._layer_gather_bytes / (BF16 * self._layer_params_tp))
                           * self._layer_params_tp)
            segs.append(ComputeSeg(f"{name} zero3 copies", elementwise_bytes=nbytes))
        contention = 0.0 if once and backward else self.zero3_overlap_s[1 if backward else 0]
        if contention:
            segs.append(ComputeSeg(f"{name} zero3 overlap", duration_s=contention))
        return segs

    def _bucketed(self, stage: int) -> bool:
        """Whether ``stage``'s last backward reduces its gradients bucket by bucket beside its
        layers (``overlap_grad_reduce`` under ZeRO < 3 on a stage cut into buckets:
        every stage, or stage 0 alone with :attr:`grad_buckets_stage0_only`)."""
        return (self.overlap_grad_reduce and self.zero_stage != 3
                and not self.reduces_every_microbatch
                and (stage == 0 or not self.grad_buckets_stage0_only))

    def _dp_overlap(self, name: str, backward: bool) -> list[Segment]:
        """The compute a layer loses to Megatron's overlapped DP collective beside it
        (:attr:`dp_overlap_s`), as one fixed-time compute segment; none where it is 0."""
        contention = self.dp_overlap_s[1 if backward else 0]
        return [ComputeSeg(f"{name} dp overlap", duration_s=contention)] if contention else []

    def zero3_layer_work(self) -> tuple[list[Segment], list[Segment], float, float]:
        """One transformer layer under ZeRO-3, for :mod:`sim.fsdpoverlap`: its forward and
        backward segments (the first layer of the first stage that holds one, backward with its
        weight gradients and recomputation) and the bytes of the all-gather of its bf16
        parameters and of the reduce-scatter of its gradients (whole buffers, as
        :class:`ParamGather` and :class:`GradReady` carry them, without the embedding the first
        layer adds)."""
        first = next(layers for s in range(len(self.stage_layers))
                     if (layers := self._stage_layers(s)))  # stage 0 may hold none
        c = self._layer(first[0])
        params = c._layer_params_tp
        return (c._layer_forward("L"), c._layer_backward("L", weight_grad_deferred=False),
                c._layer_gather_bytes, self.grad_reduce_bytes * params)

    @per_instance_by
    def stage_expert_params(self, stage: int) -> float:
        """Expert parameters of a stage on one GPU: its E/ep experts of each layer, split over
        the expert TP degree."""
        experts = sum(n * c.model.layer_expert_params() for c, n in self._runs(stage))
        return experts / self._etp / self.ep

    @per_instance_by
    def stage_params(self, stage: int) -> float:
        """Parameters of a stage held by one GPU (a TP rank; its own experts)."""
        m, t = self.model, self.tp
        dense = sum(k * (c.model.layer_params() - c.model.layer_expert_params())
                    for c, k in self._runs(stage))
        n = dense / t + self.stage_expert_params(stage)
        if stage == 0:
            n += m.embedding_params() / t
        if stage == len(self.stage_layers) - 1:
            n += m.head_params() / t
            if self._last_stage_embedding:
                n += m.vocab_size * m.hidden_size / t
        return n

    def grad_bytes(self, stage: int) -> float:
        """Gradient bytes of a stage reduced across DP, :attr:`dp_wire_bytes` per element
        (bf16 by default); with ep > 1 the experts' are reduced apart
        (:meth:`expert_grad_bytes`)."""
        experts = self.stage_expert_params(stage) if self._experts_apart else 0.0
        return self.dp_wire_bytes * (self.stage_params(stage) - experts)

    def expert_grad_bytes(self, stage: int) -> float:
        """Expert gradient bytes of a stage, reduced over the expert-data-parallel group
        (the GPUs holding the same expert shards, :attr:`_expert_shards`); 0 unless the
        experts are apart."""
        return BF16 * self.stage_expert_params(stage) if self._experts_apart else 0.0

    def tied_grad_bytes(self) -> float:
        """Bytes one GPU all-reduces for the tied embedding between the first and last
        pipeline stage (its V x h / t gradient at :attr:`tied_grad_reduce_bytes` an
        element); 0 for untied embeddings or one stage."""
        m = self.model
        if not m.tied_embeddings or len(self.stage_layers) == 1:
            return 0.0
        return self.tied_grad_reduce_bytes * m.vocab_size * m.hidden_size / self.tp

    def bytes_per_param(self, shards: int | None = None) -> float:
        """Model-state bytes per parameter, mixed-precision Adam under ZeRO (Rajbhandari 2020).

        :func:`workloads.memory.model_state_bytes_per_param` over d = dp·cp replicas.
        """
        return model_state_bytes_per_param(self.zero_stage,
                                           self._shards if shards is None else shards,
                                           self.grad_buffer_bytes)

    @property
    def zero3_once_per_step(self) -> bool:
        """Whether the lowering gathers each stage's parameters once a step (its first
        forward) and reduce-scatters its gradients once (after its final backward), not per
        op: :attr:`zero3_unsharded_under_pp` in effect (:attr:`_unsharded_stages`)."""
        return self._unsharded_stages

    @property
    def unsharded_grad_accum_bytes(self) -> float:
        """Bytes a parameter a backward moves to accumulate its gradient unsharded under
        :attr:`zero3_once_per_step`: FSDP2's post-backward without gradient sync
        (torch/distributed/_composable/fsdp/_fsdp_param_group.py ``post_backward``:
        ``accumulate_unsharded_grad_if_needed``, then ``to_accumulated_grad_if_needed``, at
        torch 1963fc8) adds the backward's bf16 gradient into the one kept in the reduce
        dtype, ``unsharded_accumulated_grad += grad``: read 2 and :attr:`grad_reduce_bytes`,
        write :attr:`grad_reduce_bytes` (10 in fp32; a bf16 reduce dtype leaves it to
        autograd's own ``.grad`` accumulation, the same 2 + 2 + 2). The step's first
        micro-batch only casts (2 + 4); counted as the others."""
        return BF16 + 2.0 * self.grad_reduce_bytes

    @property
    def _unsharded_stages(self) -> bool:
        """Whether the stages' parameters and gradients are held whole through the step
        (:attr:`zero3_unsharded_under_pp`, with ZeRO-3 over several shards and PP)."""
        return (self.zero3_unsharded_under_pp and self.zero_stage == 3 and self._shards > 1
                and len(self.stage_layers) > 1)

    @per_instance_by
    def static_bytes(self, stages: tuple[int, ...]) -> float:
        """Model state: ZeRO shards dense state over dp·cp and, with the experts apart, expert
        state over the GPUs that hold the same expert shards (:attr:`_expert_shards`); with
        :attr:`zero3_unsharded_under_pp`, the stages' whole parameters (as gathered,
        :attr:`_layer_gather_bytes`) and gradients too; with :attr:`kept_grad_copy_bytes`,
        the optimizer's kept gradient copy of its shard."""
        expert = sum(self.expert_grad_bytes(s) for s in stages) / BF16
        dense = sum(self.stage_params(s) for s in stages) - expert
        whole = ((BF16 + self.grad_reduce_bytes) * (dense + expert)
                 if self._unsharded_stages else 0.0)
        if whole and self._fp8_gathered:  # the layers' linear weights held gathered in fp8
            layers = sum(len(self._stage_layers(s)) for s in stages)
            whole -= layers * (BF16 * self._layer_params_tp - self._layer_gather_bytes)
        kept = self.kept_grad_copy_bytes
        if kept:  # the optimizer's kept gradient copy, of the parameters it updates
            kept *= self._optimizer_params(dense, expert)
        return (self.bytes_per_param() * dense
                + self.bytes_per_param(self._expert_shards) * expert + whole + kept)

    @per_instance_by
    def optimizer_segment(self, stages: tuple[int, ...]) -> ComputeSeg | None:
        """AdamW update, memory-bound: per parameter it reads the gradient (2 B), the
        fp32 master weight, m and v (12 B), and writes master, m, v and the bf16 weight
        (14 B): 28 bytes (:attr:`optimizer_bytes`, a framework's own where its profile says).
        With FP8 weights cast once a step (:attr:`fp8_weight_casts` ``step``), the casts of
        the stages' transformer-block weights (:meth:`stage_fp8_weight_cast_bytes`) are
        timed with it: they run at each model chunk's first forward of the step, once a
        step on every GPU as the update does.
        """
        expert = sum(self.expert_grad_bytes(s) for s in stages) / BF16
        n = self._optimizer_params(sum(self.stage_params(s) for s in stages) - expert, expert)
        casts = sum(self.stage_fp8_weight_cast_bytes(s) for s in stages)
        return ComputeSeg("optimizer", elementwise_bytes=self.optimizer_bytes * n + casts)

    def _optimizer_params(self, dense: float, expert: float) -> float:
        """The parameters one GPU's optimizer step updates, of ``dense`` dense and ``expert``
        expert parameters on it: its ZeRO shard of each (over :attr:`_shards` and
        :attr:`_expert_shards`), or all of them without ZeRO."""
        if self.zero_stage >= 1:
            return dense / self._shards + expert / self._expert_shards
        return dense + expert

    def stage_fp8_weight_cast_bytes(self, stage: int) -> float:
        """HBM bytes one GPU's FP8 weight casts of a stage move once a step (every layer's
        :meth:`fp8_weight_cast_bytes` ``step``, both blocks); 0 unless
        :attr:`fp8_weight_casts` is ``step`` under ``precision: fp8``."""
        return sum(k * sum(c.fp8_weight_cast_bytes("step")) for c, k in self._runs(stage))
