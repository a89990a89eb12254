"""The flex MoE dispatcher (DeepEP/HybridEP, ``parallel.moe_dispatcher: flex``): one copy of
a token per destination server (per GPU inside one server), node-limited routing."""

from __future__ import annotations

from math import comb
from pathlib import Path

import pytest

from base.errors import ConfigError
from sim.a2aoverlap import exposed_s
from sim.api import simulate
from sim.experiment import build_experiment
from workloads.costs import ComputeSeg
from workloads.hf_config import load_hf_config
from workloads.moe_dispatch import expected_units
from workloads.program import Collective

HF = Path(__file__).resolve().parent.parent / "sim/data/validation/hf_configs"
TOKENS, H = 1024, 4096


def _data(dispatcher: str, ep: int = 8, gpus_per_node: int = 4, **moe: int) -> dict:
    """llama-7b shapes, 2 MoE layers of 8 experts top-2, dp = ep GPUs in servers of
    ``gpus_per_node`` (switch), sequence 1024, micro-batch 1."""
    return {"name": "flex",
            "model": {"preset": "llama-7b", "num_layers": 2, "seq_length": TOKENS,
                      "ffn_hidden_size": 4096, "moe": {"num_experts": 8, "top_k": 2} | moe},
            "cluster": {"topology": "switch", "num_gpus": ep, "gpus_per_node": gpus_per_node,
                        "link_bandwidth_GBps": 25, "nvlink_bandwidth_GBps": 300},
            "parallel": {"pp": 1, "dp": ep, "ep": ep, "moe_dispatcher": dispatcher},
            "training": {"micro_batch_size": 1, "global_batch_size": 2 * ep}}


def _a2a_bytes(d: dict) -> set[float]:
    exp = build_experiment(d)
    return {i.nbytes for i in simulate(exp).program.instructions
            if isinstance(i, Collective) and i.op == "all_to_all"}


def test_expected_units_closed_forms() -> None:
    """D = U·(1 − P0), P0 the chance that a unit holds none of the k experts."""
    assert expected_units(4, 2, 2) == pytest.approx(2 * (1 - comb(2, 2) / comb(4, 2)))  # 5/3
    assert expected_units(8, 2, 4, groups=4, group_topk=1) == pytest.approx(1.0)  # one group
    assert expected_units(8, 1, 8) == pytest.approx(1.0)
    assert expected_units(8, 8, 4) == pytest.approx(4.0)  # every expert: every unit
    # DeepSeek-V3 on 8 servers of 32 experts (EP 64 on DGX H100): G = 8, M = 4, k = 8; a
    # server holds one group, chosen w.p. 1/2, then missed by all 8 of the 128 experts
    # reachable w.p. C(96, 8)/C(128, 8).
    p0 = 0.5 + 0.5 * comb(96, 8) / comb(128, 8)
    assert expected_units(256, 8, 8, 8, 4) == pytest.approx(8 * (1 - p0))
    # ... on 4 servers of 2 groups each (EP 32 on DGX B200)
    p0 = sum(comb(2, i) * comb(6, 4 - i) / comb(8, 4) * comb(128 - 32 * i, 8) / comb(128, 8)
             for i in range(3))
    assert expected_units(256, 8, 4, 8, 4) == pytest.approx(4 * (1 - p0))


def test_flex_bytes_crossing_the_nic_per_gpu() -> None:
    """EP 8 over 2 servers of 4, E = 8, k = 2: the all-to-all dispatcher sends 2 copies a
    token, half of them off the server; flex sends D = 2·(1 − C(4,2)/C(8,2)) = 11/7 copies,
    one per server hit, so b·s·h·D/2 bf16 cross each GPU's NIC (its remote-server copy)."""
    assert _a2a_bytes(_data("alltoall")) == {2 * TOKENS * 2 * H}
    (flex,) = _a2a_bytes(_data("flex"))
    assert flex == pytest.approx(2 * TOKENS * (11 / 7) * H)
    nic = flex * (8 - 4) / 8  # the pairwise plan's share to the other server's 4 GPUs
    assert nic == pytest.approx(2 * TOKENS * H * (1 - 6 / 28))  # P(the remote server is hit)


def test_node_limited_routing_sends_one_copy_to_one_server() -> None:
    """Groups of 4 experts = one server each, a token's experts from 1 group: one copy
    per token, to a remote server half of the time."""
    (flex,) = _a2a_bytes(_data("flex", router_num_groups=2, router_group_topk=1))
    assert flex == pytest.approx(2 * TOKENS * H)
    assert _a2a_bytes(_data("alltoall", router_num_groups=2, router_group_topk=1)) == {
        2 * TOKENS * 2 * H}


def test_inside_one_server_flex_dedups_per_gpu() -> None:
    """EP 4 on one server of 4: the unit is the GPU (2 experts each), D = 4·(1 − C(6,2)/C(8,2))
    = 13/7 GPUs a token; with groups of one GPU's 2 experts and M = 1, one GPU."""
    (single,) = _a2a_bytes(_data("flex", ep=4, gpus_per_node=4))
    assert single == pytest.approx(2 * TOKENS * (13 / 7) * H)
    (grouped,) = _a2a_bytes(_data("flex", ep=4, gpus_per_node=4, router_num_groups=4,
                                  router_group_topk=1))
    assert grouped == pytest.approx(2 * TOKENS * 1 * H)


def test_flex_shortens_the_exposed_ep_communication() -> None:
    def ep_s(dispatcher: str) -> float:
        return simulate(build_experiment(_data(dispatcher))).stats["exposed_comm_s"]["ep"]
    assert 0 < ep_s("flex") < ep_s("alltoall")


@pytest.mark.parametrize(("where", "value", "match"), [
    ("parallel", {"moe_dispatcher": "deepep"}, "moe_dispatcher"),
    ("moe", {"router_num_groups": 3}, "must divide"),
    ("moe", {"router_num_groups": 2, "router_group_topk": 3}, "between 1 and"),
    ("moe", {"router_num_groups": 8, "router_group_topk": 1}, "exceeds"),
    ("moe", {"router_num_groups": 0}, "router_num_groups"),
])
def test_bad_values_are_config_errors(where: str, value: dict, match: str) -> None:
    d = _data("flex")
    if where == "moe":
        d["model"]["moe"] |= value
    else:
        d["parallel"] |= value
    with pytest.raises(ConfigError, match=match):
        build_experiment(d)


def test_units_that_do_not_nest_with_the_groups_are_refused() -> None:
    with pytest.raises(ConfigError, match="nest"):
        expected_units(24, 2, 4, groups=6, group_topk=2)


def test_deepseek_v3_import_reads_node_limited_routing() -> None:
    moe = load_hf_config(HF / "deepseek-v3.json", 4096).moe
    assert moe is not None and (moe.router_num_groups, moe.router_group_topk) == (8, 4)


# ----------------------------------------------------------------- moe_a2a_overlap


def _overlap(on: bool) -> dict:
    d = _data("alltoall")
    d["parallel"]["moe_a2a_overlap"] = on
    return d


def test_overlap_exposes_what_the_partner_compute_leaves() -> None:
    """Combined 1F1B: the forward's dispatch hides under the backward's expert MLP, its
    combine under the backward's attention, the backward's combine gradient under the
    forward's attention and its dispatch gradient under the forward's expert MLP."""
    costs = build_experiment(_overlap(True)).costs
    secs = {"moe attn": 3.0, "moe mlp": 5.0, "moe attn bwd": 7.0, "moe mlp bwd": 11.0}

    def compute_s(seg: ComputeSeg) -> float:
        return secs.get(seg.label, 0.0)
    for t in (0.0, 4.0, 20.0):
        got = dict(exposed_s(costs, compute_s, lambda seg, t=t: t))
        assert got == {"dispatch": max(0.0, t - 11), "combine": max(0.0, t - 7),
                       "combine grad": max(0.0, t - 3), "dispatch grad": max(0.0, t - 5)}


def test_overlap_takes_the_dispatchers_sms_from_the_partner(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepEP's kernels run on moe_deepep_num_sms = 20 SMs (Megatron-core
    transformer_config.py, sim/data/a2a_overlap.toml): an all-to-all of c seconds beside a
    partner of g slows it to g + c·k/S, so it is exposed by max(c − g, c·k/S); NCCL's
    all-to-all (no SM count given) takes NCCL's measured contention share for k/S
    (sim.contention)."""
    from sim import a2aoverlap
    from sim.a2aoverlap import sm_share
    assert sm_share("flex", "H100") == pytest.approx(20 / 132)
    assert sm_share("flex", "B200") == pytest.approx(20 / 148)
    assert sm_share("alltoall", "H100") == pytest.approx(0.189)
    costs = build_experiment(_overlap(True)).costs
    secs = {"moe attn": 3.0, "moe mlp": 5.0, "moe attn bwd": 7.0, "moe mlp bwd": 11.0}

    def compute_s(seg: ComputeSeg) -> float:
        return secs.get(seg.label, 0.0)
    k = 0.25
    for t in (0.0, 4.0, 20.0):
        got = dict(exposed_s(costs, compute_s, lambda seg, t=t: t, k))
        assert got == {"dispatch": max(t - 11, k * t), "combine": max(t - 7, k * t),
                       "combine grad": max(t - 3, k * t), "dispatch grad": max(t - 5, k * t)}
    d = _data("flex")
    d["parallel"]["moe_a2a_overlap"] = True
    d["cluster"]["gpu"] = "H100"
    exp = build_experiment(d)
    with_sms = simulate(exp).stats
    with monkeypatch.context() as m:
        m.setattr(a2aoverlap, "sm_share", lambda dispatcher, gpu: 0.0)
        without = simulate(exp).stats
    assert with_sms["exposed_comm_s"]["ep"] > without["exposed_comm_s"]["ep"]
    assert with_sms["step_time_s"] > without["step_time_s"]


def test_overlap_hides_all_to_all_time_in_the_simulation() -> None:
    off, on = (simulate(build_experiment(_overlap(v))) for v in (False, True))
    assert on.stats["exposed_comm_s"]["ep"] < off.stats["exposed_comm_s"]["ep"]
    assert on.stats["step_time_s"] < off.stats["step_time_s"]
    collapsed = simulate(build_experiment(_overlap(True)), fidelity="collapsed")
    assert collapsed.stats["step_time_s"] == pytest.approx(on.stats["step_time_s"], rel=0.02)


def test_overlap_needs_expert_parallelism() -> None:
    d = _overlap(True)
    d["parallel"] |= {"ep": 1}
    with pytest.raises(ConfigError, match="moe_a2a_overlap"):
        build_experiment(d)


def test_overlap_with_the_moe_block_recomputed() -> None:
    """``recompute_modules: [moe]`` reruns the block's two all-to-alls in the backward before
    its own two: the backward's partners are still its own (the last two), so the exposed
    times equal those without recomputation, and both fidelities simulate it."""
    plain = build_experiment(_overlap(True)).costs
    d = _overlap(True)
    d["training"] |= {"recompute": "selective", "recompute_modules": ["moe"]}
    exp = build_experiment(d)
    secs = {"moe attn": 3.0, "moe mlp": 5.0, "moe attn bwd": 7.0, "moe mlp bwd": 11.0}

    def compute_s(seg: ComputeSeg) -> float:
        return secs.get(seg.label, 0.0)
    for t in (0.0, 4.0, 20.0):
        assert (exposed_s(exp.costs, compute_s, lambda seg, t=t: t)
                == exposed_s(plain, compute_s, lambda seg, t=t: t))
    full, collapsed = (simulate(exp, fidelity=f).stats["step_time_s"]
                       for f in ("full", "collapsed"))
    assert collapsed == pytest.approx(full, rel=0.02)
