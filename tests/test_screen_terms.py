"""benchmarks/screen_terms.py: a term planted in synthetic step times is found again."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import load_benchmark

from sim.validate import Row


def _synthetic_sweep(st, planted: float):
    """Runs of two groups whose step times are exactly linear in the device constants plus
    ``planted`` seconds per micro-batch slot of the pipelined runs."""
    rng = np.random.default_rng(3)
    cal = st.calibrate
    x0 = cal.to_x(cal.DeviceProfile(gemm_half_dim=128.0, gemm_shape_power=2.0))
    bounds = cal.bounds(0.0)
    x_true = np.array([1.1, 2000.0, 0.0, 1.5, 3.2, 1.2, 1.9])
    layouts = [(model, tp, pp, mbs) for model in ("llama-13b", "llama-30b")
               for tp in (1, 2) for pp in (1, 2, 4) for mbs in (1, 2)]
    rows, all_facts, T0, A = [], [], [], []
    for i, (model, tp, pp, mbs) in enumerate(layouts):
        dp = 64 // (tp * pp)
        m = 2048 // (mbs * dp)
        facts = st.Facts(30.0, 25.0, {"dp": 1.0, "tp": 0.2 * tp, "pp": 0.1 * pp}, m, 40.0, False)
        a = rng.uniform(0.5, 2.0, len(x0)) / np.maximum(np.abs(x0), 1.0)
        a[2] = 0.0  # no steep term
        t0 = 20.0 + rng.uniform(0, 5)
        extra = planted * (m + pp - 1) if pp > 1 else 0.0
        measured = t0 + a @ (x_true - x0) + extra
        rows.append(Row(i, model, 2048, 64, tp, pp, dp, mbs, "none", "flash2", True, False,
                        "ok", float(measured)))
        all_facts.append(facts)
        T0.append(t0)
        A.append(a)
    return rows, all_facts, np.array(T0), np.array(A), x0, bounds


@pytest.mark.parametrize("planted", [0.0, 0.02])
def test_a_planted_slot_cost_is_recovered_and_explains_every_run(planted: float) -> None:
    st = load_benchmark("screen_terms")
    rows, facts, T0, A, x0, bounds = _synthetic_sweep(st, planted)
    found = st.screen("slots", rows, facts, T0, A, x0, bounds)
    assert found["coef"] == pytest.approx(planted, abs=1e-9)
    assert found["mape"] == pytest.approx(0.0, abs=1e-12)
    assert found["cv"] == pytest.approx(0.0, abs=1e-9)
    assert found["hits"] == 2
    without = st.screen(None, rows, facts, T0, A, x0, bounds)
    assert without["coef"] == 0.0
    assert (without["mape"] > 1e-3) == (planted > 0)
