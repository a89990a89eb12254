"""A multimodal experiment: ``model.encoder`` and ``parallel.encoder`` checked and turned into
the encoder's costs and a multimodal schedule (:mod:`workloads.schedules_multimodal`).

The Optimus schedule places encoder pieces by their estimated durations, as Optimus
does by profiling (Feng et al. 2024, sec. 4.2): here each op's compute by the device
model on its rank's GPU plus its TP collectives by the α-β estimate (uncontended), as
``layers_per_stage: balanced`` times them; the simulation then times the order found.
"""

from __future__ import annotations

from base.errors import ConfigError
from sim.budget import check_schedule_ops
from sim.calibration import default_profile
from sim.config import EncoderConfig, EncoderParallelConfig, ExperimentConfig
from sim.device import work_timer
from sim.selection import estimate, group_profile, resolve_algorithm
from topologies.cluster import Cluster
from topologies.placement import Placement
from workloads.costs import CommSeg, ComputeSeg, Segment, split_layers
from workloads.encoders import (
    ENCODER_PRESETS,
    Encoder,
    MultimodalCosts,
    SyntheticEncoder,
    TransformerEncoder,
)
from workloads.lowering import CostModel
from workloads.models import ModelSpec
from workloads.registry import SCHEDULES
from workloads.schedules import (
    BACKWARD,
    ENCODER_BACKWARD,
    ENCODER_FORWARD,
    FORWARD,
    EncoderLayout,
    Op,
    Schedule,
    validate,
)
from workloads.schedules_multimodal import EncoderPlan
from workloads.transformer import TransformerCosts

MB = 1e6
_SIZES = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size")


def encoder_spec(cfg: EncoderConfig) -> ModelSpec | None:
    """The encoder's transformer (a preset with the given sizes overriding), or None for a
    synthetic one; ConfigError naming the key for a missing or inconsistent size."""
    sizes = {f: getattr(cfg, f) for f in _SIZES if getattr(cfg, f) is not None}
    if cfg.synthetic is not None:
        if cfg.preset is not None or sizes:
            extra = "preset" if cfg.preset is not None else next(iter(sizes))
            raise ConfigError(f"model.encoder.{extra}: not used with a synthetic encoder")
        return None
    if cfg.preset is not None:
        if cfg.preset not in ENCODER_PRESETS:
            raise ConfigError(f"model.encoder.preset: unknown encoder {cfg.preset!r}; choose "
                              f"one of {', '.join(ENCODER_PRESETS)}")
        spec = ENCODER_PRESETS[cfg.preset]
    else:
        missing = [f for f in _SIZES if f not in sizes]
        if missing:
            raise ConfigError(f"model.encoder.{missing[0]}: required without a preset (or give "
                              "model.encoder.preset or model.encoder.synthetic)")
        spec = ModelSpec("encoder", sizes["num_layers"], sizes["hidden_size"],
                         sizes["num_attention_heads"], sizes["num_attention_heads"],
                         sizes["ffn_hidden_size"], 0, 1, ffn_type="gelu", norm="layernorm",
                         position_embedding="learned")
    heads = sizes.get("num_attention_heads", spec.num_attention_heads)
    spec = spec.with_overrides(**sizes, num_kv_heads=heads,
                               seq_length=_tokens(cfg, spec.seq_length if cfg.preset else None))
    if spec.hidden_size % spec.num_attention_heads:
        raise ConfigError(f"model.encoder.hidden_size={spec.hidden_size} is not divisible by "
                          f"its num_attention_heads={spec.num_attention_heads}")
    return spec


def _tokens(cfg: EncoderConfig, preset: int | None) -> int:
    """Encoder tokens per sample: given, from the image and patch sizes, or the preset's."""
    image = (cfg.image_size, cfg.patch_size)
    if cfg.tokens_per_sample is not None:
        if image != (None, None):
            raise ConfigError("model.encoder.tokens_per_sample: give it or image_size and "
                              "patch_size, not both")
        return cfg.tokens_per_sample
    if image != (None, None):
        if None in image:
            key = "patch_size" if cfg.patch_size is None else "image_size"
            raise ConfigError(f"model.encoder.{key}: needed with model.encoder."
                              f"{'image_size' if key == 'patch_size' else 'patch_size'}")
        size, patch = image
        assert size is not None and patch is not None
        if size % patch:
            raise ConfigError(f"model.encoder.image_size={size} is not a multiple of "
                              f"patch_size={patch}")
        return (size // patch) ** 2
    if preset is None:
        raise ConfigError("model.encoder.tokens_per_sample: required without a preset (or "
                          "give image_size and patch_size)")
    return preset


def _check_layout(cfg: ExperimentConfig, tp: int, pp: int, num_gpus: int
                  ) -> tuple[int, int, int]:
    """The encoder's (tp, pp, dp) from ``parallel.encoder``, checked against the LLM's."""
    par = cfg.parallel
    pe = par.encoder or EncoderParallelConfig()
    kind = SCHEDULES.get(cfg.schedule)
    if kind is None or kind.encoder is None:
        multimodal = [k.name for k in SCHEDULES.values() if k.encoder is not None]
        raise ConfigError(f"model.encoder: schedule {cfg.schedule!r} has no place for an "
                          f"encoder; use one of {', '.join(multimodal)}")
    for key, value, ok in (("parallel.cp", par.cp, par.cp == 1),
                           ("parallel.ep", par.ep, par.ep == 1),
                           ("parallel.expert_tp", par.expert_tp, par.expert_tp in (None, tp)),
                           ("parallel.zero_stage", par.zero_stage, par.zero_stage < 3),
                           ("parallel.overlap_grad_reduce", par.overlap_grad_reduce,
                            not par.overlap_grad_reduce)):
        if not ok:
            raise ConfigError(f"{key}={value}: not supported with model.encoder (its pieces "
                              "are lowered without CP, EP, expert TP, ZeRO-3 gathers or gradient "
                              "buckets)")
    tp_e = tp if pe.tp is None else pe.tp
    if tp_e not in (1, tp):
        raise ConfigError(f"parallel.encoder.tp={tp_e}: must be 1 or the LLM's tp={tp} (the "
                          "encoder's TP groups are the LLM's or single GPUs)")
    if pp % pe.pp:
        raise ConfigError(f"parallel.encoder.pp={pe.pp} does not divide parallel.pp={pp}")
    dp_e = num_gpus // (tp_e * pe.pp)
    if pe.dp is not None and pe.dp != dp_e:
        raise ConfigError(f"parallel.encoder.dp={pe.dp}: tp*pp*dp = {tp_e}*{pe.pp}*{pe.dp} != "
                          f"cluster.num_gpus = {num_gpus}")
    return tp_e, pe.pp, dp_e


def attach_encoder(cfg: ExperimentConfig, llm: CostModel, cluster: Cluster,
                   placement: Placement, m: int) -> tuple[MultimodalCosts, Schedule]:
    """The cost model of encoder + LLM and the multimodal schedule of ``cfg``."""
    assert cfg.model.encoder is not None
    tp, pp = placement.degree("tp"), placement.degree("pp")
    tp_e, pp_e, dp_e = _check_layout(cfg, tp, pp, cluster.num_gpus)
    spec = encoder_spec(cfg.model.encoder)
    pe = cfg.parallel.encoder or EncoderParallelConfig()
    stage_layers = split_layers(spec.num_layers, pp_e) if spec is not None else ()
    if spec is not None and spec.num_layers < pp_e:
        raise ConfigError(f"parallel.encoder.pp={pp_e} exceeds the encoder's "
                          f"num_layers={spec.num_layers}")
    if spec is not None and spec.num_attention_heads % tp_e:
        raise ConfigError(f"parallel.encoder.tp={tp_e} does not divide the encoder's "
                          f"num_attention_heads={spec.num_attention_heads}")
    most = min(stage_layers) if stage_layers else None
    pieces = pe.pieces or most or 1
    if most is not None and pieces > most:
        raise ConfigError(f"parallel.encoder.pieces={pieces} exceeds the {most} layers of an "
                          "encoder stage (a piece is one layer or more)")
    check_schedule_ops(pp, m, pieces, "parallel.encoder.pieces", pieces)
    layout = EncoderLayout(pp_e, pieces)
    encoder: Encoder
    if spec is None:
        syn = cfg.model.encoder.synthetic
        assert syn is not None
        encoder = SyntheticEncoder(layout, syn.forward_ms * 1e-3, syn.backward_ms * 1e-3,
                                   syn.activation_MB * MB, syn.output_MB * MB)
    else:
        t = cfg.training
        blocks = TransformerCosts(spec, 1, tp_e, dp_e, (spec.num_layers,),
                                  zero_stage=cfg.parallel.zero_stage, attention=t.attention,
                                  fused_norm=t.fused_norm)
        samples = t.micro_batch_size * pp_e * tp_e / (pp * tp)
        encoder = TransformerEncoder(blocks, layout, stage_layers, samples, dp_e,
                                     cfg.parallel.zero_stage)
    costs = MultimodalCosts(llm, encoder)
    plan = EncoderPlan(layout, *_estimates(costs, cluster, placement, cfg.training.attention))
    kind = SCHEDULES[cfg.schedule]
    assert kind.encoder is not None
    sched = kind.encoder(pp, m, plan)
    validate(sched)
    return costs, sched


def _estimates(costs: MultimodalCosts, cluster: Cluster, placement: Placement, attention: str
               ) -> tuple[tuple[tuple[float, float], ...], tuple[tuple[float, float], ...]]:
    """Per pipeline rank, the estimated seconds of an LLM forward and backward, and of an
    encoder forward and backward piece (their mean over the pieces)."""
    pp = placement.degree("pp")
    layout = costs.encoder.layout
    comm: dict[tuple[int, str, float], float] = {}
    segments: dict[Op, tuple[Segment, ...]] = {}  # encoder pieces, by encoder stage

    def seconds(r: int, segs: tuple[Segment, ...]) -> float:
        gpu = placement.gpu(pp=r)
        spec = cluster.gpu_of(gpu)
        timer = work_timer(spec, default_profile(spec.name), attention)
        total = 0.0
        for seg in segs:
            if isinstance(seg, ComputeSeg):
                total += timer(seg)
            elif isinstance(seg, CommSeg):
                key = (r, seg.op, seg.nbytes)
                if key not in comm:
                    group = group_profile(cluster, placement.group("tp", gpu))
                    algo = resolve_algorithm(seg.op, cluster.collective_algos.get(seg.op, "auto"),
                                             seg.nbytes, group)
                    comm[key] = (0.0 if group.n <= 1  # the estimate includes the launch
                                 else estimate(seg.op, algo, seg.nbytes, group))
                total += comm[key]
        return total

    def piece(r: int, kind: str, c: int) -> tuple[Segment, ...]:
        op = Op(layout.stage_of(r), kind, 0, c)  # the same work on every rank of the stage
        if op not in segments:
            segments[op] = costs.op_segments(op, False)
        return segments[op]

    llm = tuple(tuple(seconds(r, costs.op_segments(Op(r, kind, 0), False))
                      for kind in (FORWARD, BACKWARD)) for r in range(pp))
    enc = tuple(tuple(sum(seconds(r, piece(r, kind, c)) for c in range(layout.pieces))
                      / layout.pieces for kind in (ENCODER_FORWARD, ENCODER_BACKWARD))
                for r in range(pp))
    return llm, enc  # type: ignore[return-value]
