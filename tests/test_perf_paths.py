"""The fast paths of issue 7's profiling pass give exactly what the plain algorithms give.

- the engine on fixed-duration programs the array pass declines (a collective of two
  members, ids not in topological order): the event queue's result, and a collective
  that never completes (a deadlock report);
- the statistics' interval union and difference against a brute-force reference;
- the idle breakdown on a program whose chains point to later ids;
- :class:`workloads.schedules.Op` as a named tuple: hashing, order and text form as before.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from base.errors import DeadlockError
from sim.engine import InstructionTimes, simulate_program
from sim.idle import idle_breakdown
from sim.stats import _length, _minus, _union
from topologies.cluster import Cluster
from workloads.program import Collective, Compute, Program, ProgramBuilder
from workloads.schedules import Op, gpipe, op_deps, schedule_deps
from workloads.schedules_advanced import interleaved


def _cluster(n: int) -> Cluster:
    from sim.experiment import Experiment

    return Experiment.from_dict({
        "name": "tiny", "model": {"synthetic": {"forward_ms": 1, "backward_ms": 2}},
        "cluster": {"preset": "ideal", "num_gpus": n}, "parallel": {"pp": n},
        "training": {"num_microbatches": 2}, "schedule": "1f1b"}).cluster


def _fixed_program() -> Program:
    """Two GPUs, every duration fixed: compute with memory and blocking communication,
    sends both ways, a two-member collective and a one-member one."""
    b = ProgramBuilder()
    c0 = b.compute(0, "F", "0F0", (), duration_s=1.0, alloc_bytes=5.0, blocking_comm_s=0.5)
    s0 = b.send(0, 1, 8.0, "pp", "0F0 act", (c0,), duration_s=0.25)
    c1 = b.compute(1, "F", "1F0", (s0,), duration_s=2.0, alloc_bytes=3.0, free_bytes=1.0)
    s1 = b.send(1, 0, 8.0, "pp", "1B0 grad", (c1,), duration_s=0.25)
    ar = b.collective((0, 1), {0: (s1,), 1: (c1,)}, kind="dp", name="ar", op="all_reduce",
                      nbytes=4.0, duration_s=0.75)
    b.collective((1,), {1: (ar[1],)}, kind="tp", name="ag", op="all_gather", nbytes=2.0,
                 duration_s=0.0)
    b.compute(0, "opt", "opt", (ar[0],), duration_s=0.5, free_bytes=5.0)
    return Program(2, b.build(), (10.0, 20.0), gpipe(2, 1))


def test_queue_free_pass_equals_the_event_queue_on_a_fixed_program() -> None:
    """Every duration fixed, but a collective of two members: no array pass (it takes
    collectives of one), the event queue runs it either way; its records."""
    program = _fixed_program()
    fast = simulate_program(program, _cluster(2), lambda i: i.duration_s)
    slow = simulate_program(program, _cluster(2), lambda i: i.duration_s, event_queue=True)
    assert fast == slow
    assert fast.flows and fast.memory and len(fast.spans) == 11


def test_ids_out_of_topological_order_run_on_the_event_queue() -> None:
    """An instruction that depends on a later id: the array pass declines, the event queue
    runs it."""
    b = ProgramBuilder()
    b.compute(0, "F", "late", (1,), duration_s=1.0)
    b.compute(1, "F", "early", (), duration_s=2.0)
    program = Program(2, b.build(), (0.0, 0.0), gpipe(2, 1))
    fast = simulate_program(program, _cluster(2), lambda i: i.duration_s)
    slow = simulate_program(program, _cluster(2), lambda i: i.duration_s, event_queue=True)
    assert fast == slow
    assert [(s.name, s.start_s, s.end_s) for s in fast.spans] == [("late", 2.0, 3.0),
                                                                  ("early", 0.0, 2.0)]


def test_collective_missing_a_member_is_reported() -> None:
    """A collective of GPUs 0 and 1 that only GPU 0 reaches: the deadlock report names the
    missing member."""
    instrs = (Compute(0, 0, "F", "x", (), duration_s=1.0),
              Collective(1, 0, "dp", "ar", (0,), "all_reduce", "ring", (0, 1), 1.0, 0,
                         duration_s=1.0))
    program = Program(2, instrs, (0.0, 0.0), gpipe(2, 1))
    with pytest.raises(DeadlockError, match=r"collective members \[1\]"):
        simulate_program(program, _cluster(2), lambda i: i.duration_s)


def test_idle_breakdown_follows_chains_to_later_ids() -> None:
    """Chains that point to later ids (filled from the root) give the shares of the same
    program written in id order."""
    def build(late_first: bool) -> Program:
        b = ProgramBuilder()
        if late_first:
            b.compute(0, "B", "wait", (1,), duration_s=1.0)
            b.compute(1, "F", "work", (), duration_s=3.0)
        else:
            b.compute(1, "F", "work", (), duration_s=3.0)
            b.compute(0, "B", "wait", (0,), duration_s=1.0)
        return Program(2, b.build(), (0.0, 0.0), gpipe(2, 1))

    out = []
    for late_first in (True, False):
        program = build(late_first)
        times = InstructionTimes()
        simulate_program(program, _cluster(2), lambda i: i.duration_s, times=times)
        out.append(idle_breakdown(program, times.ready_s, times.end_s, (0, 1)))
    assert out[0] == out[1]
    assert out[0][0]["bubble"] == 3.0 and out[0][1]["bubble"] == 1.0


intervals = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)).map(
    lambda t: (t[0] / 4, t[1] / 4)), max_size=30)


def _covered(ivs: list[tuple[float, float]]) -> set[int]:
    """Quarter-unit cells covered by ``ivs`` (their ends are multiples of 1/4)."""
    return {k for a, b in ivs for k in range(int(a * 4), int(b * 4))}


@settings(max_examples=200, deadline=None)
@given(intervals, intervals)
def test_union_and_difference_match_brute_force(a: list, b: list) -> None:
    ua, ub = _union(a), _union(b)
    assert all(x[1] < y[0] for x, y in zip(ua, ua[1:], strict=False))  # sorted, disjoint
    assert _covered(ua) == _covered(a)
    assert _length(ua) == len(_covered(a)) / 4
    assert _minus(ua, ub) == len(_covered(a) - _covered(b)) / 4


def test_op_is_a_named_tuple_with_the_old_behaviour() -> None:
    op = Op(3, "B", 7)
    assert op == Op.parse("3B7") and str(op) == "3B7" and repr(op) == "Op(3B7)"
    assert f"{Op(1, 'F', 2, 3)}" == "1F2.3" and Op.parse("1F2.3").seq == 3
    assert hash(op) == hash((3, "B", 7, -1)) and op.renumbered(9) == Op(3, "B", 9)
    assert sorted([Op(1, "F", 0), Op(0, "W", 5), Op(0, "B", 5)]) == [
        Op(0, "B", 5), Op(0, "W", 5), Op(1, "F", 0)]
    assert type(op_deps(op, 8, False)[0]) is Op
    sched = interleaved(4, 8, 2)
    for ops in sched.rank_ops:
        for o in ops:
            assert schedule_deps(sched, o) == op_deps(o, sched.num_stages, False)


@pytest.mark.parametrize("parallel,schedule,seq", [
    ({"tp": 4, "pp": 4, "dp": 2, "vpp": 2}, "interleaved", 1024),
    ({"tp": 4, "pp": 2, "dp": 2, "sequence_parallel": True}, "1f1b", 1024),
    ({"tp": 2, "pp": 4, "dp": 2}, "zb-h1", 1024),
    ({"tp": 2, "pp": 2, "dp": 2}, "seq1f1b", 2048),
])
def test_collapsed_fast_lowering_equals_the_general_loop(parallel: dict, schedule: str,
                                                         seq: int, monkeypatch) -> None:
    """:func:`workloads.lowering.columnar.lower_collapsed` builds the program of the reference
    op loop, instruction for instruction (names, ids, dependencies, keys, durations)."""
    from sim.commtime import CollectiveTimer
    from sim.experiment import Experiment
    from workloads import lowering
    from workloads.lowering import Collapse, lower

    gpus = parallel["tp"] * parallel["pp"] * parallel["dp"]
    data = {"name": "fast", "model": {"preset": "llama-7b", "num_layers": 8, "seq_length": seq},
            "cluster": {"preset": "dgx-a100-80g", "num_gpus": gpus},
            "parallel": parallel, "schedule": schedule,
            "training": {"micro_batch_size": 1, "global_batch_size": 16}}
    if schedule == "seq1f1b":
        data["training"]["seq_chunks"] = 2
    exp = Experiment.from_dict(data)
    collapse = Collapse(compute_s=lambda seg: seg.flops * 1e-15 + seg.hbm_bytes * 1e-12,
                        collective_s=CollectiveTimer(exp.cluster))
    args = (exp.schedule, exp.costs, exp.placement, exp.config.parallel.zero_stage, collapse)
    calls = []
    real = lowering.lower_collapsed
    monkeypatch.setattr(lowering, "lower_collapsed", lambda *a: calls.append(1) or real(*a))
    fast, general = lower(*args), lower(*args, reference=True)
    assert calls == [1]  # the fast path ran (once: not for the general loop)
    assert [type(i) for i in fast.instructions] == [type(i) for i in general.instructions]
    assert fast == general
    assert repr(fast.instructions) == repr(general.instructions)
