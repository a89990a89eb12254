"""sim.variability: the expected slowest of N GPUs, its data, and simulate with a paced profile."""

from __future__ import annotations

import math
import tomllib

import pytest

from sim import api
from sim.calibration import default_profile
from sim.experiment import build_experiment
from sim.variability import (
    DATA_FILE,
    expected_max_normal,
    paced_profile,
    pacing,
    sigma,
)


def test_every_number_has_its_source() -> None:
    with DATA_FILE.open("rb") as fh:
        data = tomllib.load(fh)
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
