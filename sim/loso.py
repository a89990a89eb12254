"""Leave-one-source-out cross-validation of the fitted compute constants.

The compute constants of the device model were fitted on one source (Hagemann et al.'s
sweep, ``benchmarks/calibrate.py``). How well would they predict a source they were not
fitted on? For each source, the constants are refitted on every *other* source and used to
predict the held-out one.

What is refitted, and how, kept cheap enough for ``sim validate`` (same method as
``benchmarks/calibrate.py``, fewer columns): two time scales (:data:`sim.corpus.TimeScales`),
a on every GEMM's time (1/η_gemm, the shape curve kept) and b on every attention kernel's
(1/η of FlashAttention 1-3 and the batched-matmul attention), applied to every GPU's
shipped profile alike (the other GPUs' profiles are the A100 fit carried over by published
ratios, :mod:`sim.gpu_profiles`, so a refit of the A100 constants moves them all). A run's
step time is linear in a and b while its critical path holds, so T(a, b) = T₀ + A·(a − 1,
b − 1), A by finite differences (two more simulations per run, :data:`STEP`); the scales
minimise the squared relative step-time error, each training source weighing the same
(a source of 400 runs does not outvote one of 3), within :data:`bounds` (the physical
bounds of ``benchmarks/calibrate.py``), solved exactly (:func:`bounded_lstsq`). The
held-out source is predicted by the linearisation. Hagemann's sweep enters with every
:data:`HAGEMANN_STRIDE`-th successful run (its sensitivities are the expensive part), and
its own leave-one-source-out error is measured on those runs. Memory constants are not
refitted: step times do not depend on them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from sim.corpus import CorpusPrediction, CorpusRow, TimeScales, run_jobs, simulate_corpus_row

STEP = 0.05
"""Relative finite-difference step of each time scale."""
HAGEMANN_STRIDE = 5
"""Every this-many-th successful run of Hagemann's sweep (in file order) takes part."""
HAGEMANN = "hagemann2023_sweep"
"""The sweep's source name (its file's stem)."""


def bounds() -> tuple[tuple[float, float], tuple[float, float]]:
    """(lo, hi) of a and b: the A100 fit's GEMM efficiency at most 0.95 and its
    FlashAttention-2 efficiency at most 0.80 (``benchmarks/calibrate.py``'s bounds), and no
    kernel class more than twice (GEMM) or three times (attention) slower than fitted."""
    from sim.calibration import A100_HAGEMANN

    return ((A100_HAGEMANN.gemm_efficiency / 0.95, 2.0),
            (A100_HAGEMANN.flash2_efficiency / 0.80, 3.0))


@dataclass(frozen=True)
class FitData:
    """The runs of every source that take part: published and base step times, and the
    step times' derivatives in (a, b)."""

    sources: tuple[str, ...]
    """Each run's source."""
    measured: np.ndarray
    base: np.ndarray
    sens: np.ndarray
    """n x 2: dT/da, dT/db."""


def bounded_lstsq(lhs: np.ndarray, rhs: np.ndarray, lo: np.ndarray, hi: np.ndarray
                  ) -> np.ndarray:
    """argmin ||lhs·x − rhs||² with lo <= x <= hi, exactly: the minimum of a convex
    quadratic on a box has each variable free or at one of its bounds, so every such
    choice is solved and the best feasible one kept (3^k small solves)."""
    k = lhs.shape[1]
    best, best_obj = np.clip(np.zeros(k), lo, hi), np.inf
    for states in itertools.product((0, 1, 2), repeat=k):
        x = np.where(np.array(states) == 1, lo, hi).astype(float)
        free = [i for i, st in enumerate(states) if st == 0]
        if free:
            fixed = [i for i, st in enumerate(states) if st != 0]
            x[free] = np.linalg.lstsq(lhs[:, free], rhs - lhs[:, fixed] @ x[fixed],
                                      rcond=None)[0]
            tol = 1e-9 * np.maximum(1.0, np.abs(x[free]))
            if np.any(x[free] < lo[free] - tol) or np.any(x[free] > hi[free] + tol):
                continue
        obj = float(np.sum((lhs @ x - rhs) ** 2))
        if obj < best_obj - 1e-15:
            best, best_obj = np.clip(x, lo, hi), obj
    return best


def fit_scales(data: FitData, train: np.ndarray,
               box: tuple[tuple[float, float], tuple[float, float]]) -> TimeScales:
    """The (a, b) minimising Σ over the ``train`` runs of w·((T₀ + A·(θ − 1)) / M − 1)²,
    w = 1 / (runs of that run's source among them)."""
    src = np.array(data.sources)
    counts = {s: int(np.sum(train & (src == s))) for s in set(data.sources)}
    w = np.array([1.0 / counts[s] if counts[s] else 0.0 for s in data.sources])[train]
    m = data.measured[train]
    sw = np.sqrt(w)
    lhs = data.sens[train] / m[:, None] * sw[:, None]
    rhs = (1.0 - data.base[train] / m) * sw
    lo = np.array([b[0] for b in box]) - 1.0
    hi = np.array([b[1] for b in box]) - 1.0
    x = bounded_lstsq(lhs, rhs, lo, hi)
    return (float(1.0 + x[0]), float(1.0 + x[1]))


def leave_one_source_out(data: FitData, box=None) -> dict[str, dict]:
    """Per source with runs in ``data``: the scales fitted on every other source
    (``scales``) and the held-out source's MAPE under them (``loso_mape``, linearised);
    None where no other source has runs."""
    box = box or bounds()
    out = {}
    src = np.array(data.sources)
    for name in sorted(set(data.sources)):
        held = src == name
        train = ~held
        if not train.any():
            out[name] = {"loso_mape": None, "scales": None, "runs": int(held.sum())}
            continue
        a, b = fit_scales(data, train, box)
        pred = data.base[held] + data.sens[held] @ np.array([a - 1.0, b - 1.0])
        mape = float(np.mean(np.abs(pred / data.measured[held] - 1.0)))
        out[name] = {"loso_mape": mape, "scales": {"gemm_time": a, "attention_time": b},
                     "runs": int(held.sum())}
    return out


def _step_time(job: tuple) -> float:
    """One sensitivity simulation: a corpus row or a sweep row at the job's scales."""
    row, scales = job
    if isinstance(row, CorpusRow):
        return simulate_corpus_row((row, scales)).step_time_s
    from sim.calibration import A100_HAGEMANN
    from sim.corpus import scaled_profile
    from sim.validate import simulate_row

    return simulate_row(row, scaled_profile(A100_HAGEMANN, scales)).stats["step_time_s"]


def fit_data(hagemann: Sequence, corpus: Sequence[CorpusPrediction], workers: int = 1,
             progress: Callable[[int, int], None] | None = None,
             sweep_name: str = HAGEMANN) -> FitData:
    """The runs that take part (the successful, simulated ones: every
    :data:`HAGEMANN_STRIDE`-th of the sweep's ``hagemann`` predictions, a source named
    ``sweep_name``, and every one of the ``corpus`` predictions) and their sensitivities, two
    simulations each, in ``workers`` processes."""
    sweep = [p for p in hagemann if p.row.status == "ok"][::HAGEMANN_STRIDE]
    runs = [p for p in corpus if p.skipped is None and p.row.status == "ok"]
    keys = [(p.row, sweep_name) for p in sweep] + [(p.row, p.row.source) for p in runs]
    jobs = [(row, scales) for row, _ in keys
            for scales in ((1.0 + STEP, 1.0), (1.0, 1.0 + STEP))]
    times = run_jobs(_step_time, jobs, workers, progress)
    base = np.array([p.step_time_s for p in sweep] + [p.step_time_s for p in runs])
    measured = np.array([p.row.step_time_s for p in sweep] + [p.row.step_time_s for p in runs])
    moved = np.array(times, dtype=float).reshape(len(keys), 2) if keys else np.zeros((0, 2))
    sens = (moved - base[:, None]) / STEP if keys else moved
    return FitData(tuple(name for _, name in keys), measured, base, sens)
