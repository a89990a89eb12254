"""Pipeline sends batched on the engine's own heap (:attr:`sim.engine._Run.sends`: the flow
starts of one instant's sends in one heap entry, :meth:`sim.engine._Run._send_flows`, and the
sends whose flows end at one wake-up completed as one list, :meth:`sim.engine._Run._finished_flows`)
against one by one (``sends`` False, the reference) and SimPy's queue: the same times bit for
bit, the same events, flows, re-ratings and bytes per link, the same statistics and records."""

from __future__ import annotations

from array import array

import numpy as np
import pytest
from conftest import engine_switch, observed_full_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import experiments, link_changes
from test_rows import _gpt3
from test_streams import CLUSTER, programs

from sim import engine
from sim.engine import EngineCounters, InstructionTimes, simulate_program
from sim.experiment import build_experiment
from workloads.packed import PackedBuilder
from workloads.program import Program, ProgramBuilder
from workloads.schedules import gpipe


def _observed(run: object, sends: bool) -> object:
    """``run()`` with the sends batched or not (restored after)."""
    with engine_switch("sends", sends):
        return run()  # type: ignore[operator]


GPUS = 4
LINKS = sorted({k for g in range(GPUS) for h in range(GPUS) if g != h
                for k in CLUSTER.route(g, h).links})
"""The links the programs' flows cross (their GPUs' NVLink and NVSwitch ports)."""


@st.composite
def send_programs(draw: st.DrawFn) -> tuple[Program, tuple]:
    """Random programs (:func:`test_streams.programs`' instructions, plain or packed) with
    TP-like groups of sends as well (one per GPU of a subset, each to the GPU ``k`` on, after
    the same deps: they start at one instant), and a link change or none: a link failed
    (flows in flight rerouted, sends in their route's latency taking the new route) or
    degraded, at a time that may fall inside the sends' latency."""
    builder = draw(st.sampled_from([ProgramBuilder, PackedBuilder]))
    b = builder()
    for _ in range(draw(st.integers(1, 30))):
        n = b.next_id
        deps = tuple(sorted(set(draw(st.lists(st.integers(0, n - 1), max_size=3))))) if n else ()
        what = draw(st.sampled_from(["compute", "sends", "sends", "collective"]))
        if what == "compute":
            b.compute(draw(st.integers(0, GPUS - 1)), "F", "c", deps,
                      duration_s=draw(st.sampled_from([0.0, 1e-6, 1e-3])))
        elif what == "sends":
            k = draw(st.integers(1, GPUS - 1))
            nbytes = draw(st.sampled_from([0.0, 1e4, 1e6, 4e6]))
            for gpu in sorted(set(draw(st.lists(st.integers(0, GPUS - 1), min_size=1)))):
                b.send(gpu, (gpu + k) % GPUS, nbytes, "pp", "s", deps)
        else:
            group = tuple(range(GPUS))
            b.collective(group, {g: deps for g in group}, kind="tp", name="a",
                         op="all_reduce", nbytes=1e6)
    change: tuple = ()
    if draw(st.booleans()):
        link = draw(st.sampled_from(LINKS))
        factor = draw(st.sampled_from([0.0, 0.5]))
        at = draw(st.sampled_from([1e-6, 2e-6, 5e-6, 1e-3]))
        change = ((at, {link: CLUSTER.link_bandwidth_Bps[link] * factor}),)
    return Program(GPUS, b.build(), (0.0,) * GPUS, gpipe(1, 1)), change


def _program_run(program: Program, queue: bool, change: tuple = ()) -> object:
    times, counters = InstructionTimes(), EngineCounters()
    try:
        # (a link change, none, keeps even a program without flows on the queue)
        simulate_program(program, CLUSTER, lambda ins: ins.duration_s, counters,
                         event_queue=queue, times=times, link_changes=change or ((1e9, {}),))
    except Exception as error:  # noqa: BLE001 - all must fail alike
        return type(error).__name__
    return (array("d", times.ready_s).tobytes(), array("d", times.end_s).tobytes(),
            np.asarray(times.mid_s, dtype=float).tobytes(), counters.events,
            counters.flows, counters.rate_recomputations, counters.rerated_flows,
            counters.bytes_on_link)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.sampled_from([ProgramBuilder, PackedBuilder]).flatmap(programs))
def test_batched_sends_equal_one_by_one_and_the_queue(program: Program) -> None:
    """Random programs with sends (zero bytes, fixed durations, flows; plain and packed):
    batched, one by one, and on SimPy's queue alike."""
    fast = _observed(lambda: _program_run(program, False), True)
    assert fast == _observed(lambda: _program_run(program, False), False)
    assert fast == _program_run(program, True)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(send_programs())
def test_grouped_sends_equal_one_by_one_and_the_queue(drawn: tuple[Program, tuple]) -> None:
    """Groups of sends starting at one instant, with a link failed or degraded (possibly
    during their latency): batched, one by one, and on SimPy's queue alike."""
    program, change = drawn
    fast = _observed(lambda: _program_run(program, False, change), True)
    assert fast == _observed(lambda: _program_run(program, False, change), False)
    assert fast == _program_run(program, True, change)


@settings(max_examples=40, derandomize=True, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(experiments())
def test_batched_sends_on_random_experiments(data: dict) -> None:
    """Random experiments (every schedule, stragglers, mixed GPUs, link faults): the same
    statistics, records, times and counters with the sends batched and one by one."""
    exp = build_experiment(data)
    changes = link_changes(exp)
    fast = _observed(lambda: observed_full_run(exp, changes), True)
    assert fast[:3] == _observed(lambda: observed_full_run(exp, changes), False)[:3]


@pytest.mark.parametrize("dp", [1, 4])
def test_batched_sends_of_gpt3(dp: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """GPT-3 175B, TP 8, PP 4: a TP group's pipeline sends start in one heap entry (the path
    runs), and the run is the one with the sends one by one, byte for byte, with a degraded
    link of one replica too."""
    batches: list[int] = []
    fast_path = engine._Run._send_flows

    def counted(self: engine._Run, values: list) -> None:
        batches.append(len(values))
        fast_path(self, values)

    monkeypatch.setattr(engine._Run, "_send_flows", counted)
    exp = _gpt3(dp)
    fast = _observed(lambda: observed_full_run(exp, []), True)
    assert batches and max(batches) >= 8 * dp
    assert fast[:3] == _observed(lambda: observed_full_run(exp, []), False)[:3]
    links = [k for k, ends in enumerate(exp.cluster.links) if "gpu40" in ends]
    changes = [(0.05, {k: exp.cluster.link_bandwidth_Bps[k] * 0.25 for k in links})]
    assert _observed(lambda: observed_full_run(exp, changes), True)[:3] == _observed(
        lambda: observed_full_run(exp, changes), False)[:3]
