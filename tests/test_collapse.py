"""Differential tests: collapsed simulation (one GPU per pipeline rank) against full simulation.

A collapsed run (``fidelity="collapsed"``, :class:`workloads.lowering.Collapse`)
simulates the GPU of TP rank 0, DP rank 0 of each pipeline rank. It folds the
TP collectives between an op's compute segments into the op as blocking
communication, keeps an op's leading and closing collectives as separate
instructions (the next op's compute overlaps a closing all-reduce in the full
program too), and gives DP collectives and pipeline sends durations timed by
:class:`sim.commtime.CollectiveTimer` with every replica's copy running at once
on the real topology.

What it cannot see is contention *between different kinds of traffic*: the DP
reduce-scatter of a stage against the last gradient send of the same GPU on
its NIC or NVSwitch port, a DP collective of one interleaved chunk against the
TP all-reduces of the other chunk's backwards, a rank's two concurrent sends
(forward to r+1, backward to r-1) sharing its port. Hence two kinds of test:

* exact (1e-9): layouts and topologies where nothing contends, or where
  contention is only among replicas of the same collective (which the timer
  includes): any layout on a full mesh (every ordered GPU pair has its own
  link), pipelines on DGX A100 whose TP groups sit inside a server (NVLink)
  and whose stages talk across servers (NIC).
* close: TP/PP/DP layouts on DGX A100 servers where sends, TP and DP traffic
  share ports. Measured differences (gpt3-1.3b shapes, 8-16 layers, up to 128
  GPUs, 1f1b / gpipe / interleaved / zb-h1, ZeRO 0 and 1): step time at most
  0.85 % (1x8x16 interleaved; collapsed is faster, as it misses contention),
  bubble fraction 0.5 % absolute, exposed communication per kind 0.85 % of the
  step; compute time and peak memory exact. Tolerance: 2 % of the step. A
  missed overlap lasts at most as long as the transfers involved (a send, a DP
  collective), a small share of a step that has m >= 2p micro-batches.

One statistic differs by construction even where nothing contends, so it is
compared only with ``tp = 1``: the exposure of pipeline and DP transfers. A
folded op is drawn as its compute followed by its blocking communication,
while in the full timeline they interleave, so a transfer overlapping the op
is attributed to compute-idle time differently (the totals are equal).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.api import simulate
from sim.commtime import CollectiveTimer
from sim.engine import EngineCounters, simulate_program
from sim.experiment import Experiment
from sim.network import FlowNetwork, max_min_rates

EXACT = 1e-9
CLOSE = 0.02
"""Tolerance of the contended layouts, as a fraction of the step (module docstring)."""

NUMERIC = ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "bubble_fraction",
           "bubble_ratio", "peak_memory_gib", "compute_busy_s_mean")

MESH = {"topology": "full-mesh", "link_bandwidth_GBps": 100.0, "link_latency_us": 2.0,
        "collective_launch_us": 8.4, "collective_step_us": 1.0}
"""Every ordered GPU pair has a private link: transfers between different pairs never share."""


def experiment(tp: int, pp: int, dp: int, schedule: str = "1f1b", *, vpp: int = 1,
               layers: int = 8, cluster: dict | None = None, sp: bool = False,
               zero: int = 1, m: int | None = None, **parallel: Any) -> Experiment:
    """GPT-3 1.3B shapes (fewer layers), sequence 1024, micro-batch 1, m = 2p by default."""
    c = {"preset": "dgx-a100-80g"} if cluster is None else dict(cluster)
    c["num_gpus"] = tp * pp * dp
    return Experiment.from_dict({
        "name": f"tp{tp}-pp{pp}-dp{dp}-{schedule}",
        "model": {"preset": "gpt3-1.3b", "num_layers": layers, "seq_length": 1024},
        "cluster": c,
        "parallel": {"tp": tp, "pp": pp, "dp": dp, "vpp": vpp, "sequence_parallel": sp,
                     "zero_stage": zero, **parallel},
        "training": {"micro_batch_size": 1, "global_batch_size": dp * (m or 2 * pp)},
        "schedule": schedule,
    })


def both(exp: Experiment) -> tuple[dict[str, Any], dict[str, Any]]:
    full = simulate(exp, fidelity="full").stats
    collapsed = simulate(exp, fidelity="collapsed").stats
    assert full["fidelity"] == "full" and collapsed["fidelity"] == "collapsed"
    return full, collapsed


def differences(full: dict[str, Any], collapsed: dict[str, Any]) -> dict[str, float]:
    """Relative differences of the numeric stats; exposure and bubble as fractions of the step."""
    step = full["step_time_s"]
    out = {}
    for key in NUMERIC:
        a, b = full[key], collapsed[key]
        if key == "bubble_fraction":
            out[key] = abs(b - a)
        elif a is None or b is None:
            assert a is b, key
        else:
            out[key] = abs(b - a) / abs(a) if a else abs(b)
    pairs = zip(full["peak_memory_per_stage_gib"], collapsed["peak_memory_per_stage_gib"],
                strict=True)
    for stage, (a, b) in enumerate(pairs):
        out[f"peak_memory_stage{stage}"] = abs(b - a) / a
    for kind, a in full["exposed_comm_s"].items():
        out[f"exposed_{kind}"] = abs(collapsed["exposed_comm_s"][kind] - a) / step
    return out


def assert_agree(exp: Experiment, tol: float, *, exact_keys: tuple[str, ...] = (),
                 skip: tuple[str, ...] = ()) -> dict[str, float]:
    full, collapsed = both(exp)
    diff = differences(full, collapsed)
    for key, value in diff.items():
        if key in skip:
            continue
        limit = EXACT if key in exact_keys or key.startswith("peak_memory") else tol
        assert value <= limit, f"{exp.name}: {key} differs by {value:.3g} (> {limit:g})"
    return diff


_REFIT = ("departs at the A100 fit of 2026-12-06 (wp-gemm: d½ 1313, faster small GEMMs; "
          "passes with d½ 2209, whatever η): {}; a gap of the collapsed lowering the new "
          "constants expose, left for a fix (docs/accuracy.md, the sweep's gradient accumulation)")


# ----------------------------------------------------------------------------- exact


@pytest.mark.parametrize("schedule,vpp", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2),
                                          ("zb-h1", 1)])
@pytest.mark.parametrize("tp,pp,dp,sp", [(1, 4, 2, False), (2, 4, 2, False), (2, 4, 2, True),
                                         (4, 2, 2, True), (2, 2, 4, False)])
def test_exact_on_a_full_mesh(tp: int, pp: int, dp: int, sp: bool, schedule: str,
                              vpp: int) -> None:
    """No two transfers between different GPU pairs share a link: every statistic agrees
    to 1e-9 (pipeline/DP exposure with tp = 1 only, see the module docstring)."""
    skip = () if tp == 1 else ("exposed_pp", "exposed_dp")
    assert_agree(experiment(tp, pp, dp, schedule, vpp=vpp, cluster=MESH, sp=sp), EXACT,
                 skip=skip)


def test_exact_on_a_128_gpu_full_mesh() -> None:
    assert_agree(experiment(4, 4, 8, "1f1b", cluster=MESH, m=4), EXACT,
                 skip=("exposed_pp", "exposed_dp"))


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb-h1"])
@pytest.mark.parametrize("pp", [2, 4])
def test_exact_for_plain_pipelines_on_dgx(pp: int, schedule: str) -> None:
    """tp = dp = 1 inside one DGX A100 server: only pipeline sends, one at a time per port."""
    assert_agree(experiment(1, pp, 1, schedule), EXACT)


@pytest.mark.parametrize("schedule", ["1f1b", pytest.param("zb-h1", marks=pytest.mark.xfail(
    strict=True, reason=_REFIT.format("step 4.3e-4 apart")))])
def test_exact_with_tp_in_servers_and_pp_across(schedule: str) -> None:
    """TP = 8 fills a server (NVLink), stages talk over the NICs, DP = 1: nothing shared.

    Small layers make the closing all-reduce of one op outlast the first compute
    segment of the next, so the collapsed lowering must emit the split form of
    the op (the first inner all-reduce queues behind it on the TP stream).
    """
    assert_agree(experiment(8, 4, 1, schedule), EXACT, skip=("exposed_pp",))


def test_exact_zero_bubble_with_dp_on_dgx() -> None:
    """zb-h1 reduces a stage's gradients after its last W, when its sends are done: exact
    even with DP groups across servers (ZeRO-1 reduce-scatter, parameter all-gather), with
    the sends beside the compute. Under the default profile's blocking sends (Megatron-LM
    without a virtual pipeline, ``pp_send_blocking``) each sender waits for its message,
    whose flows share the NICs with the DP collectives at full fidelity: within CLOSE."""
    exp = experiment(2, 4, 16, "zb-h1", layers=16)
    free = dataclasses.replace(exp, costs=dataclasses.replace(exp.costs, pp_send_blocking=False))
    assert_agree(free, EXACT, skip=("exposed_pp",))
    assert_agree(exp, CLOSE, skip=("exposed_pp",))


@pytest.mark.parametrize("schedule,vpp", [("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)])
@pytest.mark.parametrize("tp,pp,dp,sp", [(1, 2, 2, False), (2, 2, 2, True), (2, 4, 2, False)])
@pytest.mark.parametrize("dp_mode", [{"zero": 3}, {"zero": 0, "overlap_grad_reduce": True},
                                     {"zero": 1, "overlap_grad_reduce": True,
                                      "grad_bucket_MB": 40.0}])
def test_exact_zero3_and_bucketed_reduction_on_a_full_mesh(
        tp: int, pp: int, dp: int, sp: bool, schedule: str, vpp: int,
        dp_mode: dict[str, Any]) -> None:
    """ZeRO-3's per-layer gathers and reduce-scatters and overlapped gradient buckets are DP
    collectives inside ops: the collapsed lowering cuts the op at them the way the full one
    does, so on a full mesh everything agrees (DP exposure with tp = 1 only, as above)."""
    skip = () if tp == 1 else ("exposed_pp", "exposed_dp")
    exp = experiment(tp, pp, dp, schedule, vpp=vpp, cluster=MESH, sp=sp, **dp_mode)
    assert_agree(exp, EXACT, skip=skip)


def cp_experiment(tp: int, cp: int, pp: int, dp: int, schedule: str = "1f1b", vpp: int = 1,
                  **parallel: Any) -> Experiment:
    return Experiment.from_dict({
        "name": f"tp{tp}-cp{cp}-pp{pp}-dp{dp}-{schedule}",
        "model": {"preset": "gpt3-1.3b", "num_layers": 4, "seq_length": 4096},
        "cluster": MESH | {"num_gpus": tp * cp * pp * dp},
        "parallel": {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "vpp": vpp, **parallel},
        "training": {"micro_batch_size": 1, "global_batch_size": dp * 2 * pp},
        "schedule": schedule,
    })


@pytest.mark.parametrize("tp,cp,pp,dp,schedule,vpp,extra,tol", [
    (1, 2, 2, 1, "1f1b", 1, {}, EXACT),
    (1, 4, 1, 2, "1f1b", 1, {"zero_stage": 0}, EXACT),
    (2, 2, 2, 1, "zb-h1", 1, {"sequence_parallel": True}, EXACT),
    # Megatron-core reduces each later chunk's gradients as one bucket after its last
    # backward, so rank 1's whole-stage reduce-scatter (over the DP x CP group, GPUs 4-7
    # in a ring 4>5>6>7) runs beside the ring passes of its other chunk's backward. With
    # CP inside DP (the default placement) the pass 4>5 shares its link with the ring's
    # step 4>5: both slower in the full program, neither collapsed (it times each kind
    # alone), the step 0.3 % apart (0.15 % before the first stage's backward counted the
    # embedding's dense gradient, which lengthens the time the two share; the bubble ratio,
    # relative to its 0.55, 0.9 %). With DP inside CP the CP pairs (4, 6), (5, 7) use
    # links the ring does not: exact.
    (1, 2, 2, 2, "interleaved", 2, {"overlap_grad_reduce": True,
                                    "placement": "tp-dp-cp-pp"}, EXACT),
    (1, 2, 2, 2, "interleaved", 2, {"overlap_grad_reduce": True}, 1e-2),
])
def test_exact_context_parallel_on_a_full_mesh(tp: int, cp: int, pp: int, dp: int,
                                               schedule: str, vpp: int,
                                               extra: dict[str, Any], tol: float) -> None:
    """Ring attention's passes (point-to-point in the full program, one timed pass of the
    representative GPU collapsed) agree exactly where nothing else shares their links."""
    skip = () if tp == 1 else ("exposed_pp", "exposed_dp", "exposed_cp")
    assert_agree(cp_experiment(tp, cp, pp, dp, schedule, vpp, **extra), tol, skip=skip)


@pytest.mark.parametrize("tp,pp,dp,ep,schedule,vpp,overlap", [
    (1, 2, 4, 2, "1f1b", 1, False), (1, 1, 4, 4, "1f1b", 1, False),
    pytest.param(1, 2, 2, 2, "interleaved", 2, False, marks=pytest.mark.xfail(
        strict=True, reason=_REFIT.format("step 1.1e-3 apart"))),
    (2, 2, 4, 2, "zb-h1", 1, False),
    (2, 1, 4, 2, "zb-h1", 1, True),
])
def test_exact_expert_parallel_on_a_full_mesh(tp: int, pp: int, dp: int, ep: int,
                                              schedule: str, vpp: int, overlap: bool) -> None:
    """MoE all-to-alls over EP groups (timed with every EP group of the rank when
    collapsed) and expert gradients over the expert-data-parallel groups. The all-to-alls
    sit between an op's compute segments, so, as with TP, pipeline and DP exposure is not
    compared; TP and EP exposure is, each of its own kind (regression: a folded op with
    both once reported all of its blocking communication as ``tp``)."""
    exp = Experiment.from_dict({
        "name": f"tp{tp}-pp{pp}-dp{dp}-ep{ep}-{schedule}",
        "model": {"preset": "gpt3-1.3b", "num_layers": 4, "seq_length": 1024,
                  "moe": {"num_experts": 4, "top_k": 2}},
        "cluster": MESH | {"num_gpus": tp * pp * dp},
        "parallel": {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "vpp": vpp,
                     "overlap_grad_reduce": overlap, "grad_bucket_MB": 40.0},
        "training": {"micro_batch_size": 1, "global_batch_size": dp * 2 * pp},
        "schedule": schedule,
    })
    assert_agree(exp, EXACT, skip=("exposed_pp", "exposed_dp"))


@pytest.mark.parametrize("pp,parallel", [
    (2, {"overlap_grad_reduce": True, "grad_bucket_MB": 40.0}),
    (1, {"zero_stage": 3}),
])
def test_close_expert_parallel_with_dp_traffic_during_compute(pp: int,
                                                              parallel: dict[str, Any]) -> None:
    """DP collectives that run during the compute share pair links with the EP all-to-alls
    (the DP ring 0-1-2-3 and the EP groups 0-1, 2-3), a contention between kinds the
    collapsed run does not see: the last backward's buckets while the other stage still
    runs all-to-alls (measured 0.05 % of the step), ZeRO-3's gathers and reduce-scatters
    (1.0 %; the bubble ratio, idle / busy, is small here and compared as the bubble
    fraction only)."""
    exp = Experiment.from_dict({
        "name": f"tp1-pp{pp}-dp4-ep2",
        "model": {"preset": "gpt3-1.3b", "num_layers": 4, "seq_length": 1024,
                  "moe": {"num_experts": 4, "top_k": 2}},
        "cluster": MESH | {"num_gpus": 4 * pp},
        "parallel": {"pp": pp, "dp": 4, "ep": 2, **parallel},
        "training": {"micro_batch_size": 1, "global_batch_size": 4 * 2 * pp},
    })
    assert_agree(exp, CLOSE, exact_keys=("compute_busy_s_mean",),
                 skip=("exposed_pp", "exposed_dp", "exposed_ep", "exposed_tp",
                       "bubble_ratio"))


@pytest.mark.xfail(strict=True, reason=_REFIT.format("step 2.07% apart, CLOSE 2%"))
def test_close_zero3_with_context_parallel() -> None:
    """ZeRO-3 gathers over the DP x CP group share links with the CP ring passes, a
    contention between kinds the collapsed run does not see (module docstring). Measured:
    step 1.5 % apart; the bubble ratio (idle / busy, small here) is compared as the
    bubble fraction only; exposure is compared with tp = 1 only (above)."""
    assert_agree(cp_experiment(2, 2, 1, 2, zero_stage=3), CLOSE,
                 exact_keys=("compute_busy_s_mean",),
                 skip=("bubble_ratio", "exposed_pp", "exposed_dp", "exposed_cp"))


@pytest.mark.parametrize("schedule,tp,pp,vpp,parallel", [
    ("dualpipe-v", 4, 2, 2, {}),
    ("gpipe", 2, 1, 1, {}),
    ("dualpipe-v", 2, 2, 2, {"cp": 2}),
    ("dualpipe-v", 2, 2, 2, {"dp": 2, "ep": 2}),
    ("dualpipe-v", 2, 2, 2, {"dp": 2, "overlap_grad_reduce": True}),
])
def test_exact_when_a_leading_all_gather_follows_folded_collectives(
        schedule: str, tp: int, pp: int, vpp: int, parallel: dict[str, Any]) -> None:
    """Regression: an op's leading SP all-gather queues on the TP stream behind the rank's
    previous TP collective. When that one was folded into an earlier op's compute (the last
    stage's forward ends in the head, after its last collective) and the op does not wait
    for that op (DualPipe-V's fused F&B; GPipe's forwards one after the other on one rank),
    the collapsed program once let the all-gather start early: 0.55 % too fast
    (dualpipe-v, tp 4), 0.4 % with EP, 0.1 % with CP, where nothing contends. The
    collapsed lowering cuts that earlier op's compute at its last collective instead,
    on the plain op loop, its array form (gpipe) and in pieces (CP, EP, buckets)."""
    model: dict[str, Any] = {"preset": "gpt3-1.3b", "num_layers": 4, "seq_length": 1024,
                             "vocab_size": 1024}  # a small head: little compute after it
    if "ep" in parallel:
        model["moe"] = {"num_experts": 4, "top_k": 2}
    dp, cp = parallel.get("dp", 1), parallel.get("cp", 1)
    exp = Experiment.from_dict({
        "name": f"{schedule}-tp{tp}-pp{pp}-sp", "model": model,
        "cluster": MESH | {"num_gpus": tp * pp * dp * cp},
        "parallel": {"tp": tp, "pp": pp, "vpp": vpp, "sequence_parallel": True, **parallel},
        "training": {"micro_batch_size": 1, "global_batch_size": dp * 4 * pp},
        "schedule": schedule,
    })
    assert_agree(exp, EXACT, skip=("exposed_pp", "exposed_dp", "exposed_cp"))


# ----------------------------------------------------------------------------- close


@pytest.mark.parametrize("tp,pp,dp,schedule,vpp,zero", [
    (1, 4, 2, "1f1b", 1, 1),
    (1, 4, 2, "interleaved", 2, 1),
    (8, 2, 2, "interleaved", 2, 1),
    (4, 2, 4, "gpipe", 1, 0),
    (2, 8, 8, "1f1b", 1, 1),
    (1, 8, 16, "interleaved", 2, 1),
])
def test_close_on_dgx_a100(tp: int, pp: int, dp: int, schedule: str, vpp: int,
                           zero: int) -> None:
    """Contended layouts on DGX A100 servers: within 2 % of the step (module docstring);
    compute time and peak memory still exact."""
    exp = experiment(tp, pp, dp, schedule, vpp=vpp, layers=16, zero=zero)
    assert_agree(exp, CLOSE, exact_keys=("compute_busy_s_mean",))


@pytest.mark.parametrize("tp,pp,dp", [(2, 2, 8), (1, 4, 8)])
def test_close_on_servers_sharing_nics(tp: int, pp: int, dp: int) -> None:
    """Two NICs per server (cluster.nics_per_node), each shared by four GPUs' DP rings and
    pipeline sends: within 2 % of the step, as on DGX servers."""
    exp = experiment(tp, pp, dp, layers=16, cluster={"preset": "dgx-a100-80g",
                                                     "nics_per_node": 2})
    assert_agree(exp, CLOSE, exact_keys=("compute_busy_s_mean",))


def test_collapse_simulates_one_gpu_per_pipeline_rank() -> None:
    exp = experiment(2, 4, 4)
    full = simulate(exp, fidelity="full")
    collapsed = simulate(exp, fidelity="collapsed")
    assert collapsed.timeline.simulated_gpus == tuple(exp.placement.gpu(pp=r) for r in range(4))
    assert len(collapsed.program.instructions) * 4 < len(full.program.instructions)


def test_a_shared_collective_timer_gives_the_fresh_timers_stats() -> None:
    """sim search shares one timer across layouts on its cluster: same floats, fewer timings."""
    import json

    first = experiment(2, 4, 4, zero=1)
    timer = CollectiveTimer(first.cluster)
    for exp in (first, first.with_changes({"parallel.zero_stage": 2}),
                first.with_changes({"parallel.tp": 4, "parallel.dp": 2})):
        exp = dataclasses.replace(exp, cluster=first.cluster)
        fresh = simulate(exp, fidelity="collapsed").stats
        shared = simulate(exp, fidelity="collapsed", collective_timer=timer).stats
        assert json.dumps(shared, sort_keys=True) == json.dumps(fresh, sort_keys=True)
    reused = len(timer._cache)
    simulate(first, fidelity="collapsed", collective_timer=timer)
    assert len(timer._cache) == reused > 0  # the repeat layout timed nothing new
    # an equal cluster, but another object (experiments of one description share theirs)
    other = dataclasses.replace(first, cluster=first.cluster.with_link_changes())
    with pytest.raises(ValueError, match="another cluster"):
        simulate(other, fidelity="collapsed", collective_timer=timer)


@pytest.mark.parametrize("schedule,vpp,sp", [("1f1b", 1, False), ("interleaved", 2, True),
                                             ("zb-h1", 1, False), ("dualpipe-v", 2, False)])
def test_queue_free_run_equals_the_event_queue(schedule: str, vpp: int, sp: bool) -> None:
    """A collapsed program has no flows, so the engine evaluates it without the event queue;
    the timeline (floats, order, memory samples, arrows) and event count are identical."""
    exp = experiment(4, 4, 2, schedule, vpp=vpp, sp=sp)
    program = simulate(exp, fidelity="collapsed").program
    runs = []
    for queue in (False, True):
        counters = EngineCounters()
        timeline = simulate_program(program, exp.cluster, lambda ins: ins.duration_s or 0.0,
                                    counters, event_queue=queue)
        runs.append((timeline, counters.events))
    assert runs[0] == runs[1]
    assert runs[0][1] > 0


# ----------------------------------------------------------------------------- network


def reference_flow_ends(flows: list[tuple[float, tuple[int, ...], float]],
                        caps: list[float]) -> list[float]:
    """When each flow ends, recomputing every rate globally at every start and end (the
    straightforward loop the incremental :class:`sim.network.FlowNetwork` must match)."""
    remaining = {i: nbytes for i, (_, _, nbytes) in enumerate(flows)}
    ends = [math.inf] * len(flows)
    pending = sorted((start, i) for i, (start, _, _) in enumerate(flows))
    active: dict[int, tuple[int, ...]] = {}
    now, k = 0.0, 0
    while k < len(pending) or active:
        rates = max_min_rates(active, caps)
        t_end = min((now + remaining[i] / rates[i] for i in active), default=math.inf)
        t_start = pending[k][0] if k < len(pending) else math.inf
        t = min(t_end, t_start)
        for i in active:
            remaining[i] -= rates[i] * (t - now)
        now = t
        for i in [i for i in active if remaining[i] <= 1e-9 * flows[i][2]]:
            del active[i]
            ends[i] = now
        while k < len(pending) and pending[k][0] <= now:
            active[pending[k][1]] = flows[pending[k][1]][1]
            k += 1
    return ends


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 3.0), st.lists(st.integers(0, 5), min_size=1,
                                                          max_size=3, unique=True),
                          st.floats(0.1, 10.0)), min_size=1, max_size=10),
       st.lists(st.floats(0.5, 4.0), min_size=6, max_size=6))
def test_incremental_max_min_matches_global_recomputation(raw: list, caps: list[float]) -> None:
    """The network re-rates only the component of flows a start or end touches; flow end
    times equal a loop that recomputes every rate globally."""
    flows = [(start, tuple(links), nbytes) for start, links, nbytes in raw]
    expected = reference_flow_ends(flows, caps)
    net = FlowNetwork(caps)
    pending = sorted((start, i) for i, (start, _, _) in enumerate(flows))
    ends = [math.inf] * len(flows)
    k = 0
    while k < len(pending) or net.active:
        t_start = pending[k][0] if k < len(pending) else math.inf
        if t_start <= net.next_end_s():
            while k < len(pending) and pending[k][0] <= t_start:
                _, i = pending[k]
                net.start(t_start, i, flows[i][1], flows[i][2])
                k += 1
            net.refresh(t_start)
        else:
            now = net.next_end_s()
            for i in net.finish_due(now):
                ends[i] = now
    for got, want in zip(ends, expected, strict=True):
        assert math.isclose(got, want, rel_tol=1e-7), (ends, expected)
