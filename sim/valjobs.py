"""``sim validate``'s simulations, one job per row: what it simulates of a row runs back to back.

``sim validate`` simulates a row up to four times: its prediction, the cross-validation's
(a 30B or 65B sweep row with the profile calibrated on 13B), and the two sensitivity runs of
leave-one-source-out (:data:`sim.loso.SCALES`, for the rows :func:`sim.loso.fit_runs`
selects). Run as one phase after another, each in a pool of its own, a row's later
simulations found nothing of what its first one built (its cluster, the collective timer's
plans, the schedule, the lowering's folds): those caches are per process, and bounded.
Here every simulation of a row is one job (:class:`SweepJob`, :class:`CorpusJob`), run in
one worker back to back, so the later ones find the first one's caches; every job of the
command runs in one pool, so no phase waits for the slowest job of the one before.

The jobs are the same simulations with the same inputs as the phases ran (the caches
they share give the same floats as fresh ones), and their outcomes are put in row order
whatever the workers' timing: ``sim validate``'s report is the same byte for byte
(``tests/test_valjobs.py`` compares with the phases, :func:`sim.validate.predict`,
:func:`sim.corpus.predict_corpus` and :func:`sim.loso.fit_data`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass

from sim.corpus import CorpusPrediction, CorpusRow, simulate_corpus_row
from sim.device import DeviceProfile
from sim.loso import HAGEMANN, HAGEMANN_STRIDE, SCALES, FitData, _step_time, fit_data_from, fit_runs
from sim.validate import Prediction, Row, _predict_one

SWEEP_CHUNK = 4
"""Consecutive sweep rows sent to a worker at once (neighbours in the file share a model, a
sequence length and a cluster; as :func:`sim.validate.predict` sends them)."""


@dataclass(frozen=True)
class SweepJob:
    """A sweep row's simulations: its prediction with the shipped profile, then with
    ``cross`` (the cross-validation's; None: not asked), then, with ``sensitivities``, its
    step time at each of :data:`sim.loso.SCALES` of the shipped profile."""

    row: Row
    profile: DeviceProfile
    cross: DeviceProfile | None = None
    sensitivities: bool = False

    @property
    def planned(self) -> int:
        """Simulations it runs."""
        return 1 + (self.cross is not None) + len(SCALES) * self.sensitivities


@dataclass(frozen=True)
class CorpusJob:
    """A corpus row's simulations: its prediction, then, with ``sensitivities`` and where the
    row was simulated and ran (:func:`sim.loso.fit_runs`), its step time at each of
    :data:`sim.loso.SCALES`."""

    row: CorpusRow
    sensitivities: bool = False

    @property
    def planned(self) -> int:
        """Simulations it runs at most (a skipped row, one recorded out of memory, or one
        whose step time is disputed, runs only the first)."""
        return 1 + len(SCALES) * (self.sensitivities and self.row.timed)


@dataclass(frozen=True)
class Outcome:
    """What a job found: the row's prediction, the cross-validation's (or None), the step
    times at :data:`sim.loso.SCALES` (or None) and how many simulations it ran."""

    base: Prediction | CorpusPrediction
    cross: Prediction | None
    moved: tuple[float, ...] | None
    ran: int


def run_job(job: SweepJob | CorpusJob) -> Outcome:
    """Every simulation of ``job``'s row, back to back in this process."""
    if isinstance(job, SweepJob):
        base = _predict_one((job.row, job.profile))
        cross = None if job.cross is None else _predict_one((job.row, job.cross))
        moved = (tuple(_step_time((job.row, s)) for s in SCALES) if job.sensitivities
                 else None)
        return Outcome(base, cross, moved, job.planned)
    pred = simulate_corpus_row((job.row, (1.0, 1.0)))
    if not (job.sensitivities and pred.skipped is None and job.row.timed):
        return Outcome(pred, None, None, 1)
    return Outcome(pred, None, tuple(_step_time((job.row, s)) for s in SCALES),
                   1 + len(SCALES))


def _run_chunk(jobs: tuple[SweepJob | CorpusJob, ...]) -> list[Outcome]:
    return [run_job(j) for j in jobs]


@dataclass(frozen=True)
class Validation:
    """The simulations of ``sim validate``: the sweep's predictions (:func:`sim.validate.predict`
    of its rows), the cross-validation's (None: not asked), the corpus's
    (:func:`sim.corpus.predict_corpus`) and leave-one-source-out's :class:`sim.loso.FitData`
    (None: not asked, or no corpus)."""

    preds: list[Prediction]
    cross: list[Prediction] | None
    cpreds: list[CorpusPrediction]
    fit: FitData | None


def plan(rows: Sequence[Row], corpus_rows: Sequence[CorpusRow], profile: DeviceProfile,
         cross_profile: DeviceProfile | None, cross_model: str, sensitivities: bool
         ) -> tuple[list[SweepJob], list[CorpusJob]]:
    """The jobs: one per sweep row compared (``ok`` or ``oom``), its cross-validation run
    where ``cross_profile`` is given and its model is not ``cross_model`` (the one the
    profile was calibrated on), its sensitivities where ``sensitivities`` and it is one of
    :func:`sim.loso.fit_runs`' (every :data:`sim.loso.HAGEMANN_STRIDE`-th successful one);
    one per corpus row, with its sensitivities where ``sensitivities``."""
    todo = [r for r in rows if r.status in ("ok", "oom")]
    fitted = {id(r) for r in [r for r in todo if r.status == "ok"][::HAGEMANN_STRIDE]}
    sweep = [SweepJob(r, profile,
                      cross_profile if cross_profile is not None and r.model != cross_model
                      else None,
                      sensitivities and id(r) in fitted) for r in todo]
    return sweep, [CorpusJob(r, sensitivities) for r in corpus_rows]


def run(sweep_jobs: Sequence[SweepJob], corpus_jobs: Sequence[CorpusJob],
        workers: int = 1, progress: Callable[[int, int], None] | None = None,
        sweep_name: str = HAGEMANN, cross: bool = False, fit: bool = False
        ) -> Validation:
    """Run the jobs in ``workers`` processes (in this one for one worker), calling
    ``progress(simulations done, simulations to run)`` as jobs finish (a skipped corpus row
    takes its sensitivities off the total); assemble the :class:`Validation` in row order.
    ``cross``: the cross-validation was asked (its list, empty or not); ``fit``: the fits
    were (``sweep_name``: the sweep's source name in them)."""
    chunks: list[tuple[SweepJob | CorpusJob, ...]] = [(j,) for j in corpus_jobs]
    chunks += [tuple(sweep_jobs[i:i + SWEEP_CHUNK])
               for i in range(0, len(sweep_jobs), SWEEP_CHUNK)]
    # corpus rows first: fewer, and each far longer than a sweep row; the sweep's short
    # jobs then even out the workers' ends
    total = sum(j.planned for c in chunks for j in c)
    done = 0
    results: list[list[Outcome] | None] = [None] * len(chunks)

    def finished(i: int, outcomes: list[Outcome]) -> None:
        nonlocal done, total
        results[i] = outcomes
        for job, o in zip(chunks[i], outcomes, strict=True):
            done += o.ran
            total -= job.planned - o.ran
        if progress:
            progress(done, total)

    if workers <= 1 or len(chunks) < 2:
        for i, c in enumerate(chunks):
            finished(i, _run_chunk(c))
    else:
        # what a first simulation imports, once here rather than in every worker (forked
        # from this process on Linux, they inherit it)
        import sim.api  # noqa: F401
        import sim.experiment  # noqa: F401

        with ProcessPoolExecutor(max_workers=workers) as pool:
            try:
                futures = {pool.submit(_run_chunk, c): i for i, c in enumerate(chunks)}
                pending = set(futures)
                while pending:
                    ready, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in sorted(ready, key=futures.__getitem__):
                        finished(futures[fut], fut.result())
            except BaseException:
                pool.shutdown(cancel_futures=True)
                raise
    by_chunk = [o for c in results for o in c]  # type: ignore[union-attr]
    corpus_out, sweep_out = by_chunk[:len(corpus_jobs)], by_chunk[len(corpus_jobs):]
    preds = [o.base for o in sweep_out]
    cpreds = [o.base for o in corpus_out]
    cross_preds = [o.cross for o in sweep_out if o.cross is not None] if cross else None
    data = None
    if fit:
        moved = {id(o.base): o.moved for o in by_chunk if o.moved is not None}
        sweep, runs = fit_runs(preds, cpreds)  # the runs the sensitivities were planned for
        data = fit_data_from(sweep, runs, [moved[id(p)] for p in [*sweep, *runs]],
                             sweep_name)
    return Validation(preds, cross_preds, cpreds, data)
