"""The engine's full-fidelity fast paths against their references on random programs.

- :func:`workloads.streams.stream_columns` (each instruction's stream predecessor and deps,
  read as columns) against the loop :func:`sim.engine._predecessors`, and the DAG built
  from it (:func:`sim.engine._dag_on_arrays`) against the reference's two loops;
- the own heap's compute ends that share one entry when pushed one after another for the
  same instant (:meth:`sim.engine._Run._loop`) against SimPy's queue (the reference), with
  flows on the network: the same times, bit for bit, and the same counters.
"""

from __future__ import annotations

from array import array

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine import (
    EngineCounters,
    InstructionTimes,
    _dag_on_arrays,
    _predecessors,
    _Run,
    simulate_program,
)
from sim.packedpass import dag
from topologies.cluster import Cluster
from workloads.packed import PackedBuilder, PackedInstructions
from workloads.program import Program, ProgramBuilder
from workloads.schedules import gpipe
from workloads.streams import packed_before, stream_columns

GPUS = 4


def _cluster() -> Cluster:
    """Two DGX A100 servers: the program's 4 GPUs share one (NVLink flows)."""
    from sim.experiment import Experiment

    return Experiment.from_dict({
        "name": "tiny", "model": {"synthetic": {"forward_ms": 1, "backward_ms": 2}},
        "cluster": {"preset": "dgx-a100-80g", "num_gpus": 16}, "parallel": {"pp": 2},
        "training": {"num_microbatches": 2}, "schedule": "1f1b"}).cluster


CLUSTER = _cluster()


@st.composite
def programs(draw: st.DrawFn, builder: type = ProgramBuilder) -> Program:
    """Random programs on 4 GPUs: compute ops (few distinct durations, so that ends meet at
    one instant), sends and collectives with or without fixed durations, deps on earlier
    instructions (``builder``: the plain one, or the packed one)."""
    b = builder()
    for _ in range(draw(st.integers(1, 40))):
        n = b.next_id
        deps = tuple(sorted(set(draw(st.lists(st.integers(0, n - 1), max_size=3))))) if n else ()
        what = draw(st.sampled_from(["compute", "compute", "each", "send", "collective"]))
        gpu = draw(st.integers(0, GPUS - 1))
        duration = draw(st.sampled_from([None, 0.0, 1e-3, 2e-3]))
        if what == "compute":
            b.compute(gpu, draw(st.sampled_from(["F", "B"])), "c", deps,
                      duration_s=draw(st.sampled_from([0.0, 1e-3, 2e-3])))
        elif what == "each":
            gpus = tuple(range(GPUS))
            b.compute_each(gpus, "F", "e", {g: deps for g in gpus}, duration_s=1e-3)
        elif what == "send":
            dst = (gpu + draw(st.integers(1, GPUS - 1))) % GPUS
            b.send(gpu, dst, draw(st.sampled_from([0.0, 1e6, 4e6])), "pp", "s", deps,
                   duration_s=duration)
        else:
            group = tuple(draw(st.permutations(range(GPUS)))[:draw(st.integers(1, GPUS))])
            b.collective(group, {g: deps for g in group},
                         kind=draw(st.sampled_from(["tp", "dp"])), name="a",
                         op=draw(st.sampled_from(["all_reduce", "all_gather"])),
                         nbytes=draw(st.sampled_from([1e6, 8e6])), duration_s=duration)
    return Program(GPUS, b.build(), (0.0,) * GPUS, gpipe(1, 1))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(programs())
def test_stream_columns_equal_the_loop(program: Program) -> None:
    """The columns' stream predecessors and deps are the loop's; the DAG built from them is
    the reference's (the same successor lists, first indices and counters)."""
    instrs = program.instructions
    columns = stream_columns(instrs)
    assert columns is not None
    before, ndeps, flat = _predecessors(instrs)
    assert columns.before.tolist() == before.tolist()
    assert columns.ndeps.tolist() == ndeps.tolist()
    assert columns.flat.tolist() == flat.tolist()
    succ, first, waiting = _dag_on_arrays(instrs)
    ref = _Run(program, CLUSTER, lambda ins: ins.duration_s, reference=True)
    ref._build_dag(program)
    assert list(succ) == list(ref.succ) and list(first) == list(ref.first)
    assert list(waiting) == list(ref.waiting)


def test_stream_columns_decline_ids_out_of_place() -> None:
    """Ids that are not positions: no columns (the loop decides)."""
    b = ProgramBuilder(first_id=3)
    b.compute(0, "F", "c", (), duration_s=1.0)
    assert stream_columns(b.build()) is None
    assert stream_columns(()) is None


@settings(max_examples=150, deadline=None, derandomize=True)
@given(programs(PackedBuilder))
def test_packed_stream_predecessors_equal_the_loop(program: Program) -> None:
    """A packed program's stream predecessors (:func:`workloads.streams.packed_before`, one
    scatter of the sorted order) and its DAG (:func:`sim.packedpass.dag`) are the loop's and
    the reference's."""
    instrs = program.instructions
    assert isinstance(instrs, PackedInstructions)
    before, ndeps, flat = _predecessors(instrs)
    assert packed_before(instrs).tolist() == before.tolist()
    columns = stream_columns(instrs)
    assert columns is not None
    assert columns.before.dtype == np.int64
    assert columns.before.tolist() == before.tolist()
    assert columns.ndeps.tolist() == ndeps.tolist() and columns.flat.tolist() == flat.tolist()
    assert instrs.before is None  # kept only where asked
    succ, first, waiting = dag(instrs)
    ref = _Run(program, CLUSTER, lambda ins: ins.duration_s, reference=True)
    ref._build_dag(program)
    assert list(succ) == list(ref.succ) and list(first) == list(ref.first)
    assert list(waiting) == list(ref.waiting)
    # the DAG build keeps the predecessors (a second build too); a call without keep takes them
    assert instrs.before is not None and dag(instrs) == (succ, first, waiting)
    assert instrs.before is not None
    assert packed_before(instrs).tolist() == before.tolist()
    assert instrs.before is None


@settings(max_examples=150, deadline=None, derandomize=True)
@given(programs())
def test_batched_compute_ends_equal_the_event_queue(program: Program) -> None:
    """The own heap (compute ends of one instant in one entry) gives SimPy's times bit for bit
    and the same counters, flows on the network included."""
    def timer(ins: object) -> float:
        return ins.duration_s  # type: ignore[attr-defined]

    runs = []
    for queue in (False, True):
        times, counters = InstructionTimes(), EngineCounters()
        try:
            # a link change (none) keeps even a program without flows on the queue
            simulate_program(program, CLUSTER, timer, counters, event_queue=queue, times=times,
                             link_changes=((1e9, {}),))
        except Exception as error:  # noqa: BLE001 - both must fail alike
            runs.append(type(error).__name__)
            continue
        runs.append((array("d", times.ready_s).tobytes(), array("d", times.end_s).tobytes(),
                     np.asarray(times.mid_s, dtype=float).tobytes(), counters.events,
                     counters.flows, counters.rate_recomputations, counters.rerated_flows,
                     counters.bytes_on_link))
    assert runs[0] == runs[1]


CAPACITIES = [1e9, 1e9 * (1 + 5e-13), 1e9 * (1 + 2e-12), 2e9, 3.5e9, 0.0]
"""Link bandwidths with ties, near-ties inside and just outside the 1e-12 tolerance."""


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.lists(st.integers(0, 3), max_size=3), max_size=12),
       st.lists(st.sampled_from(CAPACITIES), min_size=48, max_size=48))
def test_flows_alone_on_their_links_get_the_filling_rates(routes: list[list[int]],
                                                          caps: list[float]) -> None:
    """:func:`sim.network._alone` (flows that share no link) gives :func:`_filled`'s rates
    bit for bit: smallest capacities with ties inside and outside the tolerance, flows on
    no finite link, a route crossing a link twice (it shares: the filling decides)."""
    from sim.network import _alone, _filled

    flows, used = {}, 0
    for fid, route in enumerate(routes):
        links = tuple(used + k for k in route)  # disjoint across flows, repeats within
        used += 4
        flows[fid * 7] = links
    assert _alone(flows, caps) == _filled(flows, caps)
