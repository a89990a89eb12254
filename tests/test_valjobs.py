"""sim validate's one job per row (sim.valjobs) against the phases it replaces: the sweep's
predictions, the cross-validation's, the corpus's and leave-one-source-out's sensitivities,
each simulated on its own."""

from __future__ import annotations

import dataclasses

import numpy as np

from sim import valjobs
from sim.calibration import A100_HAGEMANN, A100_HAGEMANN_13B
from sim.corpus import CORPUS_DIR, CorpusRow, load_source, predict_corpus
from sim.loso import HAGEMANN_STRIDE, SCALES, fit_data
from sim.validate import HAGEMANN_SWEEP, load_rows, predict


def _changed(row: CorpusRow, **changes: str) -> CorpusRow:
    """``row`` with some of its columns' text changed (and a run name of its own)."""
    changes.setdefault("run", row.run + "-" + "-".join(changes.values()))
    return dataclasses.replace(row, values=tuple((k, changes.get(k, v)) for k, v in row.values))


def _inputs() -> tuple[list, list[CorpusRow]]:
    """Sweep rows of every model and status, enough for a few leave-one-source-out runs;
    a small corpus source with a row recorded out of memory and one the schema rejects (FP8
    on an A100: skipped, so neither its sensitivities)."""
    rows = load_rows(HAGEMANN_SWEEP)[::45]
    assert {r.model for r in rows} >= {"llama-13b", "llama-30b", "llama-65b"}
    assert {r.status for r in rows} >= {"ok", "oom"}
    assert sum(r.status == "ok" for r in rows) > HAGEMANN_STRIDE
    source = load_source(CORPUS_DIR / "korthikanti2022_megatron.csv")
    corpus = [*source.rows[:3], _changed(source.rows[0], status="oom"),
              _changed(source.rows[0], precision="fp8")]
    return rows, corpus


def test_one_job_per_row_gives_what_the_phases_give() -> None:
    rows, corpus = _inputs()
    sweep_jobs, corpus_jobs = valjobs.plan(rows, corpus, A100_HAGEMANN, A100_HAGEMANN_13B,
                                           "llama-13b", True)
    calls: list[tuple[int, int]] = []
    got = valjobs.run(sweep_jobs, corpus_jobs, workers=2,
                      progress=lambda done, total: calls.append((done, total)),
                      cross=True, fit=True)

    preds = predict(rows, A100_HAGEMANN)
    assert got.preds == preds
    assert got.cross == predict([r for r in rows if r.model != "llama-13b"], A100_HAGEMANN_13B)
    cpreds = predict_corpus(corpus)
    assert got.cpreds == cpreds
    assert cpreds[-1].skipped and "precision" in cpreds[-1].skipped
    ref = fit_data(preds, cpreds)
    assert got.fit.sources == ref.sources
    assert len(ref.sources) > len(corpus) - 2  # the sweep takes part too
    for name in ("measured", "base", "sens"):
        assert np.array_equal(getattr(got.fit, name), getattr(ref, name))

    # the bar counts simulations: the skipped row's and the recorded-OOM row's
    # sensitivities are not run, and come off the total
    ran = (len(preds) + len(got.cross) + len(corpus)
           + len(SCALES) * len(ref.sources))
    dones = [d for d, _ in calls]
    assert dones == sorted(dones) and calls[-1] == (ran, ran)
    assert calls[0][1] == ran + len(SCALES)  # the skipped row planned its sensitivities


def test_without_cross_validation_and_inline() -> None:
    """``--no-cross-validation``: the predictions alone, the same in this process as in a
    pool (and without a corpus the sweep's rows are all there is)."""
    rows, corpus = _inputs()
    sweep_jobs, corpus_jobs = valjobs.plan(rows, corpus, A100_HAGEMANN, None, "llama-13b",
                                           False)
    assert all(j.planned == 1 for j in [*sweep_jobs, *corpus_jobs])
    one = valjobs.run(sweep_jobs, corpus_jobs, workers=1)
    assert one.cross is None and one.fit is None
    assert one.preds == predict(rows, A100_HAGEMANN)
    assert one.cpreds == predict_corpus(corpus)
    alone = valjobs.run(sweep_jobs, [], workers=2)
    assert alone.preds == one.preds and alone.cpreds == []
