"""benchmarks/calibrate.py's memory fit: issue 19's criterion on synthetic sweeps."""

from types import SimpleNamespace

import pytest
from conftest import load_benchmark

GiB = 2**30

CAL = load_benchmark("calibrate")
FREE = CAL.CAPACITY / GiB - 1.0 - 10.0
"""Dynamic GiB that fit beside a 10 GiB static state and 1 GiB reserved."""


def _run(flagged_from: float | None, status: str) -> SimpleNamespace:
    """A one-GPU prediction (sim.validate.Prediction's ``memory_parts`` and ``row.status``)
    flagged out of memory from fragmentation ``flagged_from`` up (None: never, -0.5: always)."""
    dynamic = FREE / 2 if flagged_from is None else FREE / (1 + flagged_from) * 1.001
    return SimpleNamespace(memory_parts=[(10.0 * GiB, dynamic * GiB)],
                           row=SimpleNamespace(status=status))


def _sweep(clear: int) -> list[SimpleNamespace]:
    """``clear`` runs whose verdict no fragmentation changes (half ran, half failed), one run
    that ran flagged from f = 0.10 and two that failed caught only from f = 0.30."""
    return ([_run(None, "ok")] * (clear // 2) + [_run(-0.5, "oom")] * (clear - clear // 2)
            + [_run(0.10, "ok")] + [_run(0.30, "oom")] * 2)


def test_no_run_that_ran_flagged_beats_a_higher_accuracy_above_95_percent() -> None:
    # 43 runs: f < 0.10 0 flagged, 2 missed (41/43 = 95.3%); f ≥ 0.30 1 flagged (42/43)
    acc, reserved, frag = CAL.fit_memory(_sweep(40), reserved_gib=1.0)
    assert reserved == GiB
    assert (frag, acc) == (0.0, pytest.approx(41 / 43))


def test_below_95_percent_the_flagged_run_is_accepted_at_the_best_accuracy() -> None:
    # 30 runs: f < 0.10 28/30 (93.3%, below the floor); 0.10-0.29 27/30; f ≥ 0.30 29/30
    acc, _, frag = CAL.fit_memory(_sweep(27), reserved_gib=1.0)
    assert (frag, acc) == (0.30, pytest.approx(29 / 30))


def test_where_no_fragmentation_reaches_the_floor_the_most_accurate_smallest_is_taken() -> None:
    acc, _, frag = CAL.fit_memory(_sweep(40), reserved_gib=1.0, target=0.99)
    assert (frag, acc) == (0.30, pytest.approx(42 / 43))


def test_rows_of_a_contradicted_pair_do_not_count_as_false_oom() -> None:
    # as the first test, but the run that ran and is flagged from f = 0.10 is the ran row of
    # a pair the sweep contradicts (sim.validate.contradicted_ran): f = 0.30 now has no
    # false OOM counted and the higher accuracy (42/43)
    sweep = _sweep(40)
    sweep[40] = SimpleNamespace(memory_parts=sweep[40].memory_parts,
                                row=SimpleNamespace(status="ok", index=7))
    acc, _, frag = CAL.fit_memory(sweep, reserved_gib=1.0, not_counted=frozenset({7}))
    assert (frag, acc) == (0.30, pytest.approx(42 / 43))
