"""GPU power limits (``cluster.gpu_power_limit_w``, :mod:`topologies.power`): the closed form
of a capped GEMM, the memory-bound kernels left alone, the preset's stated cap, the errors."""

from __future__ import annotations

import math

import pytest

from base.errors import ConfigError
from sim import api
from sim.calibration import default_profile
from sim.device import compute_time_s, work_timer
from sim.experiment import Experiment
from topologies.build import build_cluster
from topologies.hardware import GPUS
from topologies.power import capable_gpus, capped, power_range, throughput_fraction
from topologies.presets import SERVERS


def _run(cluster: dict) -> dict:
    return {"name": "cap", "model": {"preset": "llama3-8b", "seq_length": 4096},
            "cluster": cluster, "parallel": {"dp": 8, "zero_stage": 3},
            "training": {"micro_batch_size": 1, "global_batch_size": 8, "framework": "fsdp"}}


def test_fraction_is_the_datasheet_power_law():
    """r(P) = r0 (P/P0)^α through the data's two GH100 points: 835/989 at 400 W, 1 at 700 W."""
    rng = power_range("H100")
    (p0, r0), (p1, r1) = rng.points
    assert (p0, p1, rng.tdp_w, rng.min_w) == (400.0, 700.0, 700.0, 200.0)
    assert r0 == pytest.approx(835 / 989, abs=1e-4) and r1 == 1.0
    alpha = math.log(r1 / r0) / math.log(p1 / p0)
    for watts in (200.0, 350.0, 400.0, 500.0, 650.0):
        assert throughput_fraction(rng, watts) == pytest.approx(r0 * (watts / p0) ** alpha,
                                                                rel=1e-12)
    assert throughput_fraction(rng, 700.0) == 1.0
    assert throughput_fraction(rng, 500.0) == pytest.approx(0.9032, abs=1e-4)


@pytest.mark.parametrize("watts", [200.0, 420.0, 500.0, 699.0])
def test_capped_gemm_takes_exactly_the_predicted_factor_longer(watts):
    """A GEMM-only op (shaped and unshaped FLOPs, and attention) on a capped H100 takes
    1/r(P) times as long as on the uncapped one, through the engine's own timer."""
    gpu = GPUS["H100"]
    cap = capped(gpu, watts)
    factor = 1.0 / throughput_fraction(power_range("H100"), watts)
    profile = default_profile("H100")
    for work in ({"flops": 3e12}, {"flops": 3e12, "gemm_dims": ((1024.0, 2e12),)},
                 {"attn_flops": 1e12}):
        base = compute_time_s(gpu, profile, **work)
        assert compute_time_s(cap, profile, **work) == pytest.approx(base * factor, rel=1e-12)

    class Op:
        duration_s = None
        flops, hbm_bytes, attn_flops, elementwise_bytes = 4e12, 0.0, 0.0, 0.0
        gemm_dims = ((4096.0, 4e12),)

    assert work_timer(cap, profile)(Op()) == pytest.approx(
        work_timer(gpu, profile)(Op()) * factor, rel=1e-12)


def test_memory_bound_kernels_keep_their_rate():
    gpu, cap = GPUS["H100-96GB"], capped(GPUS["H100-96GB"], 300.0)
    profile = default_profile("H100-96GB")
    assert compute_time_s(cap, profile, elementwise_bytes=1e10) == \
        compute_time_s(gpu, profile, elementwise_bytes=1e10)
    assert compute_time_s(cap, profile, hbm_bytes=1e10) == \
        compute_time_s(gpu, profile, hbm_bytes=1e10)


def test_no_cap_and_the_tdp_are_todays_gpu():
    gpu = GPUS["H100"]
    assert capped(gpu, None) is gpu
    at_tdp = capped(gpu, 700.0)
    assert at_tdp.compute_fraction == 1.0
    profile = default_profile("H100")
    assert compute_time_s(at_tdp, profile, flops=5e12, attn_flops=1e12, elementwise_bytes=1e9) \
        == compute_time_s(gpu, profile, flops=5e12, attn_flops=1e12, elementwise_bytes=1e9)


def test_grand_teton_preset_carries_torchtitans_500_w():
    assert SERVERS["grand-teton-h100"].gpu_power_limit_w == 500.0
    assert "500W power limit" in SERVERS["grand-teton-h100"].gpu_power_limit_source
    exp = Experiment.from_dict(_run({"preset": "grand-teton-h100", "num_gpus": 8}))
    assert exp.cluster.gpu.power_limit_w == 500.0
    full = Experiment.from_dict(_run({"preset": "grand-teton-h100", "num_gpus": 8,
                                      "gpu_power_limit_w": 700}))
    assert full.cluster.gpu.compute_fraction == 1.0 and full.cluster.gpu.name == "H100-96GB"
    # the presets without a stated cap run at the TDP, as before
    assert all(s.gpu_power_limit_w is None for k, s in SERVERS.items() if k != "grand-teton-h100")


def test_a_capped_step_is_slower_but_not_by_more_than_the_compute_factor():
    runs = {w: api.simulate(Experiment.from_dict(_run({"preset": "dgx-h100", "num_gpus": 8,
                                                        "gpu_power_limit_w": w})))
            for w in (700, 400)}
    t700, t400 = (runs[w].stats["step_time_s"] for w in (700, 400))
    assert t700 < t400 < t700 / throughput_fraction(power_range("H100"), 400.0) + 1e-12
    # MFU stays against the datasheet peak
    assert runs[400].stats["mfu"] < runs[700].stats["mfu"]


@pytest.mark.parametrize(("cluster", "words"), [
    ({"preset": "dgx-h100", "gpu_power_limit_w": 150}, ("150 W", "below", "200 W", "200-700")),
    ({"preset": "dgx-h100", "gpu_power_limit_w": 800}, ("800 W", "above", "TDP 700 W")),
    ({"preset": "dgx-a100-80g", "gpu_power_limit_w": 300}, ("A100-80GB", "TDP 400 W", "H100")),
    ({"topology": "switch", "link_bandwidth_GBps": 50, "gpu": "h800",
      "gpu_power_limit_w": 100}, ("H800", "100 W", "200 W")),
    ({"nodes": [{"preset": "dgx-h100", "count": 1}], "gpu_power_limit_w": 701},
     ("701 W", "700 W")),
    ({"preset": "ideal", "gpu_power_limit_w": 500}, ("not used with",)),
])
def test_limits_outside_the_range_are_refused_naming_both_sides(cluster, words):
    with pytest.raises(ConfigError) as err:
        Experiment.from_dict(_run({"num_gpus": 8, **cluster}))
    message = str(err.value)
    assert message.startswith("cluster.gpu_power_limit_w")
    for word in words:
        assert word in message


def test_every_gpu_has_its_datasheet_tdp_and_capable_ones_a_range_up_to_it():
    for spec in GPUS.values():
        assert spec.tdp_w and f"{spec.tdp_w:,.0f} W" in spec.source.replace("1.2 kW", "1,200 W"), \
            spec.name
    for name in capable_gpus():
        rng = power_range(name)
        assert name in GPUS and 0 < rng.min_w < rng.tdp_w == GPUS[name].tdp_w and rng.source
        assert rng.points[-1] == (rng.tdp_w, 1.0)


def test_mixed_topology_cluster_caps_every_gpu():
    exp = Experiment.from_dict(_run({
        "topology": "switch", "link_bandwidth_GBps": 50, "gpus_per_node": 4, "num_gpus": 8,
        "nodes": [{"gpu": "H100", "count": 1}, {"gpu": "H800", "count": 1}],
        "gpu_power_limit_w": 500}))
    assert {g.power_limit_w for g in exp.cluster.gpus} == {500.0}
    assert build_cluster(exp.config.cluster).gpus[0].compute_fraction < 1.0
