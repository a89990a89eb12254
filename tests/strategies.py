"""Hypothesis strategies for random valid experiment files (README "The experiment file").

:func:`experiments` draws experiment dicts, as ``sim run`` reads them from YAML, small
enough to simulate in well under 0.5 s at either fidelity: the synthetic model and
small dense and mixture-of-experts transformers (few layers, small hidden sizes),
every schedule of the registry (:data:`workloads.registry.SCHEDULES`; the multimodal
ones mostly with an encoder, synthetic or a tiny ViT, and its own layout), even and
uneven ``layers_per_stage``, TP with and without SP, CP, EP, ZeRO 0-3, recomputation,
every framework profile (:data:`workloads.frameworks.FRAMEWORKS`),
micro-batch sizes and counts, on the ideal cluster, DGX servers and explicit
topologies. With ``collapsible=False`` some also carry what breaks the symmetry the
collapsed fidelity relies on (and so forces fidelity full): stragglers, mixed GPU types
and link faults mid-step (:func:`link_changes` turns these into the ``link_changes``
argument of :func:`sim.api.simulate`).

Every drawn dict builds (:func:`sim.experiment.build_experiment`): the strategy draws
valid shapes by construction and rejects the few remaining invalid combinations (a
schedule that needs more micro-batches, say) with :func:`hypothesis.assume`.
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

from base.errors import ConfigError
from sim.experiment import Experiment, build_experiment
from sim.faults import mid_step_link_changes
from workloads.frameworks import FRAMEWORKS
from workloads.registry import SCHEDULES as REGISTRY

SCHEDULES = tuple(REGISTRY)
"""Every built-in schedule, from the registry itself (a new one is drawn without edits)."""

V_SCHEDULES = frozenset({"zb-v", "dualpipe-v"})
"""Schedules with exactly two model chunks per rank."""

MAX_GPUS = 16
"""At most this many GPUs: small enough for full fidelity to run fast."""

FAT_TREE = {"topology": "fat-tree", "link_bandwidth_GBps": 10.0, "gpus_per_leaf": 2}
"""The cluster of link-fault experiments: spare paths (two spines), so failures reroute."""


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def _synthetic(draw: st.DrawFn) -> dict[str, Any]:
    backward = draw(st.sampled_from([0.5, 1.0, 2.0, 3.0]))
    return {"synthetic": {
        "forward_ms": draw(st.sampled_from([0.25, 0.5, 1.0, 1.5])),
        "backward_ms": backward,
        "weight_grad_ms": draw(st.sampled_from([0.0, 0.25, 0.5])) * backward,
        "activation_MB": draw(st.sampled_from([0.0, 10.0, 100.0])),
        "p2p_MB": draw(st.sampled_from([0.0, 1.0, 16.0])),
        "grad_MB": draw(st.sampled_from([0.0, 4.0, 50.0])),
    }}


@st.composite
def _transformer(draw: st.DrawFn, tp: int, cp: int, ep: int, stages: int) -> dict[str, Any]:
    heads = tp * draw(st.sampled_from([1, 2, 4]))
    head_dim = draw(st.sampled_from([16, 32]))
    hidden = heads * head_dim
    model: dict[str, Any] = {
        "num_layers": stages + draw(st.integers(0, 3)),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": draw(st.sampled_from(_divisors(heads))),
        "ffn_hidden_size": hidden * draw(st.sampled_from([2, 4])),
        "vocab_size": draw(st.sampled_from([256, 1000, 1024])),
        "seq_length": 2 * cp * tp * draw(st.sampled_from([8, 16, 32])),
        "ffn_type": draw(st.sampled_from(["gelu", "swiglu"])),
        "norm": draw(st.sampled_from(["layernorm", "rmsnorm"])),
        "tied_embeddings": draw(st.booleans()),
        "position_embedding": draw(st.sampled_from(["learned", "rope", "alibi"])),
        "parallel_blocks": draw(st.booleans()),
    }
    if ep > 1 or draw(st.booleans()):
        experts = ep * draw(st.sampled_from([1, 2]))
        moe: dict[str, Any] = {"num_experts": experts,
                               "top_k": draw(st.integers(1, min(2, experts)))}
        if draw(st.booleans()):
            moe["capacity_factor"] = draw(st.sampled_from([1.0, 1.25, 2.0]))
        elif ep > 1:
            moe["routing_imbalance"] = draw(st.sampled_from([1.0, 1.3]))
        model["moe"] = moe
    return model


@st.composite
def _uneven(draw: st.DrawFn, layers: int, stages: int) -> list[int]:
    """A split of ``layers`` into ``stages`` positive parts."""
    cuts = sorted(draw(st.sets(st.integers(1, layers - 1), min_size=stages - 1,
                               max_size=stages - 1))) if stages > 1 else []
    bounds = [0, *cuts, layers]
    return [b - a for a, b in pairwise(bounds)]


@st.composite
def _cluster(draw: st.DrawFn, num_gpus: int, mixed: bool) -> dict[str, Any]:
    if mixed:
        per_node = draw(st.sampled_from([g for g in (1, 2, 4) if num_gpus % g == 0
                                         and num_gpus // g >= 2]))
        nodes = num_gpus // per_node
        first = draw(st.integers(1, nodes - 1))
        types = draw(st.permutations(["A100-80GB", "H100"]))
        return {"num_gpus": num_gpus, "topology": "switch", "gpus_per_node": per_node,
                "link_bandwidth_GBps": draw(st.sampled_from([12.5, 50.0])),
                "nodes": [{"gpu": types[0], "count": first},
                          {"gpu": types[1], "count": nodes - first}]}
    kinds = ["ideal", "switch", "ring"]
    if num_gpus <= 8 or num_gpus % 8 == 0:
        kinds.append("dgx")
    if num_gpus % 2 == 0 and num_gpus >= 4:
        kinds.append("fat-tree")
    kind = draw(st.sampled_from(kinds))
    if kind == "ideal":
        return {"preset": "ideal", "num_gpus": num_gpus}
    if kind == "dgx":
        return {"preset": draw(st.sampled_from(["dgx-a100-80g", "dgx-h100"])),
                "num_gpus": num_gpus}
    if kind == "fat-tree":
        return {"num_gpus": num_gpus, **FAT_TREE}
    out: dict[str, Any] = {"topology": kind, "num_gpus": num_gpus,
                           "link_bandwidth_GBps": draw(st.sampled_from([12.5, 25.0, 100.0])),
                           "link_latency_us": draw(st.sampled_from([0.0, 1.0, 5.0]))}
    if kind == "switch":
        out["gpus_per_node"] = draw(st.sampled_from(_divisors(num_gpus)[:3]))
    return out


@st.composite
def _faults(draw: st.DrawFn, cluster: dict[str, Any], num_gpus: int) -> dict[str, Any]:
    faults: dict[str, Any] = {}
    if draw(st.booleans()):
        gpus = draw(st.sets(st.integers(0, num_gpus - 1), min_size=1, max_size=2))
        faults["stragglers"] = [{"gpu": g, "slowdown": draw(st.sampled_from([1.1, 1.25, 1.5]))}
                                for g in sorted(gpus)]
    if cluster.get("topology") == "fat-tree" and (not faults or draw(st.booleans())):
        leaves = num_gpus // FAT_TREE["gpus_per_leaf"]
        leaf = draw(st.integers(0, leaves - 1))
        fault: dict[str, Any] = {"at_s": draw(st.sampled_from([1e-4, 1e-3, 3e-3]))}
        if draw(st.booleans()):
            fault.update(link=[f"leaf{leaf}", f"spine{draw(st.integers(0, 1))}"], failed=True)
        else:
            gpu = leaf * FAT_TREE["gpus_per_leaf"] + draw(st.integers(0, 1))
            fault.update(link=[f"gpu{gpu}", f"leaf{leaf}"],
                         bandwidth_factor=draw(st.sampled_from([0.25, 0.5])))
        faults["link_faults"] = [fault]
    return faults


@st.composite
def _encoder(draw: st.DrawFn, synthetic: bool, tp: int, pp: int
             ) -> tuple[dict[str, Any], dict[str, Any]]:
    """A multimodal model's encoder (synthetic with a synthetic LLM, else synthetic or a tiny
    ViT) and its layout (``model.encoder``, ``parallel.encoder``), for the multimodal
    schedules."""
    pp_e = draw(st.sampled_from(_divisors(pp)))
    layout: dict[str, Any] = {"tp": draw(st.sampled_from(sorted({1, tp}))), "pp": pp_e}
    if synthetic or draw(st.booleans()):
        encoder: dict[str, Any] = {"synthetic": {
            "forward_ms": draw(st.sampled_from([0.0, 0.2, 0.5, 1.0])),
            "backward_ms": draw(st.sampled_from([0.0, 0.4, 1.0, 2.0])),
            "activation_MB": draw(st.sampled_from([0.0, 10.0])),
            "output_MB": draw(st.sampled_from([0.0, 1.0]))}}
        layout["pieces"] = draw(st.integers(1, 3))
        return encoder, layout
    layers = pp_e * draw(st.integers(1, 2))
    encoder = {"num_layers": layers, "hidden_size": 64, "num_attention_heads": 4,
               "ffn_hidden_size": 128, "tokens_per_sample": draw(st.sampled_from([16, 49]))}
    layout["pieces"] = draw(st.integers(1, layers // pp_e))
    return encoder, layout


@st.composite
def _experiment(draw: st.DrawFn, collapsible: bool, schedule: str | None) -> dict[str, Any]:
    schedule = schedule or draw(st.sampled_from(SCHEDULES))
    synthetic = draw(st.integers(0, 3)) == 0
    tp = draw(st.sampled_from([1, 2]))
    pp = draw(st.sampled_from([1, 2, 2, 3, 4]))
    if schedule in ("interleaved", *V_SCHEDULES) or schedule == "seq1f1b":
        pp = max(pp, 2)
    cp = 1 if synthetic or schedule == "seq1f1b" else draw(st.sampled_from([1, 1, 2]))
    dp = draw(st.sampled_from([d for d in (1, 2, 4) if tp * pp * cp * d <= MAX_GPUS]))
    ep = 1 if synthetic else draw(st.sampled_from(_divisors(dp)))
    vpp = 2 if schedule in V_SCHEDULES else (
        draw(st.sampled_from([2, 3])) if schedule == "interleaved" else 1)
    num_gpus = tp * pp * cp * dp
    parallel: dict[str, Any] = {"tp": tp, "pp": pp, "dp": dp, "cp": cp, "ep": ep, "vpp": vpp,
                                "zero_stage": draw(st.integers(0, 1 if synthetic else 3)),
                                "overlap_grad_reduce": draw(st.booleans())}
    if parallel["overlap_grad_reduce"]:
        parallel["grad_bucket_MB"] = draw(st.sampled_from([0.5, 25.0]))
        if not synthetic and parallel["zero_stage"] in (1, 2):
            parallel["overlap_param_gather"] = draw(st.booleans())
    if synthetic:
        model = draw(_synthetic())
    else:
        model = draw(_transformer(tp, cp, ep, pp * vpp))
        parallel["sequence_parallel"] = tp > 1 and draw(st.booleans())
        if draw(st.booleans()):
            parallel["layers_per_stage"] = draw(_uneven(model["num_layers"], pp * vpp))
    if dp > 1 and draw(st.booleans()):
        parallel["placement"] = draw(st.sampled_from(["tp-cp-dp-pp", "tp-cp-pp-dp",
                                                      "dp-tp-cp-pp"]))
    if ep > 1 and draw(st.booleans()):  # Megatron-core's flex dispatcher, EP overlap
        parallel["moe_dispatcher"] = "flex"
        parallel["moe_a2a_overlap"] = draw(st.booleans())
    if (ep > 1 and parallel.get("sequence_parallel") and parallel.get("placement", "-pp")
            .endswith("pp") and draw(st.booleans())):  # Megatron-core's ETP 1 under TP 2
        parallel["expert_tp"] = 1
    m = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    if schedule in ("interleaved", *V_SCHEDULES):
        m = pp * math.ceil(max(m, 2 * pp) / pp)
    training: dict[str, Any] = {
        "micro_batch_size": draw(st.sampled_from([1, 2])),
        "num_microbatches": m,
        "recompute": draw(st.sampled_from(["none", "selective", "full"])),
        "attention": draw(st.sampled_from(["flash2", "flash1"] if cp > 1 else
                                          ["flash2", "flash1", "fused", "unfused"])),
        "fused_norm": draw(st.booleans()),
        "vocab_parallel_loss": draw(st.booleans()),
    }
    if schedule == "seq1f1b":
        training["seq_chunks"] = draw(st.sampled_from([1, 2, 4]))
    if REGISTRY[schedule].encoder is not None and cp == 1 and ep == 1 and draw(
            st.sampled_from([True, True, False])):
        model["encoder"], parallel["encoder"] = draw(_encoder(synthetic, tp, pp))
        parallel.update(zero_stage=min(parallel["zero_stage"], 2), overlap_grad_reduce=False,
                        overlap_param_gather=False)
    mixed = not collapsible and num_gpus >= 2 and draw(st.sampled_from([False, False, True]))
    cluster = draw(_cluster(num_gpus, mixed))
    if not synthetic:  # the framework profiles, precision and partial recomputation
        training["framework"] = draw(st.sampled_from(tuple(FRAMEWORKS)))
        fp8_ok = cluster.get("preset") in ("ideal", "dgx-h100")
        training["precision"] = draw(st.sampled_from(["bf16", "fp16", "fp8"] if fp8_ok
                                                     else ["bf16", "fp16"]))
        if training["recompute"] != "none" and draw(st.booleans()):
            key = draw(st.sampled_from(["recompute_num_layers", "recompute_every_k_layers"]))
            training[key] = draw(st.integers(0 if key == "recompute_num_layers" else 1, 3))
        if training["recompute"] == "selective" and draw(st.booleans()):  # Megatron's modules
            present = ["core_attn", "moe", "moe_act"] if "moe" in model else ["core_attn", "mlp"]
            training["recompute_modules"] = draw(st.lists(st.sampled_from(present),
                                                          unique=True, max_size=2))
    exp: dict[str, Any] = {"name": "drawn", "model": model, "cluster": cluster,
                           "parallel": parallel, "training": training, "schedule": schedule}
    if not collapsible and not mixed:
        faults = draw(_faults(cluster, num_gpus))
        if faults:
            exp["faults"] = faults
    try:
        build_experiment(exp)
    except ConfigError:
        assume(False)
    return exp


def experiments(collapsible: bool = False, schedule: str | None = None
                ) -> st.SearchStrategy[dict[str, Any]]:
    """Valid experiment dicts; with ``collapsible``, only ones without stragglers, mixed GPU
    types or link faults (so both fidelities can run them); with ``schedule``, only ones
    of that schedule (default: any of :data:`SCHEDULES`)."""
    return _experiment(collapsible, schedule)


def collapsible_experiments() -> st.SearchStrategy[dict[str, Any]]:
    """Valid experiment dicts that both fidelities simulate (:func:`experiments`)."""
    return _experiment(True, None)


def breaks_symmetry(exp: dict[str, Any]) -> bool:
    """Whether ``exp`` has stragglers, mixed GPU types or link faults: fidelity full only."""
    faults = exp.get("faults") or {}
    return bool(faults.get("stragglers") or faults.get("link_faults")
                or exp["cluster"].get("nodes"))


def link_changes(exp: Experiment) -> list[tuple[float, dict[int, float]]]:
    """The experiment's ``faults.link_faults`` as mid-step ``link_changes`` of
    :func:`sim.api.simulate`, each at its ``at_s`` from the start of the step."""
    faults = exp.config.faults
    if faults is None or not faults.link_faults:
        return []
    events = sorted(enumerate(faults.link_faults), key=lambda e: e[1].at_s)
    changes, _ = mid_step_link_changes(exp.cluster, events, 0, 0.0, math.inf)
    return changes


def disjoint_groups(draw: st.DrawFn, n: int, size: int, count: int, shape: str
                    ) -> list[tuple[int, ...]]:
    """``count`` disjoint groups of ``size`` of ``n`` GPUs laid out as ``shape``: ``strided``
    (group i = {i, i + n/size, ...}: the DP groups of a TP x DP layout), ``blocks``
    (consecutive GPUs: TP groups) or ``random`` (a random partition, drawn with ``draw``)."""
    if shape == "strided":
        stride = n // size
        return [tuple(i + j * stride for j in range(size)) for i in range(count)]
    if shape == "blocks":
        return [tuple(range(i * size, (i + 1) * size)) for i in range(count)]
    assert shape == "random", shape
    perm = draw(st.permutations(range(n)))
    return [tuple(perm[i * size:(i + 1) * size]) for i in range(count)]
