"""Idle-time breakdown: shares add up, a slow stage is blamed for exactly what it costs."""

from __future__ import annotations

import pytest
from conftest import EXAMPLE, synthetic_experiment
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import collapsible_experiments

from sim.api import load_experiment, simulate
from sim.cli.figures import idle_figure, write_figures
from sim.experiment import build_experiment
from sim.timeline import IDLE_CAUSES
from workloads.schedules import Op, list_schedule

MS = 1e-3


def _straggler(p: int, m: int, gpu: int | None, slowdown: float = 1.2,
               schedule: str = "1f1b") -> dict:
    data = synthetic_experiment(p, m, schedule, forward_ms=1.0, backward_ms=2.0)
    if gpu is not None:
        data["faults"] = {"stragglers": [{"gpu": gpu, "slowdown": slowdown}]}
    return simulate(build_experiment(data)).stats


def _assert_adds_up(stats: dict) -> None:
    """Every GPU's shares sum to its idle time, which is step - compute busy time."""
    per_gpu = stats["idle_breakdown"]["per_gpu_s"]
    step = stats["step_time_s"]
    for row in per_gpu.values():
        assert set(row) == {*IDLE_CAUSES, "idle_s"}
        assert all(v >= 0 for v in row.values())
        assert sum(row[c] for c in IDLE_CAUSES) == pytest.approx(row["idle_s"], rel=1e-12,
                                                                 abs=1e-15)
    mean_idle = sum(r["idle_s"] for r in per_gpu.values()) / len(per_gpu)
    assert mean_idle == pytest.approx(stats["bubble_fraction"] * step, rel=1e-9, abs=1e-15)
    assert stats["idle_breakdown"]["mean_s"]["idle_s"] == pytest.approx(mean_idle, rel=1e-12)


@pytest.mark.parametrize(("p", "m"), [(4, 8), (2, 5), (6, 12)])
@pytest.mark.parametrize("slowdown", [1.2, 1.5])
def test_slow_last_stage_of_1f1b(p: int, m: int, slowdown: float) -> None:
    """One GPU 20% (50%) slower on the last stage of 1F1B becomes the bottleneck.

    Closed form: stage i costs t_i = F_i + B_i per micro-batch; micro-batch 0 crosses
    every stage (Σ t_i) and the slow stage then runs its other m - 1 micro-batches
    back to back: step = Σ t_i + (m - 1) max t_i (REFERENCES.md: exact when the slow
    stage is the last one). Every other GPU does the same work in a step longer by
    m (s - 1) t, so it idles m (s - 1) t longer than without the straggler, and that
    is exactly its ``straggler`` share; its ``bubble`` share stays the straggler-free
    bubble (p - 1) t, and the slow GPU itself idles only that bubble.
    """
    t = 3 * MS
    slow = slowdown * t
    stats = _straggler(p, m, p - 1, slowdown)
    assert stats["step_time_s"] == pytest.approx((p - 1) * t + slow + (m - 1) * slow, rel=1e-12)
    base = _straggler(p, m, None)
    _assert_adds_up(stats)
    for g, row in stats["idle_breakdown"]["per_gpu_s"].items():
        extra = row["idle_s"] - base["idle_breakdown"]["per_gpu_s"][g]["idle_s"]
        assert row["bubble"] == pytest.approx((p - 1) * t, rel=1e-9)
        assert row["straggler"] == pytest.approx(extra, rel=1e-9, abs=1e-15)
        if int(g) != p - 1:
            assert row["straggler"] == pytest.approx(m * (slow - t), rel=1e-9)
        else:
            assert row["straggler"] == pytest.approx(0.0, abs=1e-15)
    assert stats["stragglers"] == {str(p - 1): slowdown}


@pytest.mark.parametrize("gpu", [0, 1, 2])
def test_slow_earlier_stage_matches_the_list_schedule_oracle(gpu: int) -> None:
    """Earlier stages: 1F1B's order hides part of the slowdown; the symbolic list schedule
    with the slow stage's op durations is the exact oracle (REFERENCES.md)."""
    p, m = 4, 8
    stats = _straggler(p, m, gpu)
    exp = build_experiment(synthetic_experiment(p, m, forward_ms=1.0, backward_ms=2.0))

    def duration(op: Op) -> float:
        base = (1.0 if op.kind == "F" else 2.0) * MS
        return base * (1.2 if op.stage == gpu else 1.0)

    oracle = max(end for _, end in list_schedule(exp.schedule, duration).values())
    assert stats["step_time_s"] == pytest.approx(oracle, rel=1e-12)
    assert stats["step_time_s"] < (p - 1) * 3 * MS + m * 3.6 * MS  # part of it is hidden
    _assert_adds_up(stats)
    shares = stats["idle_breakdown"]["mean_s"]
    assert shares["straggler"] > 0 and shares["pp"] == shares["dp"] == 0


def test_communication_shares_and_collapsed_agree() -> None:
    """A transformer with TP, PP and DP traffic: comm kinds get shares, and the collapsed
    simulation's mean breakdown matches the full one's closely."""
    exp = load_experiment(EXAMPLE)
    full = simulate(exp, fidelity="full").stats
    collapsed = simulate(exp, fidelity="collapsed").stats
    for stats in (full, collapsed):
        _assert_adds_up(stats)
        mean = stats["idle_breakdown"]["mean_s"]
        assert mean["bubble"] > 0 and mean["straggler"] == 0 and mean["failure"] == 0
    for cause in ("bubble", "tp", "dp"):
        assert collapsed["idle_breakdown"]["mean_s"][cause] == pytest.approx(
            full["idle_breakdown"]["mean_s"][cause], rel=0.05, abs=1e-4)
    assert full["idle_breakdown"]["mean_s"]["tp"] > 0


def test_pipeline_messages_on_slow_links_show_as_pp() -> None:
    data = synthetic_experiment(2, 4, forward_ms=1.0, backward_ms=2.0)
    data["model"]["synthetic"]["p2p_MB"] = 10.0
    data["cluster"] = {"topology": "ring", "num_gpus": 2, "link_bandwidth_GBps": 10.0}
    stats = simulate(build_experiment(data)).stats
    _assert_adds_up(stats)
    # each message takes 1 ms; stage 1 waits for the first activation: 1 ms F + 1 ms send
    row1 = stats["idle_breakdown"]["per_gpu_s"]["1"]
    assert row1["pp"] >= 1 * MS and stats["idle_breakdown"]["mean_s"]["pp"] > 0


def test_dp_straggler_makes_its_replica_wait() -> None:
    """A slow GPU in one DP replica: the other replica's GPUs wait at the gradient
    all-reduce, and that wait is blamed on the straggler and DP communication."""
    data = synthetic_experiment(2, 4, forward_ms=1.0, backward_ms=2.0)
    data["model"]["synthetic"]["grad_MB"] = 100.0
    data["cluster"] = {"topology": "ring", "num_gpus": 4, "link_bandwidth_GBps": 10.0}
    clean = simulate(build_experiment(data)).stats
    data["faults"] = {"stragglers": [{"gpu": 1, "slowdown": 1.5}]}
    slow = simulate(build_experiment(data)).stats
    _assert_adds_up(slow)
    assert slow["step_time_s"] > clean["step_time_s"]
    assert clean["idle_breakdown"]["mean_s"]["straggler"] == 0
    assert slow["idle_breakdown"]["per_gpu_s"]["0"]["straggler"] > 0  # GPU 0: other replica


def test_idle_plot_is_written_and_deterministic(tmp_path) -> None:
    data = synthetic_experiment(4, 8, forward_ms=1.0, backward_ms=2.0)
    data["faults"] = {"stragglers": [{"gpu": 3, "slowdown": 1.2}]}
    result = simulate(build_experiment(data))
    paths = write_figures(result, tmp_path / "a")
    assert paths["idle"].name == "idle.png" and paths["idle"].stat().st_size > 0
    write_figures(result, tmp_path / "b")
    assert (tmp_path / "a" / "idle.png").read_bytes() == (tmp_path / "b" / "idle.png").read_bytes()
    no_idle = simulate(build_experiment(synthetic_experiment(1, 2)))
    idle_figure(no_idle, tmp_path / "none.svg")  # nothing to stack: still a figure
    assert (tmp_path / "none.svg").stat().st_size > 0


@pytest.mark.parametrize(("fidelity", "straggler"),
                         [("full", False), ("full", True), ("collapsed", False)])
def test_gaps_on_arrays_equal_the_gap_loop(fidelity: str, straggler: bool) -> None:
    """The general path's gaps split on arrays (batches of GPUs) give the floats of the
    reference's loop over each GPU's gaps: with stragglers, with a collapsed program's
    blocking communication (no latest predecessors handed over), with and without a
    window, and in batches of one GPU."""
    import sim.idle as idle_module
    from sim.engine import InstructionTimes, simulate_program
    from sim.idle import idle_breakdown

    exp = load_experiment(EXAMPLE)
    if straggler:
        data = exp.config.model_dump(mode="json", exclude_unset=True)
        data["faults"] = {"stragglers": [{"gpu": 3, "slowdown": 1.3}]}
        exp = build_experiment(data)
    result = simulate(exp, fidelity=fidelity)
    times = InstructionTimes()
    slowdown = {3: 1.3} if straggler else None

    def timer(ins: object) -> float:
        base = ins.duration_s if ins.duration_s is not None else 1e-4 + ins.flops * 1e-15
        return base * (slowdown or {}).get(ins.gpu, 1.0)

    simulate_program(result.program, exp.cluster, timer, times=times)
    gpus = result.timeline.simulated_gpus
    end = max(times.end_s)
    for window in (None, (end / 4, end / 2)):
        loop = idle_breakdown(result.program, times.ready_s, times.end_s, gpus, slowdown,
                              window, reference=True)
        arrays = idle_breakdown(result.program, times.ready_s, times.end_s, gpus, slowdown,
                                window)
        assert repr(arrays) == repr(loop)
        assert sum(loop[gpus[0]].values()) > 0
    batch = idle_module._GAPS_AT_ONCE
    try:
        idle_module._GAPS_AT_ONCE = 1
        assert repr(idle_breakdown(result.program, times.ready_s, times.end_s, gpus,
                                   slowdown)) == repr(idle_breakdown(
            result.program, times.ready_s, times.end_s, gpus, slowdown, reference=True))
    finally:
        idle_module._GAPS_AT_ONCE = batch


@pytest.mark.parametrize("fidelity", ["full", "collapsed"])
def test_chain_rows_equal_the_cumulative_loop(fidelity: str) -> None:
    """The array path's chain sums, a level of the chain forest at a time, are the loop's
    (:func:`sim.idle._cumulative`) bit for bit in every part they keep, and every other
    part is zero there: a full run's collectives settled to their last member, a
    collapsed one's blocking communication (cut to its span) in its own part."""
    import numpy as np

    import sim.idle as idle_module
    from sim.engine import InstructionTimes, simulate_program

    exp = load_experiment(EXAMPLE)
    program = simulate(exp, fidelity=fidelity).program
    times = InstructionTimes()
    simulate_program(program, exp.cluster, lambda ins: ins.duration_s or 1e-4 + ins.flops * 1e-15,
                     times=times)
    start, cause, _, part, blocked = idle_module._chains(program, times.ready_s, times.end_s)
    assert bool(blocked) == (fidelity == "collapsed")
    rows = idle_module._chain_rows(start, cause, times.end_s, part, blocked)
    assert rows is not None
    matrix, used = rows
    loop = np.frombuffer(idle_module._cumulative(program, start, cause, times.end_s,
                                                 idle_module._Excess({})), dtype=float)
    loop = loop.reshape(-1, idle_module._WIDTH)
    assert matrix.shape == (len(program.instructions) + 1, len(used))
    assert (matrix[-1] == 0).all()
    assert matrix[:-1].tobytes() == np.ascontiguousarray(loop[:, used]).tobytes()
    others = [p for p in range(idle_module._WIDTH) if p not in used]
    assert not loop[:, others].any()
    assert matrix[:, used.index(idle_module._BUBBLE)].max() > 0


def test_levels_group_a_forest_by_depth_and_refuse_a_cycle() -> None:
    """:func:`sim.chains.levels`, the one level order both chain-sum fast paths use: every
    node after its parent, grouped by depth (roots first, each group in id order), and None
    where the parents form a cycle (the callers then keep the loop or refuse)."""
    import numpy as np

    from sim import chains

    # 0 and 3 roots (parent 6 = len); 1 <- 0, 2 <- 1, 4 <- 3, 5 <- 1
    order, bounds = chains.levels(np.array([6, 0, 1, 6, 3, 1]))
    assert order.tolist() == [0, 3, 1, 4, 2, 5]
    assert bounds == [2, 4, 6]
    assert chains.levels(np.array([1, 2, 0, 4])) is None  # 0 -> 1 -> 2 -> 0


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 1 << 30)), max_size=60))
def test_depths_by_runs_equal_the_pointer_jumping(nodes: list[tuple[bool, int]]) -> None:
    """:func:`sim.chains.depths` (the jumps on the runs of nodes each the parent of the next)
    gives the depths of :func:`sim.chains.depths_by_jumping` (the reference, every node), and
    None for the same cycles; drawn forests mostly of runs, with roots, jumps back and
    forward, and cycles."""
    import numpy as np

    from sim import chains

    n = len(nodes)
    # a run continues (parent i - 1) or the node's parent is any node or the root (n)
    up = np.array([i - 1 if chain and i else pick % (n + 1) for i, (chain, pick)
                   in enumerate(nodes)], dtype=np.intp)
    fast, reference = chains.depths(up), chains.depths_by_jumping(up)
    assert (fast is None) == (reference is None)
    if reference is not None:
        assert fast.dtype == reference.dtype and fast.tolist() == reference.tolist()
        assert chains.depths_by_jumping(up, np.ones(n, dtype=np.intp)).tolist() == \
            reference.tolist()


@settings(max_examples=30, deadline=None, derandomize=True)
@given(collapsible_experiments(),
       st.lists(st.sampled_from([0.5, 1.0, 1.7, 3.0]), min_size=2, max_size=6),
       st.booleans())
def test_kept_breakdowns_equal_cold_ones(data: dict, factors: list, windowed: bool) -> None:
    """Idle breakdowns on a kept shape, every compute time scaled by each factor in turn (a
    repeated factor finds its kept breakdown, :class:`sim.colshape.LatestRuns`), each give a
    cold breakdown's floats bit for bit (their ``repr``), and a caller's writes to one do
    not reach the next."""
    import dataclasses

    from sim import colshape, columnar
    from sim.colshape import LatestRuns
    from sim.idle import idle_breakdown
    from workloads.program import ColumnarInstructions

    result = simulate(build_experiment(data), fidelity="collapsed")
    program = result.program
    if not isinstance(program.instructions, ColumnarInstructions):
        return
    columns, gpus = program.instructions.columns, program.simulated_gpus

    def breakdown(factor: float) -> dict | None:
        def timer(op: object) -> float:
            return factor * (op.duration_s if op.duration_s is not None else 1e-3)  # type: ignore[attr-defined]

        cols = dataclasses.replace(columns)
        got = columnar.run_columns(cols, timer, program.static_bytes, gpus)
        if got is None:
            return None
        window = (0.25 * got.clock, 0.75 * got.clock) if windowed else None
        return idle_breakdown(program, got.ready_a, got.end_a, gpus, window=window,
                              cause=got.cause)

    colshape.clear()
    warm = []
    for factor in factors:
        warm.append(breakdown(factor))
        if warm[-1] is not None:
            for row in warm[-1].values():  # a caller's writes stay its own
                row["bubble"] = -1.0
    colshape.clear()
    again = [breakdown(factor) for factor in factors]  # kept on the second of each factor
    runs = colshape.shape_of(columns).derived(("idle runs", tuple(gpus)), LatestRuns)
    if all(x is not None for x in again):
        assert len(runs.runs) <= len(set(factors))  # (equal inputs at two factors: one)
    for factor, got in zip(factors, again, strict=True):
        colshape.clear()
        cold = breakdown(factor)
        assert repr(cold) == repr(got)
