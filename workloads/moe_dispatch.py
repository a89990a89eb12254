"""Token copies a MoE dispatcher sends per token: Megatron-core's ``alltoall`` dispatcher
sends one per routed expert (k); its ``flex`` dispatcher (DeepEP, HybridEP) sends one per
destination *unit* that holds any of the token's experts (Megatron-core
``megatron/core/transformer/moe/token_dispatcher.py``, ``MoEFlexTokenDispatcher``, and
``fused_a2a.py``; DeepEP's README: internode dispatch sends a token once over RDMA to each
destination server, which forwards it over NVLink to its experts' GPUs; intranode, once to
each destination GPU).

The unit is the server when the EP group spans servers (the copies that cross the network),
else the GPU. The count is the expected number of distinct units among a token's k experts
under uniform routing (Megatron's ``moe_router_force_load_balancing``: random router logits)
with node-limited routing (DeepSeek-V3, DeepSeek-AI 2024, sec. 2.1.2; Megatron-core
``router.py`` ``group_limited_topk``, ``moe_router_num_groups``/``moe_router_group_topk``,
the Hugging Face config's ``n_group``/``topk_group``): the E experts fall into G groups of E/G
consecutive experts, a token first picks M groups, then its k experts among those M·E/G.
"""

from __future__ import annotations

from math import comb

from base.errors import ConfigError

DISPATCHERS = ("alltoall", "flex")
"""``parallel.moe_dispatcher`` values (Megatron-core's ``moe_token_dispatcher_type``)."""


def check_router_groups(num_experts: int, top_k: int, groups: int, group_topk: int) -> None:
    """ConfigError unless G groups split E evenly, 1 <= M <= G and k fits in M groups."""
    if groups < 1 or num_experts % groups:
        raise ConfigError(f"model.moe.router_num_groups={groups} must divide "
                          f"model.moe.num_experts={num_experts}")
    if not 1 <= group_topk <= groups:
        raise ConfigError(f"model.moe.router_group_topk={group_topk} must lie between 1 and "
                          f"router_num_groups={groups}")
    if top_k > group_topk * num_experts // groups:
        raise ConfigError(f"model.moe.top_k={top_k} exceeds the {group_topk} groups' "
                          f"{group_topk * num_experts // groups} experts a token may reach")


def expected_units(num_experts: int, top_k: int, units: int, groups: int = 1,
                   group_topk: int = 1) -> float:
    """D, the expected number of the ``units`` (equal, consecutive slices of the experts:
    servers or GPUs) that hold at least one of a token's ``top_k`` experts.

    A unit is missed with probability P0; D = U·(1 − P0). With T = M·E/G reachable experts:
    when a unit holds g = G/U whole groups, P0 = Σ_i C(g, i)·C(G − g, M − i)/C(G, M) ·
    C(T − i·E/G, k)/C(T, k) (i of its groups chosen, none of the k in them); when a group
    spans U/G units, P0 = 1 − M/G + M/G · C(T − E/U, k)/C(T, k). Without groups (G = M = 1),
    P0 = C(E − E/U, k)/C(E, k).
    """
    check_router_groups(num_experts, top_k, groups, group_topk)
    if num_experts % units:
        raise ConfigError(f"{units} dispatch units do not split {num_experts} experts evenly")
    per_group, per_unit = num_experts // groups, num_experts // units
    reach = group_topk * per_group
    if groups % units == 0:
        g = groups // units
        missed = sum(comb(g, i) * comb(groups - g, group_topk - i) / comb(groups, group_topk)
                     * comb(reach - i * per_group, top_k) / comb(reach, top_k)
                     for i in range(min(g, group_topk) + 1))
    elif units % groups == 0:
        chosen = group_topk / groups
        missed = 1 - chosen + chosen * comb(reach - per_unit, top_k) / comb(reach, top_k)
    else:
        raise ConfigError(f"router_num_groups={groups} and the {units} dispatch units must "
                          "nest (one a multiple of the other)")
    return units * (1 - missed)
