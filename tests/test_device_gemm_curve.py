"""The GEMM shape curve of sim.device, 1/η(d) = (1 + d½/d + (d₂/d)^p)/η_gemm, and the exact
bounded least squares that fits it (benchmarks/calibrate.py)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from conftest import load_benchmark

from sim.calibration import A100_HAGEMANN
from sim.device import DeviceProfile, compute_time_s
from topologies.hardware import GPUS
from workloads.kernels import gemm

PEAK = 312e12
DIMS = (100.0, 700.0, 2048.0, 5441.0, 13237.0)


def test_without_the_steep_term_the_one_term_curve_is_kept_bit_for_bit() -> None:
    for eta, half in itertools.product((0.6, 0.902), (0.0, 128.0, 2277.0)):
        p = DeviceProfile(gemm_efficiency=eta, gemm_half_dim=half)
        for d in DIMS:
            assert p.gemm_efficiency_at(d) == eta * d / (d + half)


@pytest.mark.parametrize("power", [1.5, 2.0, 3.0])
def test_inverse_efficiency_is_the_three_term_sum(power: float) -> None:
    p = DeviceProfile(gemm_efficiency=0.75, gemm_half_dim=300.0, gemm_half_dim2=2500.0,
                      gemm_shape_power=power)
    for d in DIMS:
        expected = (1 + 300.0 / d + (2500.0 / d) ** power) / 0.75
        assert 1 / p.gemm_efficiency_at(d) == pytest.approx(expected, rel=1e-12)


def test_power_3_costs_a_fixed_time_per_gemm() -> None:
    """p = 3: a cube GEMM of side d takes 2d³/(peak·η) plus 2·d₂³/(peak·η) whatever d."""
    p = DeviceProfile(gemm_efficiency=0.72, gemm_half_dim2=2600.0, gemm_shape_power=3.0)
    fixed = 2 * 2600.0 ** 3 / (PEAK * 0.72)
    for d in DIMS:
        dim, flops = gemm(d, d, d)
        extra = p.gemm_time_s(flops, ((dim, flops),), PEAK) - flops / (PEAK * 0.72)
        assert extra == pytest.approx(fixed, rel=1e-9)
    # count GEMMs of one shape: the fixed cost is paid by each
    dim, flops = gemm(3000.0, 3000.0, 3000.0, count=4)
    extra = p.gemm_time_s(flops, ((dim, flops),), PEAK) - flops / (PEAK * 0.72)
    assert extra == pytest.approx(4 * fixed, rel=1e-9)


def test_power_2_costs_grow_with_the_gemm_side() -> None:
    """p = 2: the cost of a partial last wave grows with the main loop, so with d."""
    p = DeviceProfile(gemm_efficiency=0.8, gemm_half_dim2=2000.0, gemm_shape_power=2.0)

    def extra(d: float) -> float:
        dim, flops = gemm(d, d, d)
        return p.gemm_time_s(flops, ((dim, flops),), PEAK) - flops / (PEAK * 0.8)

    assert extra(6000.0) / extra(3000.0) == pytest.approx(2.0, rel=1e-9)


def test_fitted_a100_curve_rises_saturates_and_keeps_thin_shards_slow() -> None:
    p = A100_HAGEMANN
    etas = [p.gemm_efficiency_at(d) for d in (1000.0, 3000.0, 5400.0, 10000.0, 1e9)]
    assert etas == sorted(etas) and etas[-1] < p.gemm_efficiency
    assert etas[-1] == pytest.approx(p.gemm_efficiency, rel=1e-5)
    # LLaMA-13B's QKV GEMM at 2048 tokens: a TP8 shard runs below the TP1 GEMM (cube sides
    # 2.7k and 5.4k: 0.84x; NVIDIA's cuBLAS figure at those sides, [A100.gemm_benchmark],
    # about 233 against 260 TFLOP/s, 0.90x)
    tp1, _ = gemm(2048, 5120, 3 * 5120)
    tp8, _ = gemm(2048, 5120, 3 * 5120 / 8)
    assert p.gemm_efficiency_at(tp8) < 0.9 * p.gemm_efficiency_at(tp1)
    # the curve reaches compute_time_s: one GEMM alone, no bytes
    gpu = GPUS["A100-80GB"]
    dim, flops = tp1, 2.0 * 2048 * 5120 * 3 * 5120
    assert compute_time_s(gpu, p, flops, gemm_dims=((dim, flops),)) == pytest.approx(
        flops / (gpu.peak_bf16_flops * p.gemm_efficiency_at(dim)), rel=1e-12)


def test_profile_round_trips_through_the_fit_vector() -> None:
    cal = load_benchmark("calibrate")
    base = DeviceProfile(gemm_half_dim=128.0, gemm_shape_power=3.0)
    x = cal.to_x(A100_HAGEMANN)
    back = cal.from_x(x, base, "")
    for field in ("gemm_efficiency", "gemm_half_dim", "gemm_half_dim2", "flash2_efficiency",
                  "flash1_efficiency", "bmm_attention_efficiency", "elementwise_efficiency"):
        assert getattr(back, field) == pytest.approx(getattr(A100_HAGEMANN, field), rel=1e-12,
                                                     abs=1e-9), field
    assert len(x) == len(cal.NAMES) == len(cal.bounds(3.0))


def test_bounded_fit_is_the_exact_minimum() -> None:
    """The fit meets the KKT conditions of the box-constrained least squares: zero gradient
    on free constants, pointing out of the box on constants at a bound; unconstrained, it
    recovers an exact linear model."""
    cal = load_benchmark("calibrate")
    rng = np.random.default_rng(7)
    n, k = 60, 7
    bnds = cal.bounds(3.0)
    lo, hi = np.array([b[0] for b in bnds]), np.array([b[1] for b in bnds])
    x0 = (lo + np.minimum(hi, lo + 1.0)) / 2
    A = rng.uniform(0.5, 2.0, (n, k)) / np.maximum(np.abs(x0), 1.0)
    measured = rng.uniform(5.0, 10.0, n)
    mask = np.ones(n, bool)
    # an exact model inside the box is recovered
    x_true = x0 + 0.1 * (np.minimum(hi, lo + 1.0) - lo)
    T0 = measured - A @ (x_true - x0)
    assert cal.fit(T0, A, x0, measured, mask, bnds) == pytest.approx(x_true, rel=1e-6)
    # a model outside the box: KKT conditions at the returned point
    T0 = measured * rng.uniform(0.7, 1.3, n)
    x = cal.fit(T0, A, x0, measured, mask, bnds)
    assert np.all(x >= lo) and np.all(x <= hi)
    lhs = A / measured[:, None]
    resid = (T0 + A @ (x - x0)) / measured - 1
    grad = lhs.T @ resid / np.linalg.norm(lhs, axis=0)
    scale = np.abs(lhs.T @ np.abs(resid)).max()
    for i in range(k):
        if lo[i] < x[i] < hi[i]:
            assert abs(grad[i]) <= 1e-8 * scale, i
        elif x[i] == lo[i]:
            assert grad[i] >= -1e-8 * scale, i
        else:
            assert grad[i] <= 1e-8 * scale, i
    assert any(x[i] in (lo[i], hi[i]) for i in range(k))


def test_l1_fit_is_the_weighted_median_in_one_dimension() -> None:
    """Σ |c_i·x − d_i| is least at the median of d_i/c_i weighted by |c_i|: the fit of the
    MAPE (``--loss l1``) finds it, while least squares gives the weighted mean."""
    cal = load_benchmark("calibrate")
    rng = np.random.default_rng(11)
    n = 41
    measured = rng.uniform(5.0, 10.0, n)
    A = rng.uniform(0.5, 3.0, (n, 1))
    T0 = measured * rng.uniform(0.6, 1.6, n)  # r_i = (T0 + A(x − x0))/M − 1 at x0 = 0
    x0 = np.zeros(1)
    c, d = A[:, 0] / measured, 1 - T0 / measured
    ratio, weight = d / c, np.abs(c)
    order = np.argsort(ratio)
    cum = np.cumsum(weight[order])
    median = ratio[order][np.searchsorted(cum, cum[-1] / 2)]
    bnds = ((-100.0, 100.0),)
    mask = np.ones(n, bool)
    assert cal.fit_l1(T0, A, x0, measured, mask, bnds)[0] == pytest.approx(median, abs=1e-3)
    mean = np.sum(c * d) / np.sum(c * c)
    assert cal.fit(T0, A, x0, measured, mask, bnds)[0] == pytest.approx(mean, rel=1e-9)
    # a bound that binds holds
    assert cal.fit_l1(T0, A, x0, measured, mask, ((-100.0, median - 0.5),))[0] == pytest.approx(
        median - 0.5)


def test_calibrate_refuses_sensitivities_of_another_nic_count(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """The sensitivities depend on the sweep's network (``--nics``): a cache measured with
    another NIC count is refused, not silently reused; with the matching one it fits."""
    import sys

    cal = load_benchmark("calibrate")
    cache = tmp_path / "sens.npz"
    ok = 401  # the sweep's successful runs
    rng = np.random.default_rng(3)
    np.savez(cache, T0=rng.uniform(20.0, 80.0, ok), A=rng.uniform(0.0, 20.0, (ok, 7)),
             power=0.0, nics=8)
    monkeypatch.setattr(sys, "argv", ["calibrate.py", "--cache", str(cache), "--fit-only"])
    with pytest.raises(SystemExit) as err:
        cal.main()
    assert "nics 8" in str(err.value) and "--nics" in str(err.value)
    monkeypatch.setattr(sys, "argv", ["calibrate.py", "--cache", str(cache), "--fit-only",
                                      "--nics", "8"])
    cal.main()
    assert "linearised MAPE" in capsys.readouterr().out


def test_half_dim_fit_holds_the_shape_and_recovers_an_exact_model() -> None:
    """``--gemm-half-dim``: with d½ held, x₁ = d½·x₀ in the result, and a model whose GEMM
    curve has that d½ is recovered exactly (level and the other constants); held at the
    d½ that an unconstrained fit finds, it returns that fit."""
    cal = load_benchmark("calibrate")
    rng = np.random.default_rng(5)
    n = 80
    bnds = cal.bounds(0.0)
    x0 = np.array([1.2, 1500.0, 0.0, 1.6, 3.0, 1.5, 2.0])
    A = rng.uniform(0.5, 2.0, (n, 7)) / np.maximum(np.abs(x0), 1.0)
    A[:, 2] = 0.0  # no steep term, as calibrate.py measures it at power 0
    measured = rng.uniform(5.0, 10.0, n)
    mask = np.ones(n, bool)
    x_true = np.array([1.1, 1.1 * 1055.0, 0.0, 1.7, 3.2, 1.3, 2.1])
    T0 = measured - A @ (x_true - x0)
    x = cal.fit_at_half_dim(T0, A, x0, measured, mask, bnds, 1055.0)
    assert x == pytest.approx(x_true, rel=1e-6)
    assert x[1] / x[0] == pytest.approx(1055.0, rel=1e-12)
    T1 = T0 * rng.uniform(0.9, 1.1, n)
    free = cal.fit(T1, A, x0, measured, mask, bnds)
    held = cal.fit_at_half_dim(T1, A, x0, measured, mask, bnds, free[1] / free[0])
    assert held == pytest.approx(free, rel=1e-6)


def test_calibrate_checks_the_held_gemm_curve(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """``--hold-gemm ETA,DHALF`` keeps both GEMM constants where it puts them; malformed
    values, or both diagnostics at once, are refused with an error."""
    import sys

    cal = load_benchmark("calibrate")
    cache = tmp_path / "sens.npz"
    rng = np.random.default_rng(3)
    np.savez(cache, T0=rng.uniform(20.0, 80.0, 401), A=rng.uniform(0.0, 20.0, (401, 7)),
             power=0.0, nics=2)
    base = ["calibrate.py", "--cache", str(cache), "--fit-only"]
    for bad in (["--hold-gemm", "0.93"], ["--hold-gemm", "1.5,1000"], ["--hold-gemm", "x,y"],
                ["--hold-gemm", "0.93,1055", "--gemm-half-dim", "1055"],
                ["--gemm-half-dim", "-1"]):
        monkeypatch.setattr(sys, "argv", base + bad)
        with pytest.raises(SystemExit) as err:
            cal.main()
        assert str(err.value).startswith("error:"), bad
    monkeypatch.setattr(sys, "argv", base + ["--hold-gemm", "0.93,1055"])
    cal.main()
    out = capsys.readouterr().out
    assert out.count("'1/gemm': np.float64(1.0753)") == 2  # 1/0.93, on all runs and on 13B
    assert out.count("'d/gemm': np.float64(1134.4086)") == 2  # 1055/0.93
