"""The lowering's remembered pieces (:func:`workloads.lowering.collapse.folded_plan`,
:meth:`workloads.lowering.pieces.PieceLowering._replay`) on the validation corpus's own
rows: each row's program, lowered as ``sim validate`` lowers it (its prediction and both
leave-one-source-out sensitivities, :data:`sim.loso.SCALES`), equals the reference op loop's
(``lower(..., reference=True)``) with the same costs and timers, instruction for
instruction. ``tests/test_lowering_paths.py`` does the same on random experiments."""

from __future__ import annotations

import pytest

import sim.api
from sim.corpus import CORPUS_DIR, load_corpus, simulate_corpus_row
from sim.loso import SCALES
from workloads.lowering import lower
from workloads.program import ColumnarInstructions

SLOW = frozenset({"mlperf_training_v30_gpt3", "mlperf_training_v31_gpt3",
                  "dubey2024_llama3_405b", "megatron_bridge_perf", "nemo2412_fp8"})
"""Sources whose first row takes 10-40 s here (thousands of GPUs, or ZeRO's pieces lowered
three times each way, 50-190 s on the shared machine): left to ``sim validate``'s own
byte-for-byte comparison (docs/speed.md)."""


def _rows() -> list:
    """Per corpus source (but :data:`SLOW`), its first row that ran."""
    return [next(r for r in source.rows if r.status == "ok") for source in load_corpus(CORPUS_DIR)
            if source.name not in SLOW]


@pytest.mark.parametrize("row", _rows(), ids=lambda r: r.source)
def test_corpus_programs_equal_the_reference(row, monkeypatch: pytest.MonkeyPatch) -> None:
    lowered: list[tuple[tuple, dict, object]] = []

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        program = lower(*args, **kwargs)
        lowered.append((args, kwargs, program))
        return program

    monkeypatch.setattr(sim.api, "lower", recording)
    for scales in ((1.0, 1.0), *SCALES):
        pred = simulate_corpus_row((row, scales))
        if pred.skipped is not None:
            pytest.skip(pred.skipped)
    assert len(lowered) >= 3
    for args, kwargs, program in lowered:
        assert len(args) == 7 and not args[5] and not kwargs  # sim.api's call: not reference
        if isinstance(program.instructions, ColumnarInstructions):
            continue  # the columnar fast path: tests/test_lowering_paths.py
        ref = lower(*args[:5], True, *args[6:])
        assert repr(program.instructions) == repr(ref.instructions)
        assert program == ref
