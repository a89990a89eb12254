"""A pipeline op of the transformer cost model: a stage's layers, its segments. Pure.

Turns one pipeline op (F, B or W of a stage, or of one Seq1F1B sequence chunk) into the
work its GPUs do, layer by layer, from the per-layer work of :mod:`workloads.transformer`.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from math import copysign
from typing import TYPE_CHECKING

from workloads.costs import (
    BF16,
    CommSeg,
    ComputeSeg,
    GradReady,
    ParamGather,
    Segment,
    fuse_alike,
    fuse_compute,
)
from workloads.kernels import scaled
from workloads.schedules import BACKWARD, FORWARD, WEIGHT_GRAD, Op
from workloads.seqchunks import WHOLE_WINDOW, bounds_of

if TYPE_CHECKING:
    from workloads.transformer import TransformerCosts


PLACEHOLDER = "\x00layer\x00"
"""The name a layer's template segments are built with (:meth:`StageOps._layer_segments`):
a string no label holds otherwise."""


def _template(segs: list[Segment]) -> tuple[tuple[Segment, tuple[str, ...] | None], ...] | bool:
    """``segs`` (built with the name :data:`PLACEHOLDER`) as a template: each segment with its
    label cut at the placeholder (None where the label does not hold it); False where the
    placeholder shows anywhere else (a field but the label, or a segment that is not a
    frozen slotted dataclass): then each layer is built by name."""
    out = []
    for seg in segs:
        names = getattr(type(seg), "__slots__", None)
        if names is None or not all(hasattr(seg, f) for f in names):
            return False
        if any(_holds(getattr(seg, f)) for f in names if f != "label"):
            return False
        label = seg.label
        out.append((seg, tuple(label.split(PLACEHOLDER)) if PLACEHOLDER in label else None))
    return tuple(out)


def _holds(value: object) -> bool:
    """Whether :data:`PLACEHOLDER` shows in ``value``: a string, or inside a tuple, list or
    dataclass (a segment's parts)."""
    if isinstance(value, str):
        return PLACEHOLDER in value
    if isinstance(value, tuple | list):
        return any(map(_holds, value))
    if is_dataclass(value):
        return any(_holds(getattr(value, f.name)) for f in fields(value))
    return False


def _named(template: tuple[tuple[Segment, tuple[str, ...] | None], ...], name: str
           ) -> list[Segment]:
    """A layer's segments from its template (:func:`_template`): each segment whose label
    held the placeholder copied, field for field, with ``name`` in its place; the others
    as they are (segments are immutable)."""
    out: list[Segment] = []
    new, setattr_ = object.__new__, object.__setattr__
    for seg, parts in template:
        if parts is None:
            out.append(seg)
            continue
        cls = type(seg)
        copy = new(cls)
        for f in cls.__slots__:
            setattr_(copy, f, getattr(seg, f))
        setattr_(copy, "label", name.join(parts))
        out.append(copy)
    return out


class StageOps:
    """A pipeline op's work under a :class:`~workloads.transformer.TransformerCosts` (a
    mixin of it): a stage's layers and their runs of alike layers, which of them recompute,
    an op's segments in execution order (with the DP markers the lowering turns into
    collectives), the messages between stages, and Seq1F1B's sequence chunks."""

    def _stage_layers(self, stage: int) -> range:
        start = sum(self.stage_layers[:stage])
        return range(start, start + self.stage_layers[stage])

    def _recomputed(self, layer: int) -> bool:
        """Whether ``recompute`` applies to transformer block ``layer``: it is among the first
        :attr:`recompute_num_layers` of its stage (all of them when that is None), or it is
        every :attr:`recompute_every_k_layers`-th layer of the model."""
        if self.recompute_every_k_layers is not None:
            return (layer + 1) % self.recompute_every_k_layers == 0
        if self.recompute_num_layers is None:
            return True
        start = 0
        for n in self.stage_layers:
            if layer < start + n:
                return layer - start < self.recompute_num_layers
            start += n
        return False

    def _layer(self, layer: int) -> TransformerCosts:
        """The costs of transformer block ``layer``: ``self`` unless the model's first layers
        are dense (:meth:`workloads.models.ModelSpec.layer_spec`) or only some layers are
        recomputed (:attr:`recompute_num_layers`; the block's costs then say whether it is)."""
        c = self
        if self.model.first_dense_layers:
            c = replace(c, model=self.model.layer_spec(layer))
        if self.recompute_num_layers is not None or self.recompute_every_k_layers is not None:
            c = replace(c, recompute_num_layers=None, recompute_every_k_layers=None,
                        recompute=self.recompute if self._recomputed(layer) else "none")
        return c

    def _runs(self, stage: int) -> list[tuple[TransformerCosts, int]]:
        """A stage's layers as ``(costs, count)`` runs of alike layers (one for a uniform
        model, and one of count 0 for a stage without layers, as ``ends-as-layers`` splits
        allow), in stage order of their first layer."""
        if self._uniform_layers() or not self.stage_layers[stage]:  # (an end stage of no layer)
            return [(self, self.stage_layers[stage])]
        k = self.model.first_dense_layers
        first: dict[tuple[bool, bool], int] = {}
        count: dict[tuple[bool, bool], int] = {}
        for i in self._stage_layers(stage):
            kind = (i < k, self._recomputed(i))
            first.setdefault(kind, i)
            count[kind] = count.get(kind, 0) + 1
        return [(self._layer(first[kind]), count[kind]) for kind in first]

    def stage_dense_layers(self, stage: int) -> int:
        """How many of a stage's layers are a MoE model's dense first layers (0 for a uniform
        model): with the stage's layer count, what its ops' work depends on (search caches)."""
        k = self.model.first_dense_layers
        return sum(1 for i in self._stage_layers(stage) if i < k) if k else 0

    def op_segments(self, op: Op, split_backward: bool,
                    markers: bool = False) -> tuple[Segment, ...]:
        """The op's compute and TP collectives, in execution order, on one TP rank.

        With ``markers`` the list also holds :class:`~workloads.costs.GradReady`
        after each layer's weight gradients (and the head's, and the
        embedding's at the end of stage 0's backward) and, under ZeRO-3,
        :class:`~workloads.costs.ParamGather` before each layer's forward and
        input-gradient compute (with :attr:`overlap_param_gather`, before each layer's
        forward only: the lowering marks a stage's first forward of the step). The
        lowering turns them into DP collectives;
        without markers (the default) the list is the same work, fused.
        A Seq1F1B sequence chunk (``op.seq >= 0``) costs its chunk's work (:meth:`seq_chunk`).
        Worked out once per arguments and kept on the instance, like
        :func:`workloads.kernels.per_instance` (a frozen cost model never changes; the
        segments are immutable); an interned cost model
        (:func:`workloads.transformer.interned`) keeps them for the next experiment with the
        same costs (a sweep's, a search's, a repeated run).
        """
        memo = self.__dict__.setdefault("_memo_op_segments", {})
        key = (op, split_backward, markers)
        segs = memo.get(key)
        if segs is None:
            segs = memo[key] = self._op_segments(op, split_backward, markers)
        return segs

    def op_work(self, op: Op, split_backward: bool, markers: bool = False
                ) -> tuple[Segment, ...]:
        """:meth:`op_segments` with its layers' segments unnamed (empty labels): the same
        segments, field for field, but their labels, built from one layer's segments per
        cost model instead of one per layer (what the search's bounds read: the work and
        the collectives, not the names; and, with ``markers``, what the budget counts,
        :func:`sim.budget.estimate`; a test checks the equality). Kept on the instance like
        :meth:`op_segments`."""
        memo = self.__dict__.setdefault("_memo_op_segments", {})
        key = (op, split_backward, "work", markers)
        segs = memo.get(key)
        if segs is None:
            segs = memo[key] = self._op_segments(op, split_backward, markers, labels=False)
        return segs

    def _layer_segments(self, layer: int, backward: bool, deferred: bool, labels: bool,
                        marked: bool = False) -> list[Segment] | tuple[Segment, ...]:
        """Transformer block ``layer``'s segments in an op (with markers: between them): its
        forward (or backward) and its ZeRO-3 copies (``marked``: the op's markers are in, which
        decides them under :attr:`zero3_once_per_step`, :meth:`_zero3_copies`); unnamed
        (``labels`` false) they are the same for every layer of one cost model
        (:meth:`_layer`), so worked out once and kept on it."""
        c = self._layer(layer)
        if labels:
            named = c.__dict__.setdefault("_memo_layer_named", {})
            key = (backward, deferred, marked)
            template = named.get(key)
            if template is None:
                template = named[key] = _template(c._named_layer(PLACEHOLDER, backward,
                                                                 deferred, marked))
            if template is False:
                return c._named_layer(f"L{layer}", backward, deferred, marked)
            return _named(template, f"L{layer}")
        memo = c.__dict__.setdefault("_memo_layer_work", {})
        key = (backward, deferred, marked)
        segs = memo.get(key)
        if segs is None:
            segs = memo[key] = tuple(
                (c._layer_backward("", weight_grad_deferred=deferred) if backward
                 else c._layer_forward("")) + c._zero3_copies("", backward=backward,
                                                              marked=marked))
        return segs

    def _named_layer(self, name: str, backward: bool, deferred: bool, marked: bool
                     ) -> list[Segment]:
        """A layer's segments named ``name`` (the reference :meth:`_layer_segments`' template
        stands for: ``name`` a placeholder, put in each label's place by :func:`_named`)."""
        return ((self._layer_backward(name, weight_grad_deferred=deferred) if backward
                 else self._layer_forward(name))
                + self._zero3_copies(name, backward=backward, marked=marked))

    def _partition_gathers(self, op: Op, last: bool) -> list[Segment]:
        """The TP all-gathers of partitioned pipeline messages an op starts with
        (:attr:`pp_partition_gathers`, t > 1): a forward after the first stage gathers its
        input; a backward before the last stage gathers the received gradient and restores
        its own output for autograd (b·s·h bf16 elements each, the whole tensor)."""
        if not self.pp_partition_gathers or self.tp == 1:
            return []
        nbytes = BF16 * self._bsh
        if op.kind == FORWARD and op.stage > 0:
            return [CommSeg("pipe input all-gather", "tp", "all_gather", nbytes)]
        if op.kind == BACKWARD and not last:
            return [CommSeg("pipe output all-gather", "tp", "all_gather", nbytes),
                    CommSeg("pipe grad all-gather", "tp", "all_gather", nbytes)]
        return []

    def _op_segments(self, op: Op, split_backward: bool, markers: bool, labels: bool = True,
                     reference: bool = False) -> tuple[Segment, ...]:
        """:meth:`op_segments`, worked out (``labels`` false, without markers:
        :meth:`op_work`). Unnamed on a uniform model (:meth:`_uniform_layers`), a stage's
        layers are one layer's segments over again, put in at once; ``reference``: layer by
        layer (the same segments, the same objects; ``tests/test_op_work_uniform.py``)."""
        if op.seq >= 0 and self.seq_chunks > 1:
            chunk = self.seq_chunk(op.seq)
            return (chunk.op_segments(op, split_backward, markers) if labels
                    else chunk.op_work(op, split_backward, markers))
        last = op.stage == len(self.stage_layers) - 1
        layers = self._stage_layers(op.stage)
        once = self._unsharded_stages  # gathers in a first forward, reduces after the final op
        gather = markers and ((self.zero_stage == 3 and (not once or op.kind == FORWARD))
                              or (self.overlap_param_gather and op.kind == FORWARD))
        segs: list[Segment] = self._partition_gathers(op, last)
        if gather and self.zero_stage != 3 and op.stage > 0:
            # overlap_param_gather beyond stage 0: one bucket, gathered whole before the op
            segs.append(self._stage_gather(op.stage))
            gather = False
        uniform = not (labels or reference or not layers) and self._uniform_layers()
        if op.kind == FORWARD and not markers:
            if uniform:
                segs += self._layer_segments(layers[0], False, False, False) * len(layers)
            else:
                for layer in layers:
                    segs += self._layer_segments(layer, False, False, labels)
            if last:
                segs += self._head_segments(backward=False)
        elif op.kind == FORWARD and uniform and not gather:
            segs += self._layer_segments(layers[0], False, False, False, marked=True) * len(layers)
            if last:
                segs += self._head_segments(backward=False)
        elif op.kind == FORWARD:
            for layer in layers:
                c = self._layer(layer)
                if gather:
                    segs.append(ParamGather(f"L{layer} params",
                                            c._gather_bytes(op.stage, layer),
                                            c._layer_expert_grad_bytes()))
                segs += self._layer_segments(layer, False, False, labels, marked=True)
                if gather:
                    segs += c._dp_overlap(f"L{layer}", backward=False)
            if last:
                if gather:
                    segs.append(ParamGather("head params", self._head_gather_bytes()))
                segs += self._head_segments(backward=False)
        elif op.kind == BACKWARD:
            ready = markers and not split_backward
            if last:
                if gather:
                    segs.append(ParamGather("head params", self._head_gather_bytes()))
                segs += self._head_segments(backward=True, weight_grad_deferred=split_backward)
                if ready:
                    segs.append(GradReady("head grads", self._head_grad_bytes(op.stage)))
            if uniform and not markers:
                segs += self._layer_segments(layers[0], True, split_backward, False) * len(layers)
            elif uniform and not gather and not (ready and self._bucketed(op.stage)):
                segs += self._uniform_backward(op.stage, layers, split_backward, ready)
            else:
                segs += self._layers_backward(op, layers, split_backward, markers, labels,
                                              gather, ready)
        elif markers:
            segs += self._weight_grads_marked(op.stage, layers, last)
        else:
            for c, k in self._runs(op.stage):
                attn, mlp = c._gemms()
                segs += [scaled(attn, "weight grads", k), scaled(mlp, "weight grads", k)]
            if last:
                segs.append(scaled(self._head(backward=False), "weight grads", 1,
                                    elementwise_bytes=0.0))
        if self.fp8_amax_reduce_s and op.kind in (FORWARD, BACKWARD):
            segs.append(self._amax_reduce(op))
        if self.grad_accum_bytes and op.kind == (WEIGHT_GRAD if split_backward else BACKWARD):
            segs.append(ComputeSeg("grad accumulation", elementwise_bytes=self.grad_accum_bytes
                                   * self.stage_params(op.stage)))
        if once and op.kind == (WEIGHT_GRAD if split_backward else BACKWARD):
            segs.append(ComputeSeg("unsharded grad accumulation",
                                   elementwise_bytes=self.unsharded_grad_accum_bytes
                                   * self.stage_params(op.stage)))
        embed = ([ComputeSeg("embedding grad", elementwise_bytes=self.embedding_grad_bytes
                             * self.model.embedding_params() / self.tp)]
                 if self.embedding_grad_bytes and op.stage == 0
                 and op.kind == (WEIGHT_GRAD if split_backward else BACKWARD) else [])
        if not segs:  # a first stage of the embedding alone: its lookup is not timed
            segs.append(ComputeSeg(str(op)))
            segs += embed
            if markers and op.stage == 0 and op.kind == (WEIGHT_GRAD if split_backward
                                                         else BACKWARD):
                segs.append(GradReady("embedding grads", self.grad_reduce_bytes
                                      * self.model.embedding_params() / self.tp))
        elif embed:  # before the last GradReady (L0's holds the embedding's gradient)
            ready_at = [i for i, seg in enumerate(segs) if isinstance(seg, GradReady)]
            at = ready_at[-1] if ready_at else len(segs)
            segs[at:at] = embed
        if op.stage == 0 and op.kind in (FORWARD, BACKWARD):
            self._place_embedding_tp(segs, op.kind == BACKWARD, embed)
        if once and markers:
            # the final backward runs without gradient sync like the others; then FSDP's
            # post-backward of each unit reduce-scatters: every GradReady after the compute
            # (torch/distributed/pipelining/stage.py backward_maybe_with_nosync,
            # run_post_backward after the last backward)
            segs = ([seg for seg in segs if not isinstance(seg, GradReady)]
                    + [seg for seg in segs if isinstance(seg, GradReady)])
        if not labels:  # the same layer segments (and markers) in every middle stage
            return tuple(fuse_alike(segs, str(op),
                                    self.__dict__.setdefault("_memo_fused", {})))
        return tuple(fuse_compute(segs, str(op)))

    def _uniform_layers(self) -> bool:
        """Whether every transformer block has this cost model's costs (:meth:`_layer` is
        ``self``): no dense first layers, every layer recomputed alike."""
        return not (self.model.first_dense_layers or self.recompute_num_layers is not None
                    or self.recompute_every_k_layers is not None)

    def _uniform_backward(self, stage: int, layers: range, split_backward: bool, ready: bool
                          ) -> list[Segment]:
        """:meth:`_layers_backward` with markers, unnamed, on a uniform model
        (:meth:`_uniform_layers`), without ZeRO-3 gathers or buckets beside the layers: one
        layer's segments per layer and, where gradients are ready, its :class:`GradReady`,
        one object per bytes (:meth:`_grad_ready`) asked once per distinct layer gradient
        (:meth:`_layer_grad_bytes` reads the layer only to add the embedding's to stage 0's
        first: every other layer's bytes are the same float)."""
        block = self._layer_segments(layers[0], True, split_backward, False, marked=True)
        if not ready:
            return list(block * len(layers))
        expert = self._layer_expert_grad_bytes()
        segs: list[Segment] = []
        common = None
        for layer in reversed(layers):
            segs += block
            if layer == 0 and stage == 0:
                segs.append(self._grad_ready("", self._layer_grad_bytes(stage, layer), expert))
                continue
            if common is None:
                common = self._grad_ready("", self._layer_grad_bytes(stage, layer), expert)
            segs.append(common)
        return segs

    def _layers_backward(self, op: Op, layers: range, split_backward: bool, markers: bool,
                         labels: bool, gather: bool, ready: bool) -> list[Segment]:
        """A backward op's layers' segments, layer by layer, last layer first (with markers:
        ZeRO-3 gathers, the layers' DP overlap and their :class:`GradReady`)."""
        segs: list[Segment] = []
        for layer in reversed(layers):
            if not markers:
                segs += self._layer_segments(layer, True, split_backward, labels)
                continue
            c = self._layer(layer)
            if gather:
                segs.append(ParamGather(f"L{layer} params", c._layer_gather_bytes,
                                        c._layer_expert_grad_bytes()))
            segs += self._layer_segments(layer, True, split_backward, labels, marked=True)
            if ready and self._bucketed(op.stage):
                segs += c._dp_overlap(f"L{layer}", backward=True)
            if ready:
                segs.append(self._grad_ready(f"L{layer} grads" if labels else "",
                                             c._layer_grad_bytes(op.stage, layer),
                                             c._layer_expert_grad_bytes()))
        return segs

    def _grad_ready(self, label: str, nbytes: float, expert: float) -> GradReady:
        """A layer's :class:`~workloads.costs.GradReady`; unnamed (``label`` empty: an op's
        unnamed segments, :meth:`op_work`) one object per bytes on this cost model (the sign
        of a zero told apart), so that the middle stages' marked ops are the same segments
        over again (:func:`~workloads.costs.fuse_alike`)."""
        if label:
            return GradReady(label, nbytes, expert)
        memo = self.__dict__.setdefault("_memo_grad_ready", {})
        key = (nbytes, copysign(1.0, nbytes), expert, copysign(1.0, expert))
        found = memo.get(key)
        if found is None:
            found = memo[key] = GradReady("", nbytes, expert)
        return found

    def _head_segments(self, backward: bool, weight_grad_deferred: bool = False
                       ) -> list[Segment]:
        """The head's compute (:meth:`_head`) between its TP collectives (:meth:`_head_tp`)."""
        before, after = self._head_tp(backward, weight_grad_deferred)
        return [*before, self._head(backward, weight_grad_deferred), *after]

    def _place_embedding_tp(self, segs: list[Segment], backward: bool,
                            embed: list[Segment]) -> None:
        """Put the input embedding's TP collectives (:meth:`_embedding_tp`) into stage 0's
        forward or backward ``segs``: the forward's first, after the ZeRO-3 gather of the
        first layer's parameters that holds the embedding's; the backward's after the
        layers' input gradients, before the embedding's gradient work (``embed``, when in
        this op) and the last :class:`~workloads.costs.GradReady` (the one holding the
        embedding's gradient)."""
        tp_segs = self._embedding_tp(backward)
        if not tp_segs:
            return
        if not backward:
            at = 1 if segs and isinstance(segs[0], ParamGather) else 0
        elif embed and any(seg is embed[0] for seg in segs):
            at = next(i for i, seg in enumerate(segs) if seg is embed[0])
        else:
            ready_at = [i for i, seg in enumerate(segs) if isinstance(seg, GradReady)]
            at = ready_at[-1] if ready_at else len(segs)
        segs[at:at] = tp_segs

    def _amax_reduce(self, op: Op) -> CommSeg:
        """FP8 delayed scaling's amax all-reduce at the end of a chunk's forward (at
        ``fp8_autocast`` exit) or backward (after its first module's backward), with its
        fixed time (:attr:`fp8_amax_reduce_s`): 3 float32 amaxes a GEMM forward (input,
        weight, output), 2 backward, four GEMMs a layer."""
        backward = op.kind == BACKWARD
        nbytes = 4.0 * (2 if backward else 3) * 4 * len(self._stage_layers(op.stage))
        return CommSeg("fp8 amax all-reduce", "tp", "all_reduce", nbytes,
                       duration_s=self.fp8_amax_reduce_s[op.stage][1 if backward else 0])

    def _weight_grads_marked(self, stage: int, layers: range, last: bool) -> list[Segment]:
        """A zero-bubble W op layer by layer (head first, then the layers in backward order),
        each followed by its :class:`~workloads.costs.GradReady`."""
        segs: list[Segment] = []
        if last:
            segs += [scaled(self._head(backward=False), "weight grads", 1,
                             elementwise_bytes=0.0),
                     GradReady("head grads", self._head_grad_bytes(stage))]
        for layer in reversed(layers):
            c = self._layer(layer)
            attn, mlp = c._gemms()
            segs += [scaled(attn, "weight grads", 1), scaled(mlp, "weight grads", 1)]
            if self._unsharded_stages:  # the copy-in of the reduce-scatter after the final W
                segs += c._zero3_copies(f"L{layer}", backward=True, marked=True)
            segs.append(GradReady(f"L{layer} grads", c._layer_grad_bytes(stage, layer),
                                  c._layer_expert_grad_bytes()))
        return segs

    def p2p_bytes(self) -> float:
        """Activation (or its gradient) between stages, per TP rank.

        Megatron's scatter/gather optimisation sends 1/t of it (Narayanan et al.
        2021, sec. 4.1); with SP it is already split.
        """
        return BF16 * self._bsh / self.tp

    # ------------------------------------------------------------- Seq1F1B sequence chunks
    def seq_bounds(self) -> tuple[float, ...]:
        """Boundaries ``0 = x_0 < ... < x_k = 1`` of the ``k`` sequence chunks, fractions of the
        sequence, placed for equal FLOPs (:func:`workloads.seqchunks.bounds_of`)."""
        return bounds_of(replace(self, seq_chunks=1, seq_window=WHOLE_WINDOW), self.seq_chunks)

    def seq_chunk(self, c: int) -> TransformerCosts:
        """The costs of sequence chunk ``c`` of every micro-batch (Sun et al. 2024, sec. 3).

        Its tokens ``[x_c, x_{c+1})`` size the GEMMs (and the shapes the device model
        sees), memory-bound kernels, TP/SP collectives, pipeline messages, stashed
        activations (its keys and values among them) and working memory; its queries
        attend to keys ``[0, x_{c+1})`` (:func:`workloads.seqchunks.window_attention_share`).
        """
        x = self.seq_bounds()
        return replace(self, seq_chunks=1, seq_window=(x[c], x[c + 1]))

    def seq_chunk_share(self, op: Op) -> float:
        """Share of its stage's stashed activations per micro-batch that ``op``'s sequence
        chunk stashes (the lowering allocates it at the chunk's forward and frees it at its
        backward, which runs after every later chunk's: the key/value memory they keep)."""
        if op.seq < 0 or self.seq_chunks == 1:
            return 1.0
        return (self.seq_chunk(op.seq).activation_bytes_per_mb(op.stage)
                / self.activation_bytes_per_mb(op.stage))

    def seq_p2p_bytes(self, op: Op) -> float:
        """Pipeline message of ``op``'s sequence chunk (activation or gradient), per TP rank."""
        if op.seq < 0 or self.seq_chunks == 1:
            return self.p2p_bytes()
        return self.seq_chunk(op.seq).p2p_bytes()
