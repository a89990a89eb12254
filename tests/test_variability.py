"""GPU speed variability: the expected slowest of N GPUs (topologies.variability), its data,
``cluster.gpu_speed_spread``, and simulate with a paced profile (sim.variability)."""

from __future__ import annotations

import math

import pytest

from base.errors import ConfigError
from sim import api
from sim.calibration import default_profile
from sim.experiment import build_experiment
from sim.jobs import build_jobs
from sim.variability import paced_profile
from topologies.variability import data as variability_data
from topologies.variability import expected_max_normal, pacing, sigma


def test_every_number_has_its_source() -> None:
    data = variability_data()
    for key in data:
        if not key.endswith("_source"):
            assert data[f"{key}_source"].strip(), key
    assert sigma() == pytest.approx(0.08 / (4 * 1.3489795), rel=1e-6)  # 1.48%
    assert data["normal_iqr"] == pytest.approx(2 * 0.6744897501960817, rel=1e-12)


@pytest.mark.parametrize(("n", "exact"), [
    (2, 1 / math.sqrt(math.pi)),
    (3, 1.5 / math.sqrt(math.pi)),
    (4, 1.0293753730039641),  # 6/sqrt(pi) * arctan(sqrt(2)) / pi
    (5, 1.1629644736405196),
])
def test_expected_maximum_matches_the_closed_forms(n: int, exact: float) -> None:
    assert expected_max_normal(n) == pytest.approx(exact, abs=1e-9)


def test_expected_maximum_grows_like_the_order_statistic_tables() -> None:
    assert expected_max_normal(1) == 0.0
    # Harter (1961) / Teichroew (1956) tables: 1.42360 for 8, 2.59465 for 128
    assert expected_max_normal(8) == pytest.approx(1.42360, abs=1e-5)
    assert expected_max_normal(128) == pytest.approx(2.59465, abs=1e-4)
    values = [expected_max_normal(n) for n in (1, 2, 8, 64, 512, 4096, 16384)]
    assert values == sorted(values)
    # about sqrt(2 ln n) for large n, from below
    assert expected_max_normal(16384) < math.sqrt(2 * math.log(16384))
    with pytest.raises(ValueError):
        expected_max_normal(0)


def test_pacing_and_the_profile_it_scales() -> None:
    assert pacing(1) == 1.0
    assert pacing(512) == pytest.approx(1 + sigma() * expected_max_normal(512))
    assert pacing(64, spread=0.0) == 1.0
    base = default_profile("H100")
    paced = paced_profile(base, 512)
    f = pacing(512)
    assert paced.gemm_efficiency == pytest.approx(base.gemm_efficiency / f)
    assert paced.flash2_efficiency == pytest.approx(base.flash2_efficiency / f)
    assert paced.cudnn_efficiency == pytest.approx(base.cudnn_efficiency / f)
    assert paced.bmm_attention_efficiency == pytest.approx(base.bmm_attention_efficiency / f)
    # memory-bound kernels keep their speed
    assert paced.elementwise_efficiency == base.elementwise_efficiency
    assert paced.hbm_efficiency == base.hbm_efficiency


def _fsdp(num_gpus: int) -> dict:
    return {"name": "fsdp", "model": {"preset": "llama3-8b", "seq_length": 2048, "num_layers": 4},
            "cluster": {"preset": "dgx-h100", "num_gpus": num_gpus},
            "parallel": {"tp": 1, "pp": 1, "dp": num_gpus, "zero_stage": 3},
            "training": {"micro_batch_size": 1, "global_batch_size": num_gpus}}


@pytest.mark.parametrize("fidelity", ["collapsed", "full"])
def test_simulate_with_a_paced_profile_slows_only_the_compute_bound_kernels(
        fidelity: str) -> None:
    """The default run is not paced; given the paced profile, the step grows, by less than the
    pacing (communication and memory-bound kernels keep their speed)."""
    exp = build_experiment(_fsdp(16))
    off = api.simulate(exp, fidelity=fidelity, idle=False).stats["step_time_s"]
    shipped = api.simulate(exp, default_profile("H100"), fidelity=fidelity,
                           idle=False).stats["step_time_s"]
    on = api.simulate(exp, paced_profile(default_profile("H100"), 16),
                      fidelity=fidelity, idle=False).stats["step_time_s"]
    assert off == shipped
    assert off < on < off * pacing(16)


def test_the_cluster_key_paces_the_compute_bound_kernels_by_the_cluster_size() -> None:
    """``cluster.gpu_speed_spread`` gives the same step as the paced profile (the same
    scaling of GEMMs and attention, through the GPU's compute fraction), and the published
    spread by name is the data file's."""
    plain = _fsdp(16)
    spread = {**plain, "cluster": {**plain["cluster"], "gpu_speed_spread": "sinha2022"}}
    exp = build_experiment(spread)
    assert exp.cluster.gpu.compute_fraction == pytest.approx(1 / pacing(16))
    keyed = api.simulate(exp, fidelity="collapsed", idle=False).stats["step_time_s"]
    what_if = api.simulate(build_experiment(plain), paced_profile(default_profile("H100"), 16),
                           fidelity="collapsed", idle=False).stats["step_time_s"]
    assert keyed == pytest.approx(what_if, rel=1e-12)
    zero = {**plain, "cluster": {**plain["cluster"], "gpu_speed_spread": 0}}
    assert build_experiment(zero).cluster.gpu == build_experiment(plain).cluster.gpu
    wide = {**plain, "cluster": {**plain["cluster"], "gpu_speed_spread": 0.05}}
    assert build_experiment(wide).cluster.gpu.compute_fraction == pytest.approx(
        1 / (1 + 0.05 * expected_max_normal(16)))


def _cluster(num_gpus: int, **cluster) -> object:
    data = _fsdp(num_gpus)
    data["cluster"] = {**data["cluster"], **cluster}
    return build_experiment(data).cluster


def test_the_cluster_key_multiplies_into_a_power_cap_and_every_gpu_type() -> None:
    capped = _cluster(64, gpu_power_limit_w=500)
    both = _cluster(64, gpu_power_limit_w=500, gpu_speed_spread=0.02)
    assert capped.gpu.compute_fraction < 1
    assert both.gpu.compute_fraction == pytest.approx(capped.gpu.compute_fraction
                                                      / pacing(64, 0.02))
    nodes = [{"count": 1, "preset": "dgx-a100-80g"}, {"count": 1, "preset": "dgx-h100"}]
    data = _fsdp(16)
    data["cluster"] = {"num_gpus": 16, "nodes": nodes, "gpu_speed_spread": 0.02}
    mixed = build_experiment(data).cluster
    assert {g.name for g in mixed.gpus} == {"A100-80GB", "H100"}
    assert [g.compute_fraction for g in mixed.gpus] == pytest.approx([1 / pacing(16, 0.02)] * 16)


@pytest.mark.parametrize("value", [-0.01, 0.5, "lots"])
def test_a_spread_out_of_range_is_refused_naming_the_key(value) -> None:
    bad = _fsdp(16)
    bad["cluster"]["gpu_speed_spread"] = value
    with pytest.raises(ConfigError, match="cluster.gpu_speed_spread"):
        build_experiment(bad)


def test_the_key_is_refused_where_the_slowest_of_the_cluster_is_not_the_pace() -> None:
    swarm = {"name": "swarm", "model": {"preset": "gpt3-1.3b", "num_layers": 4},
             "cluster": {"preset": "dgx-a100-80g", "num_gpus": 4, "gpu_speed_spread": 0.02},
             "parallel": {"pp": 2, "swarm": {"pools": [2, 2]}},
             "training": {"micro_batch_size": 1, "global_batch_size": 4}}
    with pytest.raises(ConfigError, match="not with parallel.swarm"):
        build_experiment(swarm)
    job = {"name": "a", "gpus": "0-7", "model": {"preset": "gpt3-1.3b", "num_layers": 4},
           "parallel": {"dp": 8},
           "training": {"micro_batch_size": 1, "global_batch_size": 8}}
    jobs = {"cluster": {"preset": "dgx-a100-80g", "num_gpus": 16, "gpu_speed_spread": 0.02},
            "jobs": [job, {**job, "name": "b", "gpus": "8-15"}]}
    with pytest.raises(ConfigError, match="not with jobs"):
        build_jobs(jobs)
