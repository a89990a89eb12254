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
  link) without DP beside EP or CP, a pipeline of two stages on DGX A100 whose
  TP groups sit inside a server (NVLink) and whose stages talk across servers
  (NIC); and layouts whose contended channels are never busy at once, which
  holds at some device constants and not at others (a middle stage's two
  incoming messages on its NIC, DP and EP on one pair link): there
  :func:`assert_agree` claims exactness only where the collapsed timeline shows
  no such overlap (``O`` = 0, ``tests/test_fidelity.py``'s proof), else the
  bound ``C``, and :func:`test_exact_cases_under_scaled_device_profiles` runs
  those cases with the GEMM and attention constants scaled (issue 22).
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
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_fidelity import measure_both

from sim.api import simulate
from sim.commtime import CollectiveTimer
from sim.device import DeviceProfile
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


def both(exp: Experiment, profile: DeviceProfile | None = None
         ) -> tuple[dict[str, Any], dict[str, Any]]:
    full = simulate(exp, profile, fidelity="full").stats
    collapsed = simulate(exp, profile, fidelity="collapsed").stats
    assert full["fidelity"] == "full" and collapsed["fidelity"] == "collapsed"
    return full, collapsed


class Contention(NamedTuple):
    """What a collapsed run leaves out (``tests/test_fidelity.py``'s docstring), in seconds."""

    bound_s: float
    """``C`` + ``A``: the contended channels' summed span time and the replicas' spread."""
    overlap_s: float
    """``O``: how long contended channels are busy at once in the collapsed timeline."""
    folded_s: float
    """``F``: the largest rank's folded (blocking) communication."""


def both_with_contention(exp: Experiment, profile: DeviceProfile | None = None
                         ) -> tuple[dict[str, Any], dict[str, Any], Contention]:
    """:func:`both`, and the collapsed run's :class:`Contention` (its collectives timed by
    ``tests/test_fidelity.py``'s recorder: the same floats as the shared timer's)."""
    full, collapsed, bound, overlap, folded, spread = measure_both(exp, profile)
    assert full["fidelity"] == "full" and collapsed["fidelity"] == "collapsed"
    return full, collapsed, Contention(bound + spread, overlap, folded)


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


TOUCHING = 1e-12
"""``O`` below this fraction of the step is spans that touch, their ends summed along
different paths (a few ulps apart), not contended channels busy at once."""


def assert_agree(exp: Experiment, tol: float, *, exact_keys: tuple[str, ...] = (),
                 skip: tuple[str, ...] = (), profile: DeviceProfile | None = None
                 ) -> dict[str, float]:
    """Full and collapsed stats of ``exp`` (with ``profile``, None: each GPU's shipped one)
    agree to ``tol`` (memory and ``exact_keys`` to :data:`EXACT`), ``skip`` left out.

    With ``tol`` = :data:`EXACT` the claim is the proven one (``tests/test_fidelity.py``):
    exact where no two contended channels are busy at once (``O`` = 0), which holds at any
    device constants where no channels contend (``C`` = 0: a full mesh without DP beside
    EP or CP, a pipeline of two ranks). Where they contend, ``O`` = 0 depends on the
    timing: two stages' messages into one GPU's NIC (TP 8 x PP 4 on DGX servers) miss each
    other at the shipped A100 constants, not at others (issue 22). Where ``O`` > 0, the step
    and exposure are held to ``C + A`` (+ ``F`` for kinds other than TP and EP), the
    statistics derived from the step and the idle time are not compared, compute time and
    memory stay exact."""
    if tol != EXACT:
        full, collapsed = both(exp, profile)
        contention = None
    else:
        full, collapsed, contention = both_with_contention(exp, profile)
    diff = differences(full, collapsed)
    step = full["step_time_s"]
    limits = {}
    if contention is not None and contention.overlap_s > TOUCHING * step:
        bound = contention.bound_s / step
        limits = {"step_time_s": bound, "compute_busy_s_mean": EXACT}
        for key in diff:
            if key.startswith("exposed_"):
                tp_ep = key in ("exposed_tp", "exposed_ep")
                limits[key] = bound + (0.0 if tp_ep else contention.folded_s / step) + EXACT
        skip = (*skip, *(key for key in NUMERIC if key not in limits))
    for key, value in diff.items():
        if key in skip:
            continue
        limit = limits.get(key, EXACT if key in exact_keys or key.startswith("peak_memory")
                           else tol)
        assert value <= limit, f"{exp.name}: {key} differs by {value:.3g} (> {limit:g}; " \
            f"{contention})"
    return diff


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


@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_exact_with_tp_in_servers_and_pp_across(schedule: str, pp: int) -> None:
    """TP = 8 fills a server (NVLink), stages talk over the NICs, DP = 1.

    Small layers make the closing all-reduce of one op outlast the first compute
    segment of the next, so the collapsed lowering must emit the split form of
    the op (the first inner all-reduce queues behind it on the TP stream). (Measured
    while fixing issue 22: a lowering that never splits is still exact here, each op
    waiting for its message or leading with the embedding's all-reduce;
    :func:`split_experiment` is a case where the split counts.)

    With two stages nothing is shared (``C`` = 0: exact at any device constants). With
    four, a middle stage's GPU receives the activation of the stage before it and the
    gradient of the stage after it through its one NIC (the link fabric -> NIC -> GPU),
    and sends both ways through it: contended channels the collapsed run times apart.
    At the shipped A100 constants no two of those messages are ever in flight together
    (``O`` = 0: exact); at others they are (issue 22: η_gemm 0.897 and d½ 1313 put zb-h1's
    1F3 activation into stage 2 beside 3B1's gradient, both 10.7 us slower in the full
    run, the step 0.05 % apart), and :func:`assert_agree` holds them to ``C``.
    """
    assert_agree(experiment(8, pp, 1, schedule), EXACT, skip=("exposed_pp",))


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
    (1, 2, 2, 2, "interleaved", 2, False), (2, 2, 4, 2, "zb-h1", 1, False),
    (2, 1, 4, 2, "zb-h1", 1, True),
])
def test_exact_expert_parallel_on_a_full_mesh(tp: int, pp: int, dp: int, ep: int,
                                              schedule: str, vpp: int, overlap: bool) -> None:
    """MoE all-to-alls over EP groups (timed with every EP group of the rank when
    collapsed) and expert gradients over the expert-data-parallel groups. The all-to-alls
    sit between an op's compute segments, so, as with TP, pipeline and DP exposure is not
    compared; TP and EP exposure is, each of its own kind (regression: a folded op with
    both once reported all of its blocking communication as ``tp``).

    With tp = 1, pp = 2, dp = ep = 2 the DP group is the EP group, so the dense gradients'
    all-reduce and the all-to-alls share the pair links: contended channels, never busy at
    once at the shipped A100 constants (exact), at others they are (issue 22: 0.11 % apart
    with η_gemm 0.897, d½ 1313, within ``C``; :func:`assert_agree`)."""
    assert_agree(ep_experiment(tp, pp, dp, ep, schedule, vpp, overlap), EXACT,
                 skip=("exposed_pp", "exposed_dp"))


def ep_experiment(tp: int, pp: int, dp: int, ep: int, schedule: str, vpp: int,
                  overlap: bool) -> Experiment:
    """A 4-layer MoE GPT-3 1.3B (4 experts, top 2) on :data:`MESH`, m = 2 p."""
    return Experiment.from_dict({
        "name": f"tp{tp}-pp{pp}-dp{dp}-ep{ep}-{schedule}",
        "model": {"preset": "gpt3-1.3b", "num_layers": 4, "seq_length": 1024,
                  "moe": {"num_experts": 4, "top_k": 2}},
        "cluster": MESH | {"num_gpus": tp * pp * dp},
        "parallel": {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "vpp": vpp,
                     "overlap_grad_reduce": overlap, "grad_bucket_MB": 40.0},
        "training": {"micro_batch_size": 1, "global_batch_size": dp * 2 * pp},
        "schedule": schedule,
    })


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


ZERO3_CP_MEASURED = 0.025
"""The step difference of :func:`test_close_zero3_with_context_parallel` as measured, with a
margin: 1.34 % at the A100 fit of 2026-12-03, 2.05 % at that of 2026-12-06 (η_gemm 0.897,
d½ 1313). A figure that moves with the device constants, not a bound (``C`` is)."""


def test_close_zero3_with_context_parallel() -> None:
    """ZeRO-3 gathers over the DP x CP group share links with the CP ring passes, a
    contention between kinds the collapsed run does not see (module docstring). The claim
    is the proven one: within ``C`` (here half the step) where contended channels overlap
    (:func:`assert_agree` with :data:`EXACT`; the same under scaled constants,
    :func:`test_exact_cases_under_scaled_device_profiles`); the step as measured is held to
    :data:`ZERO3_CP_MEASURED`, the bubble fraction and exposure of TP to :data:`CLOSE`
    (the bubble ratio, idle / busy, small here, is compared as the bubble fraction only;
    exposure of the other kinds with tp = 1 only, above)."""
    exp = cp_experiment(2, 2, 1, 2, zero_stage=3)
    assert_agree(exp, EXACT, skip=("bubble_ratio", "exposed_pp", "exposed_dp", "exposed_cp"))
    diff = assert_agree(exp, CLOSE, exact_keys=("compute_busy_s_mean",),
                        skip=("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu",
                              "bubble_ratio", "exposed_pp", "exposed_dp", "exposed_cp"))
    for key in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu"):
        assert diff[key] <= ZERO3_CP_MEASURED, (key, diff[key])


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
    assert_agree(sp_experiment(schedule, tp, pp, vpp, **parallel), EXACT,
                 skip=("exposed_pp", "exposed_dp", "exposed_cp"))


def sp_experiment(schedule: str, tp: int, pp: int, vpp: int, **parallel: Any) -> Experiment:
    """Sequence parallelism on :data:`MESH`, 4 layers, a small head, m = 4 p (MoE with EP)."""
    model: dict[str, Any] = {"preset": "gpt3-1.3b", "num_layers": 4, "seq_length": 1024,
                             "vocab_size": 1024}  # a small head: little compute after it
    if "ep" in parallel:
        model["moe"] = {"num_experts": 4, "top_k": 2}
    dp, cp = parallel.get("dp", 1), parallel.get("cp", 1)
    return Experiment.from_dict({
        "name": f"{schedule}-tp{tp}-pp{pp}-sp", "model": model,
        "cluster": MESH | {"num_gpus": tp * pp * dp * cp},
        "parallel": {"tp": tp, "pp": pp, "vpp": vpp, "sequence_parallel": True, **parallel},
        "training": {"micro_batch_size": 1, "global_batch_size": dp * 4 * pp},
        "schedule": schedule,
    })


def split_experiment() -> Experiment:
    """A tiny MoE model (hidden 16, 2 experts) with overlapped all-to-alls, interleaved on a
    full mesh: collectives outlast compute, so the collapsed lowering splits folded ops at
    their first collective (:func:`workloads.lowering.collapse.first_cuts`), which none of
    the dense cases above needs (never splitting there leaves them all exact; here the step
    moves by 3.5 %). Drawn by ``tests/test_fidelity.py``'s strategies."""
    return Experiment.from_dict({
        "name": "moe-a2a-overlap-split",
        "model": {"num_layers": 4, "hidden_size": 16, "num_attention_heads": 1,
                  "num_kv_heads": 1, "ffn_hidden_size": 32, "vocab_size": 256,
                  "seq_length": 16, "ffn_type": "gelu", "norm": "layernorm",
                  "tied_embeddings": False, "position_embedding": "learned",
                  "moe": {"num_experts": 2, "top_k": 1}},
        "cluster": MESH | {"num_gpus": 4, "link_bandwidth_GBps": 25.0},
        "parallel": {"tp": 1, "pp": 2, "dp": 2, "ep": 2, "vpp": 2, "zero_stage": 0,
                     "moe_dispatcher": "flex", "moe_a2a_overlap": True},
        "training": {"micro_batch_size": 1, "num_microbatches": 4, "recompute": "full",
                     "attention": "flash2", "framework": "megatron"},
        "schedule": "interleaved",
    })


SCALED_CASES: tuple[tuple[str, Callable[[], Experiment], tuple[str, ...]], ...] = (
    ("dgx tp8 pp2 zb-h1", lambda: experiment(8, 2, 1, "zb-h1"), ("exposed_pp",)),
    ("dgx tp8 pp4 zb-h1", lambda: experiment(8, 4, 1, "zb-h1"), ("exposed_pp",)),
    ("dgx tp8 pp4 1f1b", lambda: experiment(8, 4, 1, "1f1b"), ("exposed_pp",)),
    ("dgx pp4 gpipe", lambda: experiment(1, 4, 1, "gpipe"), ()),
    ("mesh tp1 pp4 dp2 interleaved",
     lambda: experiment(1, 4, 2, "interleaved", vpp=2, cluster=MESH), ()),
    ("mesh tp2 pp4 dp2 zb-h1 sp",
     lambda: experiment(2, 4, 2, "zb-h1", cluster=MESH, sp=True), ("exposed_pp", "exposed_dp")),
    ("mesh tp4 pp2 dp2 interleaved sp",
     lambda: experiment(4, 2, 2, "interleaved", vpp=2, cluster=MESH, sp=True),
     ("exposed_pp", "exposed_dp")),
    ("mesh tp2 pp2 dp2 1f1b sp zero3",
     lambda: experiment(2, 2, 2, "1f1b", cluster=MESH, sp=True, zero=3),
     ("exposed_pp", "exposed_dp")),
    ("mesh tp1 pp2 dp2 interleaved buckets",
     lambda: experiment(1, 2, 2, "interleaved", vpp=2, cluster=MESH, zero=1,
                        overlap_grad_reduce=True, grad_bucket_MB=40.0), ()),
    ("mesh tp2 cp2 pp2 zb-h1 sp",
     lambda: cp_experiment(2, 2, 2, 1, "zb-h1", sequence_parallel=True),
     ("exposed_pp", "exposed_dp", "exposed_cp")),
    ("mesh ep2 pp2 dp2 interleaved", lambda: ep_experiment(1, 2, 2, 2, "interleaved", 2, False),
     ("exposed_pp", "exposed_dp")),
    ("mesh tp2 ep2 pp2 dp4 zb-h1", lambda: ep_experiment(2, 2, 4, 2, "zb-h1", 1, False),
     ("exposed_pp", "exposed_dp")),
    ("mesh dualpipe-v tp4 pp2 sp", lambda: sp_experiment("dualpipe-v", 4, 2, 2),
     ("exposed_pp", "exposed_dp", "exposed_cp")),
    ("mesh dualpipe-v tp2 pp2 ep2 sp", lambda: sp_experiment("dualpipe-v", 2, 2, 2, dp=2, ep=2),
     ("exposed_pp", "exposed_dp", "exposed_cp")),
    ("mesh tp2 cp2 dp2 zero3 (close)", lambda: cp_experiment(2, 2, 1, 2, zero_stage=3),
     ("bubble_ratio", "exposed_pp", "exposed_dp", "exposed_cp")),
    ("mesh moe a2a overlap ep2 pp2 dp2 interleaved (split)", lambda: split_experiment(),
     ("exposed_pp", "exposed_dp")),
)
"""Exact cases of the tests above (name, experiment, statistics not compared), and a
contended one of :func:`test_close_zero3_with_context_parallel` (held to ``C`` wherever its
channels overlap), run by :func:`test_exact_cases_under_scaled_device_profiles`."""


ISSUE_22 = {"gemm": 1.1148 / 1.0679, "half_dim": 1463.8 / 1.1148 / (2358.7761 / 1.0679),
            "attention": 1.0}
"""The profile that found it: ``[A100.fit]`` x = [1.1148, 1463.8, ...] (η_gemm 0.897, d½ 1313)
for the shipped [1.0679, 2358.7761, ...], as scales of the shipped profile."""


@pytest.mark.parametrize("case", SCALED_CASES, ids=[name for name, _, _ in SCALED_CASES])
@settings(max_examples=5, deadline=None, derandomize=True, database=None)
@given(st.floats(0.95, 1.6), st.floats(0.2, 3.0), st.floats(0.9, 1.6))
@example(**ISSUE_22)
def test_exact_cases_under_scaled_device_profiles(
        case: tuple[str, Callable[[], Experiment], tuple[str, ...]], gemm: float,
        half_dim: float, attention: float) -> None:
    """Issue 22: the exact cases held to the same claim (:func:`assert_agree`: exact where no
    contended channels are busy at once, else within ``C``) with the A100 profile's GEMMs
    ``gemm`` times as slow, the GEMM curve's d½ scaled by ``half_dim`` and the attention
    kernels ``attention`` times as slow (:func:`sim.corpus.scaled_profile`), not only at
    the shipped constants, whose timing may keep contended channels apart by chance
    (:data:`ISSUE_22` once turned four of the exact tests' agreement into 0.05-0.2 %).
    The collapsed lowering decides from compute times where to split a folded op
    (:func:`workloads.lowering.collapse.first_cuts`, ``window_cuts``): other constants put
    those decisions on other sides of their thresholds."""
    from sim.calibration import default_profile
    from sim.corpus import scaled_profile

    _, build, skip = case
    exp = build()
    shipped = default_profile(exp.cluster.gpu.name)
    profile = dataclasses.replace(scaled_profile(shipped, (gemm, attention)),
                                  gemm_half_dim=shipped.gemm_half_dim * half_dim)
    assert_agree(exp, EXACT, skip=skip, profile=profile)


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
