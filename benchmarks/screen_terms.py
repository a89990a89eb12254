"""Screen candidate step-time terms against Hagemann et al. 2023's sweep, one at a time.

    python benchmarks/screen_terms.py [--cache sens.npz] [--max-shape-term D] [--workers 2]

Each candidate is one more column beside the device constants of ``benchmarks/calibrate.py``
(the same linearisation, rows and bounds; its coefficient >= 0, a multiplier of exposed
communication >= -1), fitted on all successful runs and, for the cross-validation, on the
LLaMA-13B runs only. A term's column is what the simulator reports for each run at the
current profile (``sim.calibration.A100_HAGEMANN``): compute busy time, exposed
communication by kind, micro-batches, peak memory. For each term it prints the linearised
MAPE, the 13B-only fit's MAPE on 30B and 65B, the best-layout hits (the runs measured out of
memory keep their simulated time plus the term), the fitted coefficient and GEMM curve, and a
check of what the term does where the sweep measured it apart from the best-layout picks: on
the 13B 2k-token 64-GPU sheet, step time without pipelining over step time with two stages,
for the FlashAttention-2 pairs and for the other kernels. ``--max-shape-term D`` bounds
d½/η_gemm by D (cuBLAS reaches most of its peak at a cube side of 2000).

sim/calibration.py records what this found (2026-12-04) and why no term was adopted. Not a
timed test; it prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import calibrate  # noqa: E402

from sim import validate  # noqa: E402
from sim.calibration import A100_HAGEMANN  # noqa: E402
from sim.device import DeviceProfile  # noqa: E402
from sim.validate import (  # noqa: E402
    HAGEMANN_SWEEP,
    Prediction,
    Row,
    evaluate,
    load_rows,
)
from workloads.frameworks import FRAMEWORKS, stage_layers  # noqa: E402
from workloads.models import PRESETS  # noqa: E402

CAPACITY_GIB = calibrate.CAPACITY / calibrate.GiB


@dataclasses.dataclass(frozen=True)
class Facts:
    """What one simulation of a run at the current profile reports."""

    step_s: float
    busy_s: float
    exposed_s: dict
    microbatches: int
    peak_gib: float
    oom: bool


def facts(row: Row) -> Facts:
    s = validate.simulate_row(row, A100_HAGEMANN).stats
    return Facts(s["step_time_s"], s["compute_busy_s_mean"], dict(s["exposed_comm_s"]),
                 s["num_microbatches"], s["peak_memory_gib"], s["oom"])


def _slots(r: Row, f: Facts) -> int:
    """Forward-backward slots on a 1F1B critical path: m + p - 1."""
    return f.microbatches + r.pp - 1


def _largest_stage(r: Row) -> int:
    return max(stage_layers(FRAMEWORKS[validate.FRAMEWORK], PRESETS[r.model].num_layers, r.pp))


Term = Callable[[Row, Facts], float]
TERMS: dict[str, tuple[str, Term]] = {
    "dp": ("exposed DP communication, x", lambda r, f: f.exposed_s.get("dp", 0.0)),
    "tp": ("exposed TP communication, x", lambda r, f: f.exposed_s.get("tp", 0.0)),
    "pp": ("exposed PP communication, x", lambda r, f: f.exposed_s.get("pp", 0.0)),
    "slots": ("s per micro-batch slot, PP > 1",
              lambda r, f: float(_slots(r, f)) if r.pp > 1 else 0.0),
    "layer-slots": ("s per layer and slot, PP > 1",
                    lambda r, f: float(_slots(r, f) * _largest_stage(r)) if r.pp > 1 else 0.0),
    "pp-compute": ("compute slowdown at PP > 1", lambda r, f: f.busy_s if r.pp > 1 else 0.0),
    "memory": ("slowdown per unit of peak memory above 70% of capacity",
               lambda r, f: f.step_s * max(0.0, f.peak_gib / CAPACITY_GIB - 0.7)),
    "no-recompute": ("slowdown without recomputation",
                     lambda r, f: f.step_s if r.recompute == "none" else 0.0),
}
"""Candidate terms: name -> (what the coefficient means, the column's value for a run)."""
MULTIPLIERS = frozenset({"dp", "tp", "pp"})


def screen(name: str | None, rows: list[Row], all_facts: list[Facts], T0, A,
           x0, bounds) -> dict:
    """Fit the device constants with the term ``name`` (None: none), evaluate it."""
    ok = [i for i, r in enumerate(rows) if r.status == "ok"]
    measured = np.array([rows[i].step_time_s for i in ok])
    column = TERMS[name][1] if name else None
    extra = (np.array([[column(rows[i], all_facts[i])] for i in ok]) if column
             else np.zeros((len(ok), 0)))
    AA, xx0 = np.hstack([A, extra]), np.concatenate([x0, np.zeros(extra.shape[1])])
    bnds = list(bounds) + ([(-1.0 if name in MULTIPLIERS else 0.0, 1e6)] if column else [])
    is13 = np.array([rows[i].model == "llama-13b" for i in ok])
    x = calibrate.fit(T0, AA, xx0, measured, np.ones(len(ok), bool), bnds)
    x13 = calibrate.fit(T0, AA, xx0, measured, is13, bnds)
    lin, lin13 = T0 + AA @ (x - xx0), T0 + AA @ (x13 - xx0)
    at = dict(zip(ok, lin, strict=True))
    coef = float(x[-1]) if column else 0.0
    preds = [Prediction(r, float(at[i]) if i in at else
                        f.step_s + (coef * column(r, f) if column else 0.0), f.peak_gib, f.oom)
             for i, (r, f) in enumerate(zip(rows, all_facts, strict=True))]
    return {"mape": float(np.mean(np.abs(lin / measured - 1))),
            "cv": float(np.mean(np.abs(lin13[~is13] / measured[~is13] - 1))),
            "hits": evaluate(preds)["best_layout_hits"], "coef": coef,
            "eta": 1 / x[0], "half": x[1] / x[0], "pp_ratios": pp_ratios(rows, at)}


def pp_ratios(rows: list[Row], predicted: dict[int, float]) -> dict[str, tuple]:
    """On the 13B 2k-token 64-GPU sheet, PP1 over PP2 step time of otherwise equal runs:
    (pairs, measured median, predicted median, mean |predicted / measured - 1|), for the
    FlashAttention-2 pairs and the others."""
    runs = {(r.tp, r.pp, r.micro_batch_size, r.recompute, r.attention, r.fused_norm,
             r.sequence_parallel): (r.step_time_s, predicted[i])
            for i, r in enumerate(rows)
            if i in predicted and r.group == ("llama-13b", 2048, 64)}
    pairs: dict[str, list] = {"flash2": [], "others": []}
    for key, (m1, p1) in runs.items():
        other = runs.get((key[0], 2, *key[2:]))
        if key[1] == 1 and other:
            pairs["flash2" if key[4] == "flash2" else "others"].append((m1 / other[0],
                                                                         p1 / other[1]))
    return {k: (len(v), statistics.median(a for a, _ in v), statistics.median(b for _, b in v),
                statistics.mean(abs(b / a - 1) for a, b in v)) for k, v in pairs.items() if v}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(HAGEMANN_SWEEP))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cache", default="", help="npz file of calibrate.py's sensitivities")
    ap.add_argument("--max-shape-term", type=float, default=None,
                    help="upper bound on d½/η_gemm (default: calibrate.py's bound)")
    args = ap.parse_args()
    rows = [r for r in load_rows(args.data) if r.status in ("ok", "oom")]
    ok = [r for r in rows if r.status == "ok"]
    base = DeviceProfile(gemm_half_dim=128.0, gemm_shape_power=2.0)
    T0, A = calibrate.sensitivities(ok, base, calibrate.POWER, validate.NICS_PER_NODE,
                                    args.workers, Path(args.cache) if args.cache else None)
    with ProcessPoolExecutor(args.workers) as pool:
        all_facts = list(pool.map(facts, rows, chunksize=4))
    bounds = list(calibrate.bounds(calibrate.POWER))
    if args.max_shape_term is not None:
        bounds[1] = (0.0, args.max_shape_term)
    print(f"{'term':<13} {'MAPE':>6} {'CV':>6} {'hits':>4} {'coefficient':>12} {'η_gemm':>6} "
          f"{'d½':>5}   13B 64-GPU PP1/PP2, measured / simulated (mean error): FA2 | others")
    for name in (None, *TERMS):
        s = screen(name, rows, all_facts, T0, A, calibrate.to_x(base), bounds)
        ratios = " | ".join(f"{m:.2f} / {p:.2f} ({e:.1%})"
                            for _, m, p, e in s["pp_ratios"].values())
        print(f"{name or 'none':<13} {s['mape']:6.2%} {s['cv']:6.2%} {s['hits']:>4} "
              f"{s['coef']:12.4g} {s['eta']:6.3f} {s['half']:5.0f}   {ratios}", flush=True)


if __name__ == "__main__":
    main()
