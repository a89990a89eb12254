"""Fit the few physical constants of the A100 device profile to Hagemann et al. 2023's sweep.

    python benchmarks/calibrate.py [--data sim/data/validation/hagemann2023_sweep.csv] [--workers 2]
        [--power P] [--nics K] [--cache sens.npz] [--fit-only]
        [--hold-gemm ETA,DHALF | --gemm-half-dim DHALF]

Method. Every compute op's duration is linear in the inverse efficiencies of
the device model, x = (1/η_gemm, d½/η_gemm, d₂^p/η_gemm, 1/η_flash2, 1/η_flash1,
1/η_bmm, 1/η_elementwise) (the GEMM shape curve 1/η(d) = (1 + d½/d + (d₂/d)^p)/η_gemm
of sim.device, at a fixed power p, ``--power``), and a pipeline's makespan is
linear in the op durations while its critical path does not change. So each
run's step time is T(x) = T(x₀) + A·(x − x₀) near x₀; A is measured by finite
differences (one simulation of the sweep per constant), and the constants
minimising the squared relative error over the successful runs follow by
bounded least squares (solved exactly, :func:`fit`), twice: on all runs and on
the LLaMA-13B runs only (for cross-validation). The linearisation is then
checked by simulating the fitted profiles. The allocator's fragmentation is
fitted on the out-of-memory classification of all runs by a grid search, the fewest runs that ran
flagged out of memory at an accuracy of at least 95% (:func:`fit_memory`; the reserved
bytes are fixed from documented sizes, sim/profiles/ampere.toml).
Nothing is fitted per row. Prints the x vectors for sim/profiles/ampere.toml.

Diagnostics (docs/accuracy.md, "Calibration across sources"): ``--hold-gemm ETA,DHALF`` holds
the GEMM curve at a kernel benchmark's (benchmarks/a100_gemm_curve.py) and fits the other
constants; ``--gemm-half-dim DHALF`` holds only its shape, d½, and fits its level η_gemm beside
the others.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim import validate  # noqa: E402
from sim.calibration import MEMORY_RESERVED_GIB  # noqa: E402
from sim.device import DeviceProfile  # noqa: E402
from sim.loso import bounded_lstsq  # noqa: E402
from sim.validate import HAGEMANN_SWEEP, Prediction, evaluate, load_rows, predict  # noqa: E402
from topologies.hardware import GPUS  # noqa: E402
from workloads.memory import device_bytes, oom  # noqa: E402

GiB = 2**30
CAPACITY = GPUS["A100-80GB"].hbm_capacity_bytes
"""What CUDA gives the framework on the sweep's A100-80GB (topologies.hardware)."""
NAMES = ("1/gemm", "d/gemm", "d2^p/gemm", "1/flash2", "1/flash1", "1/bmm", "1/elementwise")
POWER = 0.0
"""p of the shape curve's steep term; 0: no steep term (its constant held at 0, no simulation
for its column), the curve sim/calibration.py keeps. sim/calibration.py has the table of the
powers tried (1.5 to 4) and why none was kept."""


def to_x(p: DeviceProfile) -> np.ndarray:
    return np.array([1 / p.gemm_efficiency, p.gemm_half_dim / p.gemm_efficiency,
                     p.gemm_half_dim2 ** p.gemm_shape_power / p.gemm_efficiency,
                     1 / p.flash2_efficiency, 1 / p.flash1_efficiency,
                     1 / p.bmm_attention_efficiency, 1 / p.elementwise_efficiency])


def from_x(x: np.ndarray, base: DeviceProfile, source: str) -> DeviceProfile:
    """The profile of ``x`` at ``base``'s shape power."""
    return dataclasses.replace(
        base, gemm_efficiency=1 / x[0], gemm_half_dim=x[1] / x[0],
        gemm_half_dim2=(x[2] / x[0]) ** (1 / base.gemm_shape_power),
        flash2_efficiency=1 / x[3], flash1_efficiency=1 / x[4],
        bmm_attention_efficiency=1 / x[5], elementwise_efficiency=1 / x[6], source=source)


ATTENTION_COLUMNS = {"1/flash2": ("flash2", "cudnn"), "1/flash1": ("flash1", "flash-triton"),
                     "1/bmm": ("fused", "unfused")}
"""The attention kernels whose time each attention efficiency sets (sim.device)."""


def step_times(rows, profile, workers) -> np.ndarray:
    return np.array([p.step_time_s for p in predict(rows, profile, workers)])


def bounds(power: float) -> tuple[tuple[float, float], ...]:
    """Physical bounds on x (see NAMES): efficiencies between a floor and what the kernels
    reach; the shape terms between none and a half point at a cube side of 4000 (the steep
    term held at 0 when ``power`` is 0)."""
    return (
        (1 / 0.95, 1 / 0.5),    # GEMM: at most 95% of peak
        (0.0, 4000.0),          # d½/η: no shape penalty .. a half point at a cube side of 4000
        (0.0, 2 * 4000.0 ** power if power else 0.0),  # d₂^p/η: likewise (η_gemm >= 0.5)
        (1 / 0.80, 1 / 0.2),    # FlashAttention-2: at most 80% (Dao 2023 reports up to 73%)
        (1 / 0.70, 1 / 0.1),    # FlashAttention-1
        (1 / 0.85, 1 / 0.1),    # batched-matmul attention
        (1 / 1.0, 1 / 0.05),    # element-wise kernels: at most the HBM bandwidth
    )


def fit(T0, A, x0, measured, mask, bnds) -> np.ndarray:
    """Least squares on relative errors, min Σ ((T0 + A(x − x0)) / M − 1)² over ``mask``,
    within the bounds ``bnds`` (:func:`bounds`), solved exactly: the minimum of a convex
    quadratic on a box has each constant free or at one of its bounds, so every such
    choice is solved (unconstrained least squares on the free constants) and the best
    one inside the box is kept (3^7 = 2187 small solves; coordinate descent crawls along
    the nearly collinear shape columns)."""
    M = measured[mask]
    lhs = A[mask] / M[:, None]
    rhs = 1 - T0[mask] / M + lhs @ x0
    scale = np.linalg.norm(lhs, axis=0)
    scale[scale == 0] = 1.0
    lhs = lhs / scale  # columns of unit norm: y = x * scale
    lo, hi = np.array([b[0] for b in bnds]) * scale, np.array([b[1] for b in bnds]) * scale
    return bounded_lstsq(lhs, rhs, lo, hi) / scale  # every bound state solved (sim.loso)


def fit_at_half_dim(T0, A, x0, measured, mask, bnds, half_dim: float,
                    solver=fit) -> np.ndarray:
    """``solver`` (:func:`fit` or :func:`fit_l1`) with the shape curve's d½ held at
    ``half_dim``: x₁ = d½·x₀, so the two GEMM columns merge into A₀ + d½·A₁ and the level
    1/η_gemm is fitted within its bounds beside the other constants (the steep term, if any,
    held at x₀'s)."""
    keep = [0] + list(range(2, len(x0)))
    B = A[:, keep].copy()
    B[:, 0] = A[:, 0] + half_dim * A[:, 1]
    T0h = T0 + A[:, 1] * (half_dim * x0[0] - x0[1])  # T at x₁ = d½·x₀'s level
    y = solver(T0h, B, x0[keep], measured, mask, tuple(bnds[i] for i in keep))
    x = x0.copy()
    x[keep] = y
    x[1] = half_dim * y[0]
    return x


def fit_l1(T0, A, x0, measured, mask, bnds, iterations: int = 200) -> np.ndarray:
    """The constants minimising the mean absolute relative error, the MAPE that sim validate
    reports, Σ |(T0 + A(x − x0)) / M − 1| over ``mask``, within ``bnds``: iteratively
    reweighted least squares (each pass :func:`fit` with row i weighted by 1/|r_i| from the
    previous pass, r_i floored at 1e-4), from the least-squares solution. Less pulled by
    the sweep's outlying runs than :func:`fit`."""
    x = fit(T0, A, x0, measured, mask, bnds)
    for _ in range(iterations):
        r = np.abs((T0 + A @ (x - x0)) / measured - 1)
        w = 1 / np.sqrt(np.maximum(r, 1e-4))  # on the residual: its square weighs 1/|r|
        x_new = fit((T0 - measured) * w + measured, A * w[:, None], x0, measured, mask, bnds)
        if np.allclose(x_new, x, rtol=1e-10, atol=0.0):
            return x_new
        x = x_new
    return x


OOM_ACCURACY_TARGET = 0.95
"""The OOM verdict's floor on the sweep (issue 19: "Hagemann OOM accuracy ≥ 95%")."""


def fit_memory(preds, reserved_gib: float | None = None,
               target: float = OOM_ACCURACY_TARGET,
               not_counted: frozenset[int] = frozenset()) -> tuple[float, float | None, float]:
    """(accuracy, reserved bytes (None: each GPU's own), fragmentation) for issue 19's
    criterion, "no run that its source reports as having run is flagged oom; Hagemann OOM
    accuracy ≥ 95%": of the fragmentations 0.00-0.50 whose OOM accuracy on all runs reaches
    ``target``, the one with the fewest false OOM (runs that ran, flagged out of memory,
    but for the rows indexed in ``not_counted``: those that ran in a pair the sweep
    contradicts itself on, sim.validate.contradicted_ran, as ``sim validate``'s
    ``false_oom``), ties to the higher accuracy, then to the smaller fragmentation; where
    none reaches ``target``, the most accurate (then the smallest). The reserved bytes are
    each GPU's from the run (sim.reserved, sourced components: the third of each
    prediction's memory parts), or ``reserved_gib`` for every GPU where given (or where the
    parts carry none: sim.calibration.MEMORY_RESERVED_GIB).

    A run is predicted out of memory when some GPU's static state + (1 + fragmentation)
    x its peak dynamic memory + reserved exceeds the capacity (workloads.memory, as
    sim.stats counts it)."""
    parts = [(np.array(p.memory_parts), p.row.status == "oom") for p in preds]
    counted = [getattr(p.row, "index", None) not in not_counted for p in preds]
    reserved = (MEMORY_RESERVED_GIB if reserved_gib is None else reserved_gib) * GiB

    def resv(m: np.ndarray) -> np.ndarray | float:
        """Each GPU's reserved bytes where the parts carry them (sim.reserved), else the
        constant."""
        return m[:, 2] if m.shape[1] > 2 and reserved_gib is None else reserved

    def rank(frag: float) -> tuple[bool, int, float, float]:
        flagged = [oom(device_bytes(m[:, 0], m[:, 1], frag, resv(m)).max(), CAPACITY)
                   for m, _ in parts]
        acc = sum(f == was for f, (_, was) in zip(flagged, parts, strict=True)) / len(parts)
        false_oom = sum(f and not was and c
                        for f, (_, was), c in zip(flagged, parts, counted, strict=True))
        if acc < target - 1e-12:  # below the floor: ranked after every frag above it
            return (False, 0, acc, -frag)
        return (True, -false_oom, acc, -frag)

    frag = max((x / 100 for x in range(0, 51)), key=rank)
    per_gpu = reserved_gib is None and all(m.shape[1] > 2 for m, _ in parts)
    return rank(frag)[2], None if per_gpu else reserved, frag


def with_memory(preds, reserved: float | None, frag: float) -> list[Prediction]:
    """``preds`` with peak memory and OOM verdict recounted for other memory constants,
    as sim.stats counts them (static + (1 + fragmentation) x dynamic + reserved, per GPU;
    ``reserved`` None: each GPU's own, the third of its memory parts)."""
    out = []
    for p in preds:
        peak = max(device_bytes(part[0], part[1], frag,
                                part[2] if len(part) > 2 and reserved is None else
                                (MEMORY_RESERVED_GIB * GiB if reserved is None else reserved))
                   for part in p.memory_parts)
        out.append(dataclasses.replace(p, peak_memory_gib=peak / GiB, oom=oom(peak, CAPACITY)))
    return out


def sensitivities(ok, base: DeviceProfile, power: float, nics: int, workers: int,
                  cache: Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(T0, A): the step times of the successful runs ``ok`` at ``base`` and their finite-
    difference sensitivities to each constant of :data:`NAMES` (one simulation of the sweep
    per column), kept in and reused from ``cache`` (an npz file) if given; exits if the cache
    holds another model's (``power``, ``nics`` or shape differ)."""
    x0 = to_x(base)
    if cache and cache.exists():
        saved = np.load(cache)
        cached_power = float(saved["power"]) if "power" in saved else None
        cached_nics = int(saved["nics"]) if "nics" in saved else None
        if (cached_power != power or cached_nics != nics
                or saved["A"].shape != (len(ok), len(NAMES))):
            sys.exit(f"{cache} holds sensitivities of another model (power {cached_power}, "
                     f"nics {cached_nics}, {saved['A'].shape[1]} columns, "
                     f"{saved['A'].shape[0]} runs): remove it or pass its --power and --nics")
        return saved["T0"], saved["A"]
    t_start = time.time()
    T0 = step_times(ok, base, workers)
    A = np.zeros((len(ok), len(x0)))
    for i, name in enumerate(NAMES):
        if name == "d2^p/gemm" and not power:
            continue  # no steep term: its column stays 0 and its constant at 0
        # x0 of d2^p/gemm is 0: step to (d₂/3000)^p = 0.05
        dx = 0.05 * x0[i] if x0[i] else 0.05 * x0[0] * 3000.0 ** power
        x1 = x0.copy()
        x1[i] += dx
        # an attention efficiency moves only the runs with that kernel (exactly 0 elsewhere)
        kernels = ATTENTION_COLUMNS.get(name)
        idx = [j for j, r in enumerate(ok) if kernels is None or r.attention in kernels]
        A[idx, i] = (step_times([ok[j] for j in idx], from_x(x1, base, ""), workers)
                     - T0[idx]) / dx
        print(f"sensitivity {name}: {time.time() - t_start:.0f} s", flush=True)
    if cache:
        np.savez(cache, T0=T0, A=A, power=power, nics=nics)
    return T0, A


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(HAGEMANN_SWEEP))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cache", default="", help="npz file to keep/reuse the sensitivities")
    ap.add_argument("--fit-only", action="store_true", help="stop after the linearised fit")
    ap.add_argument("--loss", choices=("l2", "l1"), default="l2",
                    help="least squares (default) or least absolute relative error (the MAPE)")
    ap.add_argument("--nics", type=int, default=validate.NICS_PER_NODE,
                    help="NICs per server of the sweep's cluster (default "
                         f"{validate.NICS_PER_NODE}, sim.validate.NICS_PER_NODE)")
    ap.add_argument("--power", type=float, default=POWER,
                    help=f"p of the shape curve's steep term (default {POWER:g}: none)")
    ap.add_argument("--hold-gemm", default="", metavar="ETA,DHALF",
                    help="diagnostic: hold the GEMM curve at η_gemm ETA and d½ DHALF (a kernel "
                         "benchmark's, benchmarks/a100_gemm_curve.py) and fit the others")
    ap.add_argument("--gemm-half-dim", type=float, default=None, metavar="DHALF",
                    help="diagnostic: hold the GEMM curve's d½ at DHALF, fit η_gemm and the others")
    args = ap.parse_args()
    hold = None
    if args.hold_gemm:
        try:
            hold = tuple(float(v) for v in args.hold_gemm.split(","))
        except ValueError:
            hold = ()
        if len(hold) != 2 or not 0 < hold[0] <= 1 or hold[1] < 0:
            sys.exit(f"error: --hold-gemm takes ETA,DHALF with 0 < ETA <= 1 and DHALF >= 0, "
                     f"got {args.hold_gemm!r}")
    if args.gemm_half_dim is not None and (hold or args.gemm_half_dim < 0):
        sys.exit("error: --gemm-half-dim takes one DHALF >= 0 and excludes --hold-gemm")
    t_start = time.time()
    rows = [dataclasses.replace(r, nics_per_node=args.nics) for r in load_rows(args.data)]
    ok = [r for r in rows if r.status == "ok"]
    measured = np.array([r.step_time_s for r in ok])
    base = DeviceProfile(gemm_half_dim=128.0, gemm_shape_power=args.power or 2.0)
    x0 = to_x(base)
    T0, A = sensitivities(ok, base, args.power, args.nics, args.workers,
                          Path(args.cache) if args.cache else None)
    results = {}
    for label, mask in (("all", np.ones(len(ok), bool)),
                        ("13b", np.array([r.model == "llama-13b" for r in ok]))):
        solver = fit_l1 if args.loss == "l1" else fit
        bnds = list(bounds(args.power))
        if hold:
            bnds[0] = (1 / hold[0], 1 / hold[0])
            bnds[1] = (hold[1] / hold[0], hold[1] / hold[0])
        if args.gemm_half_dim is not None:
            x = fit_at_half_dim(T0, A, x0, measured, mask, bnds, args.gemm_half_dim, solver)
        else:
            x = solver(T0, A, x0, measured, mask, tuple(bnds))
        lin = T0 + A @ (x - x0)
        lin_mape = float(np.mean(np.abs(lin[mask] / measured[mask] - 1)))
        results[label] = (x, lin_mape, int(mask.sum()))
        print(label, dict(zip(NAMES, np.round(x, 4), strict=True)),
              f"linearised MAPE on its rows {lin_mape:.4f}", flush=True)
    if args.fit_only:
        return
    x_all = results["all"][0]
    profile = from_x(x_all, base, "")
    preds = predict(rows, profile, args.workers)
    acc, reserved, frag = fit_memory(preds,
                                     not_counted=validate.contradicted_ran([p.row for p in preds]))
    shown = "each run its own" if reserved is None else f"{reserved / GiB:.2f} GiB"
    print(f"memory: oom accuracy {acc:.4f}, reserved {shown}, fragmentation {frag:.2f}")
    date = time.strftime("%Y-%m-%d")
    for label, (x, _, n) in results.items():
        prof = from_x(x, dataclasses.replace(base, fragmentation=frag) if reserved is None
                      else dataclasses.replace(base, reserved_bytes=reserved,
                                               fragmentation=frag),
                      f"benchmarks/calibrate.py ({date}): "
                      f"{'least absolute' if args.loss == 'l1' else 'least squares'} relative "
                      f"error on {n} successful runs "
                      f"({'all models' if label == 'all' else 'llama-13b only'}); memory "
                      f"constants on all {len(rows)} runs' OOM labels")
        if label == "all":  # the same step times; only the memory constants are new
            report = evaluate(with_memory(preds, reserved, frag))
        else:
            report = evaluate(predict([r for r in rows if r.model != "llama-13b"], prof,
                                      args.workers))
        print(label, "simulated:", {k: v for k, v in report.items() if k != "groups"})
        print(repr(prof))
    print(f"total {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
