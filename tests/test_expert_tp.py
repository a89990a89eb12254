"""Expert tensor parallelism (``parallel.expert_tp``, Megatron-core's
``expert_tensor_parallel_size``): the MoE layers' own TP degree, their expert grid, the
all-to-all volumes, expert GEMM shapes and memory, and the errors for bad values."""

from __future__ import annotations

import pytest
from test_differential import _compare

from base.errors import ConfigError
from sim.api import simulate
from sim.experiment import build_experiment
from topologies.placement import Placement
from workloads.lowering.groups import ep_groups, expert_groups, expert_replicas
from workloads.memory import model_state_bytes_per_param
from workloads.program import Collective

TOKENS, H, F, E, K = 1024, 4096, 4096, 8, 2


def _data(expert_tp: int | None, tp: int = 2, dp: int = 4, ep: int = 4, **par: object) -> dict:
    """llama-7b shapes, 2 MoE layers of E = 8 experts top-2 (f_e = 4096), tp·dp GPUs in
    servers of 4 (switch), sequence 1024, micro-batch 1, sequence parallelism."""
    return {"name": "etp",
            "model": {"preset": "llama-7b", "num_layers": 2, "seq_length": TOKENS,
                      "ffn_hidden_size": F, "moe": {"num_experts": E, "top_k": K}},
            "cluster": {"topology": "switch", "num_gpus": tp * dp, "gpus_per_node": 4,
                        "link_bandwidth_GBps": 25, "nvlink_bandwidth_GBps": 300},
            "parallel": {"tp": tp, "pp": 1, "dp": dp, "ep": ep, "sequence_parallel": True,
                         "expert_tp": expert_tp, "zero_stage": 1} | par,
            "training": {"micro_batch_size": 1, "global_batch_size": 2 * dp}}


def _collectives(d: dict) -> list[Collective]:
    return [i for i in simulate(build_experiment(d)).program.instructions
            if isinstance(i, Collective)]


def test_expert_grid_follows_megatron_rank_generator() -> None:
    """TP 2 x DP 4: local index L = tp + 2·dp is the GPU id; with ETP 1, EP 4 the EP groups
    are 4 consecutive GPUs and the expert-DP groups GPUs 4 apart; with ETP = TP the EP group
    is 4 DP ranks of one TP lane (stride 2), no expert-DP replica."""
    p = Placement.from_order("tp-cp-dp-pp", tp=2, cp=1, dp=4, pp=1)
    assert ep_groups(p, 0, 4, 1) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert expert_groups(p, 0, 0, 4, 1) == ((0, 4), (2, 6))
    assert expert_groups(p, 1, 0, 4, 1) == ((1, 5), (3, 7))
    assert expert_replicas(p, 4, 1) == 2
    assert ep_groups(p, 0, 4) == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert expert_replicas(p, 4) == 1
    # ETP = TP names the same groups as the default
    assert ep_groups(p, 0, 4, 2) == ep_groups(p, 0, 4)
    assert all(expert_groups(p, t, 0, 2, 2) == expert_groups(p, t, 0, 2) for t in range(2))
    # ETP 4 > TP 2 with EP 2: the expert TP group spans 2 DP ranks
    assert p.expert_coords(5, 2, 4) == (1, 1, 0)
    assert ep_groups(p, 0, 2, 4) == ((0, 4), (1, 5), (2, 6), (3, 7))


def test_expert_tp_equal_to_tp_is_the_default() -> None:
    base, same = _data(None), _data(2)
    assert build_experiment(same).costs == build_experiment(base).costs
    a, b = simulate(build_experiment(base)), simulate(build_experiment(same))
    assert a.stats == b.stats
    assert a.program.instructions == b.program.instructions


@pytest.mark.parametrize("etp", [1, 2])
def test_dispatch_bytes_do_not_depend_on_expert_tp(etp: int) -> None:
    """Megatron-core's all-to-all dispatcher sends each GPU's b·s/tp sequence-parallel
    tokens' k copies over EP (then gathers the received ones over expert TP): 2·512·2·h
    bytes a GPU for either ETP, over the expert grid's EP groups."""
    a2a = [c for c in _collectives(_data(etp)) if c.op == "all_to_all"]
    assert {c.nbytes for c in a2a} == {2 * TOKENS / 2 * K * H}
    groups = {c.group for c in a2a}
    assert groups == ({(0, 1, 2, 3), (4, 5, 6, 7)} if etp == 1
                      else {(0, 2, 4, 6), (1, 3, 5, 7)})


def test_expert_grads_reduced_over_the_expert_data_parallel_group() -> None:
    """ETP 1: two GPUs hold each expert shard (dp·tp/(etp·ep) = 2), their gradients are
    reduce-scattered over them, 2·(2 layers · E/ep experts · 3·h·f) bytes; ETP 2: one."""
    per_gpu = 2 * 2 * (E / 4) * 3 * H * F
    grads = [c for c in _collectives(_data(1)) if "expert grad" in c.name]
    assert {c.group for c in grads} == {(0, 4), (1, 5), (2, 6), (3, 7)}
    assert {c.nbytes for c in grads} == {per_gpu}
    assert not [c for c in _collectives(_data(2)) if "expert grad" in c.name]


@pytest.mark.parametrize("par", [
    {},
    {"overlap_grad_reduce": True, "grad_bucket_MB": 1.0},
    {"moe_dispatcher": "flex", "moe_a2a_overlap": True},
    {"zero_stage": 3},
])
def test_fast_paths_equal_reference_paths_with_expert_tp(par: dict) -> None:
    """ETP 1 under TP 2 with EP groups across TP lanes: the fast lowering and engine paths
    give the reference's spans, flows and stats at both fidelities."""
    d = _data(1, **par)
    d["schedule"] = "1f1b"
    _compare(d)


def test_expert_memory_closed_form() -> None:
    """Per GPU: E/ep experts of each layer split over ETP (twice as many with ETP 1 as with
    ETP = TP = 2), their fp32 state sharded over the expert-DP group (2 GPUs vs 1); the
    gradient buffer is Megatron-LM's fp32 one under --bf16 (4 bytes a parameter)."""
    one, two = build_experiment(_data(1)).costs, build_experiment(_data(2)).costs
    experts = 2 * (E / 4) * 3 * H * F
    assert one.stage_expert_params(0) == pytest.approx(experts)
    assert two.stage_expert_params(0) == pytest.approx(experts / 2)
    dense = two.stage_params(0) - two.stage_expert_params(0)
    assert one.stage_params(0) - one.stage_expert_params(0) == pytest.approx(dense)
    bpp = model_state_bytes_per_param
    for costs, etp, shards in ((one, 1, 2), (two, 2, 1)):
        assert costs.grad_buffer_bytes == 4.0
        assert costs.static_bytes((0,)) == pytest.approx(
            bpp(1, 4, 4) * dense + bpp(1, shards, 4) * experts / etp)


def test_expert_gemm_shapes_closed_form() -> None:
    """ETP e: each GPU computes n·k·e rows (n = 1024/2 sequence-parallel tokens), 512·e for
    each of its E/ep = 2 experts, of width f/e (gate and up: 2·f/e), reading 1/e of the
    experts' weights: the same FLOPs for every e, e times the weight bytes at e = 1."""
    for etp in (1, 2):
        seg = build_experiment(_data(etp)).costs._expert_gemms()
        _, fc1, fc2 = seg.gemm_dims[:3]
        m = TOKENS / 2 * K * etp / 2
        assert fc1 == pytest.approx(((m * H * 2 * F / etp) ** (1 / 3), 2 * 2 * m * H * 2 * F / etp))
        assert fc2 == pytest.approx(((m * F / etp * H) ** (1 / 3), 2 * 2 * m * F / etp * H))
        assert fc1[1] == pytest.approx(2 * 2 * (TOKENS / 2) * K * H * 2 * F / 2)  # e-free
        rows = 2 * m
        assert seg.hbm_bytes == pytest.approx(2 * (2 * H * F * 3 / etp + H * E + rows * (
            H + 2 * 2 * F / etp + 2 * F / etp + H)))


def test_expert_tp_without_expert_parallelism() -> None:
    """EP 1, ETP 2 over TP 1 x DP 8: every GPU holds half of every expert, reduced apart from
    the dense state over the 4 GPUs holding the same half (every other DP rank)."""
    d = _data(2, tp=1, dp=8, ep=1)
    costs = build_experiment(d).costs
    assert costs.stage_expert_params(0) == pytest.approx(2 * E * 3 * H * F / 2)
    assert costs._expert_shards == 4
    grads = [c for c in _collectives(d) if "expert grad" in c.name]
    assert {c.group for c in grads} == {(0, 2, 4, 6), (1, 3, 5, 7)}
    assert not [c for c in _collectives(d) if c.op == "all_to_all"]


@pytest.mark.parametrize(("data", "match"), [
    ({"model": {"preset": "llama-7b", "num_layers": 2}}, "mixture-of-experts"),
    ({"parallel": {"dp": 2, "ep": 8}}, r"expert_tp\*ep = 1\*8 does not divide tp\*dp = 2\*2"),
    ({"parallel": {"tp": 4, "dp": 2, "ep": 2}}, "must be a multiple of tp=4"),
    ({"parallel": {"sequence_parallel": False}}, "sequence_parallel"),
    ({"parallel": {"pp": 2, "placement": "tp-cp-pp-dp"}}, "pp not outermost"),
    ({"model": {"preset": "llama-7b", "num_layers": 2, "seq_length": TOKENS,
                "moe": {"num_experts": E, "top_k": K, "expert_ffn_hidden_size": 4094}},
      "parallel": {"expert_tp": 4, "ep": 1}}, "does not divide model.moe"),
    ({"parallel": {"tp": 1, "dp": 8, "ep": 1, "expert_tp": 2, "zero_stage": 0,
                   "dp_mode": "parameter_server", "ps_servers": 4}}, "dp_mode"),
    ({"parallel": {"expert_tp": 0}}, "expert_tp"),
])
def test_bad_expert_tp_is_a_config_error(data: dict, match: str) -> None:
    d = _data(1)
    for section, value in data.items():
        d[section] = value if section == "model" and "preset" in value else d[section] | value
    par = d["parallel"]
    d["cluster"]["num_gpus"] = (par["tp"] * par["dp"] * par["pp"]
                                + par.get("ps_servers", 0))
    with pytest.raises(ConfigError, match=match):
        build_experiment(d)
