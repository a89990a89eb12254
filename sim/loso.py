"""Leave-one-source-out cross-validation of the fitted compute constants.

The compute constants of the device model were fitted on one source (Hagemann et al.'s
sweep, ``benchmarks/calibrate.py``). How well would they predict a source they were not
fitted on? For each source, the constants are refitted on every *other* source and used to
predict the held-out one.

What is refitted, and how, kept cheap enough for ``sim validate`` (same method as
``benchmarks/calibrate.py``, fewer columns): two time scales (:data:`sim.corpus.TimeScales`),
a on every GEMM's time (1/η_gemm, the shape curve kept) and b on every attention kernel's
(1/η of FlashAttention 1-3, cuDNN's and the batched-matmul attention), applied to every GPU's
shipped profile alike (the other GPUs' profiles are the A100 fit carried over by published
ratios, :mod:`sim.gpu_profiles`, so a refit of the A100 constants moves them all). A run's
step time is linear in a and b while its critical path holds, so T(a, b) = T₀ + A·(a − 1,
b − 1), A by finite differences (two more simulations per run, :data:`STEP`); the scales
minimise the squared relative step-time error, each training source weighing the same
(a source of 400 runs does not outvote one of 3), within :data:`bounds` (the physical
bounds of ``benchmarks/calibrate.py``), solved exactly (:func:`bounded_lstsq`). The
held-out source is predicted by the linearisation. A third scale, c, multiplies the GEMM
times of Hopper GPUs only (:data:`FITTED_GENERATION`): what the corpus alone would set
(:func:`fit_generation`, ``corpus_fit`` of ``sim validate --json``; ``[H100.corpus_fit]``
in ``sim/profiles/hopper.toml`` ships it, or 1 and why not); a Hopper run's step time moves
with c as with a, so its sensitivity costs no simulation. Where one is shipped,
leave-one-source-out refits c in every fold as :func:`fit_generation` fits it, without the
held-out source, before a and b (a held-out Hopper source is never in its own c); where none
is (1, fitted on nothing), the folds hold it there. Hagemann's sweep enters with every
:data:`HAGEMANN_STRIDE`-th successful run (its sensitivities are the expensive part), and
its own leave-one-source-out error is measured on those runs. Memory constants are not
refitted: step times do not depend on them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from sim.corpus import CorpusPrediction, CorpusRow, simulate_corpus_row
from sim.executors import map_ordered

STEP = 0.05
"""Relative finite-difference step of each time scale."""
HAGEMANN_STRIDE = 5
"""Every this-many-th successful run of Hagemann's sweep (in file order) takes part."""
HAGEMANN = "hagemann2023_sweep"
"""The sweep's source name (its file's stem)."""
FITTED_GENERATION = "hopper"
"""The GPU generation whose GEMM time scale the corpus fits (:func:`fit_generation`)."""


Box = tuple[tuple[float, float], ...]
"""(lo, hi) of each scale: a, b, c."""


def bounds() -> Box:
    """(lo, hi) of a, b and c: the A100 fit's GEMM efficiency at most 0.95 and its
    FlashAttention-2 efficiency at most 0.80 (``benchmarks/calibrate.py``'s bounds), no
    kernel class more than twice (GEMM) or three times (attention) slower than fitted; c
    relative to the shipped Hopper profile, whose GEMM efficiency stays at most 0.95 and
    at least half its kernel-benchmark value (the A100 fit x Bekman's ratio)."""
    from sim.calibration import A100_HAGEMANN
    from sim.gpu_profiles import RATIOS

    h100 = RATIOS["H100"]
    benchmark = A100_HAGEMANN.gemm_efficiency * h100.gemm
    shipped = h100.corpus_gemm_time
    return ((A100_HAGEMANN.gemm_efficiency / 0.95, 2.0),
            (A100_HAGEMANN.flash2_efficiency / 0.80, 3.0),
            (benchmark / 0.95 / shipped, 2.0 / shipped))


@dataclass(frozen=True)
class FitData:
    """The runs of every source that take part: published and base step times, and the
    step times' derivatives in (a, b)."""

    sources: tuple[str, ...]
    """Each run's source."""
    measured: np.ndarray
    base: np.ndarray
    sens: np.ndarray
    """n x 3: dT/da, dT/db, dT/dc (dT/da on Hopper runs, else 0)."""


def bounded_lstsq(lhs: np.ndarray, rhs: np.ndarray, lo: np.ndarray, hi: np.ndarray
                  ) -> np.ndarray:
    """argmin ||lhs·x − rhs||² with lo <= x <= hi, exactly: the minimum of a convex
    quadratic on a box has each variable free or at one of its bounds, so every such
    choice is solved and the best feasible one kept (3^k small solves). Every sum is
    :func:`math.fsum` of individually rounded products and each solve is
    :func:`lstsq_small`'s, not BLAS or LAPACK, whose kernels differ between CPUs: the same
    rows give the same bits on every machine (``sim validate``'s ``loso_mape`` differed in
    its last digit between an Intel and an AMD machine)."""
    k = lhs.shape[1]
    cols = [lhs[:, j].tolist() for j in range(k)]
    target = rhs.tolist()
    best, best_obj = np.clip(np.zeros(k), lo, hi), np.inf
    for states in itertools.product((0, 1, 2), repeat=k):
        x = [float(lo[i]) if st == 1 else float(hi[i]) for i, st in enumerate(states)]
        free = [i for i, st in enumerate(states) if st == 0]
        if free:
            fixed = [i for i, st in enumerate(states) if st != 0]
            rest = [math.fsum([t, *(-cols[j][r] * x[j] for j in fixed)])
                    for r, t in enumerate(target)]
            solved = lstsq_small([cols[i] for i in free], rest)
            if solved is None:  # dependent columns: the optimum has one at a bound
                continue
            for i, xi in zip(free, solved, strict=True):
                x[i] = xi
            if any(x[i] < lo[i] - 1e-9 * max(1.0, abs(x[i]))
                   or x[i] > hi[i] + 1e-9 * max(1.0, abs(x[i])) for i in free):
                continue
        obj = math.fsum(math.fsum([*(c[r] * xi for c, xi in zip(cols, x, strict=True)),
                                   -t]) ** 2 for r, t in enumerate(target))
        if obj < best_obj - 1e-15:
            best, best_obj = np.clip(np.array(x), lo, hi), obj
    return best


def lstsq_small(cols: Sequence[Sequence[float]], rhs: Sequence[float]) -> list[float] | None:
    """argmin ||A·x − rhs||² for a few columns ``cols`` of A, by the normal equations (AᵀA
    and Aᵀ·rhs by :func:`math.fsum`) and Gaussian elimination with partial pivoting: the
    same bits on every machine. A column of zeros (no run moves with that scale) gets 0, as
    the minimum-norm solution gives it; None where the other columns are dependent (the
    solution is a line, not a point)."""
    k = len(cols)
    x = [0.0] * k
    used = [i for i in range(k) if any(cols[i])]
    m = len(used)
    g = [[math.fsum(a * b for a, b in zip(cols[i], cols[j], strict=True)) for j in used]
         + [math.fsum(a * b for a, b in zip(cols[i], rhs, strict=True))] for i in used]
    for c in range(m):
        pivot = max(range(c, m), key=lambda r: abs(g[r][c]))
        if g[pivot][c] == 0.0 or abs(g[pivot][c]) <= 1e-12 * max(abs(g[i][i]) for i in range(m)):
            return None
        g[c], g[pivot] = g[pivot], g[c]
        for r in range(c + 1, m):
            f = g[r][c] / g[c][c]
            g[r] = [a - f * b for a, b in zip(g[r], g[c], strict=True)]
    for c in reversed(range(m)):
        x[used[c]] = (g[c][m] - math.fsum(g[c][j] * x[used[j]] for j in range(c + 1, m))
                      ) / g[c][c]
    return x


def fit_scales(data: FitData, train: np.ndarray, box: Box) -> tuple[float, ...]:
    """The (a, b, c) minimising Σ over the ``train`` runs of w·((T₀ + A·(θ − 1)) / M − 1)²,
    w = 1 / (runs of that run's source among them); a scale whose box is one point stays
    there."""
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
    return tuple(float(1.0 + xi) for xi in x)


def leave_one_source_out(data: FitData, box=None, refit_generation: bool | None = None
                         ) -> dict[str, dict]:
    """Per source with runs in ``data``: a and b fitted on every other source, and the
    held-out source's MAPE under them (``loso_mape``, linearised); None where no other source
    has runs.

    c, the Hopper GEMM multiplier: with ``refit_generation`` (the default where
    ``[H100.corpus_fit]`` ships one, :data:`sim.gpu_profiles.RATIOS`) it is refitted in every
    fold as :func:`fit_generation` fits the shipped one, on the other sources' Hopper runs
    (Hagemann's sweep aside, a and b held at the A100 fit), so a held-out Hopper source is
    not in its own c (none of them: c back at 1, unfitted), and a and b are then fitted with
    c held there (``scales``' ``hopper_gemm_time``: the fold's total multiplier). Without
    it, c is held at the shipped value (which then is 1, fitted on nothing)."""
    from sim.gpu_profiles import RATIOS

    box = box or bounds()
    shipped = RATIOS["H100"].corpus_gemm_time
    if refit_generation is None:
        refit_generation = shipped != 1.0
    out = {}
    src = np.array(data.sources)
    sweep = src == HAGEMANN
    for name in sorted(set(data.sources)):
        held = src == name
        train = ~held
        if not train.any():
            out[name] = {"loso_mape": None, "scales": None, "runs": int(held.sum())}
            continue
        c = 1.0
        if refit_generation:
            fold = _generation_scale(data, train & ~sweep, box)
            c = 1.0 / shipped if fold is None else fold
        a, b, _ = fit_scales(data, train, (box[0], box[1], (c, c)))
        sens = data.sens[held]  # (each term its own ufunc: no BLAS, the same bits anywhere)
        pred = (data.base[held] + sens[:, 0] * (a - 1.0) + sens[:, 1] * (b - 1.0)
                + sens[:, 2] * (c - 1.0))
        mape = float(np.mean(np.abs(pred / data.measured[held] - 1.0)))
        scales = {"gemm_time": a, "attention_time": b}
        if refit_generation:
            scales["hopper_gemm_time"] = shipped * c
        out[name] = {"loso_mape": mape, "scales": scales, "runs": int(held.sum())}
    return out


def _generation_scale(data: FitData, train: np.ndarray, box: Box) -> float | None:
    """c, the Hopper GEMM multiplier relative to the shipped one, fitted on the runs
    ``train`` selects with a and b held at the A100 fit (1); None where none of them runs on
    Hopper. The one fit of :func:`fit_generation`, its ``held_out`` folds and the folds of
    :func:`leave_one_source_out`."""
    if not (train & (data.sens[:, 2] != 0)).any():
        return None
    return fit_scales(data, train, ((1.0, 1.0), (1.0, 1.0), box[2]))[2]


def fit_generation(data: FitData, box: Box | None = None) -> dict:
    """The corpus's own constant: c fitted on every source but Hagemann's sweep (each
    weighing the same), a and b held at the A100 fit (1). ``gemm_time`` is the total
    multiplier (the shipped one times the refit), what ``[H100.corpus_fit]`` ships.

    ``held_out``: the shipped pipeline's own leave-one-source-out, per Hopper source: c
    fitted the same way without it (``gemm_time``; None where no other source has Hopper
    runs) and the source's MAPE and mean signed error under that c (``mape``, ``signed``)
    and under none (``unfitted_mape``, ``unfitted_signed``: GEMM times x 1), linearised."""
    from sim.gpu_profiles import RATIOS

    box = box or bounds()
    train = np.array([s != HAGEMANN for s in data.sources], dtype=bool)
    shipped = RATIOS["H100"].corpus_gemm_time
    hopper = train & (data.sens[:, 2] != 0)
    if not hopper.any():
        return {"generation": FITTED_GENERATION, "gemm_time": None, "shipped": shipped,
                "runs": 0}
    c = _generation_scale(data, train, box)
    src = np.array(data.sources)
    names = sorted({s for s, h in zip(data.sources, hopper, strict=True) if h})

    def errors(mask: np.ndarray, rel: float) -> tuple[float, float]:
        err = (data.base[mask] + data.sens[mask, 2] * (rel - 1.0)) / data.measured[mask] - 1.0
        return float(np.mean(np.abs(err))), float(np.mean(err))

    held_out = {}
    for name in names:
        mine = src == name
        others = train & ~mine
        fold = _generation_scale(data, others, box)
        mape, signed = errors(mine, fold) if fold is not None else (None, None)
        unfitted = errors(mine, 1.0 / shipped)
        held_out[name] = {"gemm_time": None if fold is None else shipped * fold,
                          "mape": mape, "signed": signed,
                          "unfitted_mape": unfitted[0], "unfitted_signed": unfitted[1]}
    return {"generation": FITTED_GENERATION, "gemm_time": shipped * c, "shipped": shipped,
            "runs": int(hopper.sum()), "sources": names, "held_out": held_out}


def _step_time(job: tuple) -> float:
    """One sensitivity simulation: a corpus row or a sweep row at the job's scales."""
    row, scales = job
    if isinstance(row, CorpusRow):
        return simulate_corpus_row((row, scales)).step_time_s
    from sim.calibration import A100_HAGEMANN
    from sim.corpus import scaled_profile
    from sim.validate import simulate_row

    return simulate_row(row, scaled_profile(A100_HAGEMANN, scales), idle=False
                        ).stats["step_time_s"]


SCALES = ((1.0 + STEP, 1.0), (1.0, 1.0 + STEP))
"""The two sensitivity simulations of a run that takes part: a and b each moved by :data:`STEP`."""


def fit_runs(hagemann: Sequence, corpus: Sequence[CorpusPrediction]) -> tuple[list, list]:
    """(The sweep's predictions that take part, the corpus's): every
    :data:`HAGEMANN_STRIDE`-th successful one of ``hagemann`` (in its order) and every
    simulated one of ``corpus`` whose step time counts (:attr:`sim.corpus.CorpusRow.timed`)."""
    sweep = [p for p in hagemann if p.row.status == "ok"][::HAGEMANN_STRIDE]
    runs = [p for p in corpus if p.skipped is None and p.row.timed]
    return sweep, runs


def fit_data(hagemann: Sequence, corpus: Sequence[CorpusPrediction], workers: int = 1,
             progress: Callable[[int, int], None] | None = None,
             sweep_name: str = HAGEMANN) -> FitData:
    """The runs that take part (:func:`fit_runs` of the sweep's ``hagemann`` predictions, a
    source named ``sweep_name``, and the ``corpus`` predictions) and their sensitivities, two
    simulations each (:data:`SCALES`), in ``workers`` processes. ``sim validate`` runs those
    simulations in the job of each row's own (:mod:`sim.valjobs`) and assembles the same
    :class:`FitData` with :func:`fit_data_from`; this is the reference it is tested equal
    to."""
    sweep, runs = fit_runs(hagemann, corpus)
    jobs = [(p.row, scales) for p in sweep + runs for scales in SCALES]
    times = map_ordered(_step_time, jobs, workers, progress)
    moved = [tuple(times[i:i + len(SCALES)]) for i in range(0, len(times), len(SCALES))]
    return fit_data_from(sweep, runs, moved, sweep_name)


def fit_data_from(sweep: Sequence, runs: Sequence[CorpusPrediction],
                  moved: Sequence[tuple[float, float]], sweep_name: str = HAGEMANN) -> FitData:
    """The :class:`FitData` of the runs of :func:`fit_runs` (``sweep``, then ``runs``), given
    each one's step times at :data:`SCALES` (``moved``, in that order)."""
    from sim.gpu_profiles import generation_of

    fitted = np.array([False] * len(sweep) + [generation_of(p.gpu or "") == FITTED_GENERATION
                                              for p in runs], dtype=bool)
    keys = [(p.row, sweep_name) for p in sweep] + [(p.row, p.row.source) for p in runs]
    if len(moved) != len(keys):
        raise ValueError(f"{len(moved)} sensitivity pairs for {len(keys)} runs")
    base = np.array([p.step_time_s for p in sweep] + [p.step_time_s for p in runs])
    measured = np.array([p.row.step_time_s for p in sweep] + [p.row.step_time_s for p in runs])
    moved = np.array(moved, dtype=float).reshape(len(keys), 2) if keys else np.zeros((0, 2))
    sens = (moved - base[:, None]) / STEP if keys else moved
    sens = np.column_stack([sens, np.where(fitted, sens[:, 0], 0.0)]) if keys else np.zeros(
        (0, 3))
    return FitData(tuple(name for _, name in keys), measured, base, sens)
