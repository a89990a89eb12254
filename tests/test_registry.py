"""The schedule registry: each schedule's properties agree with what its builder builds."""

from __future__ import annotations

import pytest
from conftest import synthetic_experiment

from base.errors import ScheduleError
from sim.compare import schedule_changes
from sim.experiment import build_experiment
from workloads.registry import SCHEDULES, overlaps_steps
from workloads.schedules import validate


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_properties_match_the_built_schedule(name: str) -> None:
    kind = SCHEDULES[name]
    sched = kind(4, 8, None, 3)
    validate(sched)
    assert sched.name == name
    assert sched.chunks_per_rank == kind.default_vpp
    assert sched.split_backward == kind.split_backward
    assert (sched.seq_chunks > 1) == kind.seq_chunks
    if kind.fixed_vpp is not None:
        assert kind.default_vpp == kind.fixed_vpp
        if kind.fixed_vpp > 1:  # a V placement refuses other chunk counts
            with pytest.raises(ScheduleError):
                kind(4, 8, 1)
    else:
        assert kind(4, 8, 3).chunks_per_rank == 3


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_an_experiment_and_compare_take_the_default_chunks(name: str) -> None:
    cfg = synthetic_experiment(4, 8, name)
    del cfg["parallel"]["vpp"]
    exp = build_experiment(cfg)
    assert exp.config.parallel.vpp == SCHEDULES[name].default_vpp
    assert schedule_changes(exp, name) == {"schedule": name,
                                           "parallel.vpp": SCHEDULES[name].default_vpp}


def test_only_zero_bubble_h2_and_v_overlap_steps() -> None:
    """The Zero Bubble paper's optimizer post-validation (Qi et al. 2024, sec. 4) drops the
    barrier for ZB-H2 and ZB-V only; a schedule file keeps it."""
    assert {n for n in SCHEDULES if overlaps_steps(n)} == {"zb-h2", "zb-v"}
    assert not overlaps_steps("my_schedule.txt")
