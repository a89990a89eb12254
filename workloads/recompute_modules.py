"""Megatron-core's selective recomputation by module (``--recompute-granularity selective
--recompute-modules ...``): which modules exist, which of a layer's they touch, and which a
model lacks. What each drops from the stash and reruns in the backward is costed by
:class:`workloads.transformer.TransformerCosts`; this module only names them.

Source: NVIDIA/Megatron-LM, megatron/core/transformer/transformer_config.py
(``recompute_modules`` and its checks in ``__post_init__``), applied in
transformer_layer.py (``layernorm``, ``mlp``), attention.py (``core_attn``),
multi_latent_attention.py (``mla_up_proj``), moe/moe_layer.py (``moe``, ``shared_experts``)
and moe/experts.py (``moe_act``). ``layernorm``, ``mla_up_proj`` and ``moe_act`` run under
``tensor_parallel.CheckpointWithoutOutput``: the forward runs without autograd, only the
module's inputs are saved, its output's storage is freed once the next module has consumed
it (the tensors that module saved for its backward go with it) and a gradient hook reruns
the module before that backward. ``core_attn``, ``mlp``, ``moe`` and ``shared_experts`` run
under the ordinary ``tensor_parallel.checkpoint``: the module keeps its input, nothing it
computes inside, and its whole forward (with its collectives) reruns in the backward.
"""

from __future__ import annotations

from base.errors import ConfigError
from workloads.models import ModelSpec

RECOMPUTE_MODULES: dict[str, str] = {
    "core_attn": "the attention core (softmax(QK^T)V): its internal tensors, the score "
                 "matrix of non-flash kernels; Q, K, V and its output stay (they are the "
                 "checkpoint's input and the output projection's)",
    "mla_up_proj": "multi-latent attention's query and key/value up-projections and RoPE: "
                   "the per-head Q, K and V the attention kernel saves; the latents stay",
    "layernorm": "the input and pre-MLP norms where they are modules of their own: their "
                 "outputs, the next GEMM's saved input (Megatron-core's Transformer Engine "
                 "layer fuses the norm into that GEMM, an IdentityOp norm, except before "
                 "MLA's down-projections and before a MoE layer's router)",
    "mlp": "a dense layer's MLP (not a MoE layer's): its GEMM input and intermediates",
    "moe": "a MoE layer whole (router, dispatch, experts, combine, shared experts): the "
           "dispatched token copies and every expert intermediate; its input stays",
    "moe_act": "the routed experts' activation (grouped GEMM): its output, the input of "
               "the experts' second GEMM",
    "shared_experts": "a MoE layer's shared experts: their intermediates",
}
"""The modules of Megatron-core's ``recompute_modules`` this simulator costs, and what each
drops from the stash (``gdn_*``, ``gdp_*`` and ``mhc`` belong to layers it does not model).
The default with ``recompute_granularity: selective`` is ``["core_attn"]``."""

DEFAULT_RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn",)
"""Megatron-core's ``recompute_modules`` when none are given."""


def absent_module(model: ModelSpec, module: str) -> str | None:
    """Why ``module`` has nothing to recompute in ``model`` (None: it has): the reasons
    Megatron-core refuses (``mla_up_proj`` without multi-latent attention) and those where it
    silently recomputes nothing (``moe`` on a dense model, ``mlp`` where every layer is MoE,
    ``layernorm`` where every norm is fused into its GEMM)."""
    moe = model.moe is not None
    dense_layers = not moe or model.first_dense_layers > 0
    reasons = {
        "core_attn": None,
        "mla_up_proj": None if model.mla is not None else "the model has no multi-latent "
                                                          "attention",
        "layernorm": None if model.mla is not None or moe else (
            "every norm is fused into the next GEMM (Megatron-core's Transformer Engine "
            "layer; only MLA's input norm and a MoE layer's pre-MLP norm are separate)"),
        "mlp": None if dense_layers else "every layer's MLP is a MoE layer (use moe, moe_act "
                                         "or shared_experts)",
        "moe": None if moe else "the model has no MoE layers",
        "moe_act": None if moe else "the model has no MoE layers",
        "shared_experts": None if moe and model.moe.shared_experts else (
            "the model has no shared experts"),
    }
    return reasons[module]


def layer_modules(model: ModelSpec, modules: tuple[str, ...]) -> frozenset[str]:
    """The modules of ``modules`` that act on one layer of uniform spec ``model``
    (:meth:`workloads.models.ModelSpec.layer_spec`): ``mlp`` on dense layers only, the MoE
    modules on MoE layers only (Megatron's ``TransformerLayer`` sets ``recompute_mlp`` only
    when ``not self.is_moe_layer``)."""
    return frozenset(m for m in modules if m == "layernorm" or absent_module(model, m) is None)


def check(recompute: str, modules: list[str] | None, model: ModelSpec) -> tuple[str, ...]:
    """The modules to recompute (``training.recompute_modules``, default ``core_attn``);
    ConfigError when they are given without ``recompute: selective``, twice, or for a
    module the model lacks (:func:`absent_module`)."""
    if modules is None:
        return DEFAULT_RECOMPUTE_MODULES
    if recompute != "selective":
        raise ConfigError(f"training.recompute_modules={modules}: needs training.recompute: "
                          f"selective (got {recompute!r})")
    for module in modules:
        if modules.count(module) > 1:
            raise ConfigError(f"training.recompute_modules={modules}: {module!r} given twice")
        reason = absent_module(model, module)
        if reason is not None:
            raise ConfigError(f"training.recompute_modules: {module!r} has nothing to "
                              f"recompute in {model.name}: {reason}")
    return tuple(modules)
