"""Which GPU generation's GEMMs the corpus disputes (issue 19 item 6): diagnostics on the
leave-one-source-out data of ``sim validate`` (:class:`sim.loso.FitData`).

    python benchmarks/generation_fit.py [--workers 2] [--save fit.pkl | --load fit.pkl]

Simulates what ``sim validate`` simulates for its leave-one-source-out fits (the sweep's
every :data:`sim.loso.HAGEMANN_STRIDE`-th successful run and every corpus run, each at the
shipped profile and at :data:`sim.loso.SCALES`; 4-10 min on 2 shared cores), or reads them
back (``--load``), and prints, linearised as ``sim validate`` does:
- the GEMM and attention time scales (a, b of :func:`sim.loso.fit_scales`) fitted on the
  A100 sources alone, each source weighing the same, with and without Hagemann's sweep: what
  a joint A100 fit would ship beside the sweep's own (1, 1);
- the Hopper GEMM multiplier c fitted on the corpus (:func:`sim.loso.fit_generation`, what
  ``[H100.corpus_fit]`` would ship), and per source the in-sample MAPE and mean signed error
  with c at 1 and at that value, and leave-one-source-out with c held at the shipped value
  and refitted in every fold (:func:`sim.loso.leave_one_source_out`'s two modes).
Nothing here changes the model; docs/accuracy.md records what it printed.
"""

from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim import loso  # noqa: E402


def simulate(workers: int) -> loso.FitData:
    """The FitData of ``sim validate`` on the bundled sweep and corpus."""
    from sim import valjobs
    from sim.calibration import A100_HAGEMANN
    from sim.corpus import CORPUS_DIR, load_corpus
    from sim.validate import HAGEMANN_SWEEP, load_rows

    rows = load_rows(HAGEMANN_SWEEP)
    sources = load_corpus(CORPUS_DIR)
    sweep_jobs, corpus_jobs = valjobs.plan(rows, [r for s in sources for r in s.rows],
                                           A100_HAGEMANN, None, "llama-13b", True)
    done = valjobs.run(sweep_jobs, corpus_jobs, workers, None, HAGEMANN_SWEEP.stem,
                       cross=False, fit=True)
    return done.fit


def report(data: loso.FitData) -> None:
    src = np.array(data.sources)
    names = sorted(set(data.sources))
    hopper = data.sens[:, 2] != 0
    box = loso.bounds()

    def errors(pred: np.ndarray, name: str) -> tuple[float, float]:
        e = pred[src == name] / data.measured[src == name] - 1.0
        return float(np.mean(np.abs(e))), float(np.mean(e))

    a100 = np.array([not h for h in hopper])  # runs on A100s (the sweep's and the corpus's)
    for label, train in (("A100 runs, sweep included", a100),
                         ("A100 runs, sweep aside", a100 & (src != loso.HAGEMANN))):
        a, b, _ = loso.fit_scales(data, train, (box[0], box[1], (1.0, 1.0)))
        print(f"a, b fitted on the {label}: GEMM time x {a:.4f}, attention time x {b:.4f}")
    fit = loso.fit_generation(data)
    c = fit["gemm_time"] / fit["shipped"]
    print(f"Hopper GEMM time multiplier fitted on the corpus (sweep aside): "
          f"{fit['gemm_time']:.4f} (shipped {fit['shipped']:g})")
    held = loso.leave_one_source_out(data, box, refit_generation=False)
    refit = loso.leave_one_source_out(data, box, refit_generation=True)
    with_c = data.base + data.sens[:, 2] * (c - 1.0)
    print(f"{'source':32s} {'runs':>4s}  {'MAPE c=1 -> c':>15s}  {'signed c=1 -> c':>17s}  "
          f"{'LOSO held -> refit':>18s}")
    for name in names:
        m0, s0 = errors(data.base, name)
        m1, s1 = errors(with_c, name)
        print(f"{name:32s} {int(np.sum(src == name)):4d}  {m0:6.2%} -> {m1:6.2%}  "
              f"{s0:+7.2%} -> {s1:+7.2%}  {held[name]['loso_mape']:7.2%} -> "
              f"{refit[name]['loso_mape']:7.2%}")
    print(f"mean over sources: LOSO {np.mean([held[n]['loso_mape'] for n in names]):.2%} -> "
          f"{np.mean([refit[n]['loso_mape'] for n in names]):.2%}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--save", default="", help="keep the simulated FitData in this file")
    group.add_argument("--load", default="", help="read a FitData kept by --save")
    args = ap.parse_args()
    if args.load:
        with open(args.load, "rb") as f:
            data = pickle.load(f)
    else:
        data = simulate(args.workers)
        if args.save:
            with open(args.save, "wb") as f:
                pickle.dump(data, f)
    report(data)


if __name__ == "__main__":
    main()
