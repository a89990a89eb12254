"""Tests of DualPipe-V, Seq1F1B, fused groups, sequence chunks and deadlock reports.

Four kinds (DESIGN.md, style 6): validity over parameter grids, closed-form
oracles (exact list-schedule runs and the real engine through ``simulate``),
orderings and memory between schedules as the papers report them, and golden
op grids (``UPDATE_GOLDEN=1 pytest ...`` rewrites them).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from conftest import assert_golden_grid, check_structure, synthetic_experiment
from hypothesis import given, settings
from hypothesis import strategies as st

from base.errors import ConfigError, ScheduleError
from sim import simulate
from sim.cli import main
from sim.experiment import build_experiment
from workloads.costs import SyntheticCosts
from workloads.schedules import (
    WHOLE,
    Op,
    Schedule,
    from_text,
    list_schedule,
    one_f_one_b,
    op_deps,
    schedule_deps,
    validate,
)
from workloads.schedules_advanced import (
    dualpipe_v,
    interleaved,
    makespan,
    peak_activation,
    repeat_steps,
    seq1f1b,
    steady_state_period,
    uniform_duration,
    v_stage_rank,
    zb_h2,
    zb_v,
)

GOLDEN_DIR = Path(__file__).parent / "golden" / "schedules"
TOL = 1e-9
MS = 1e-3
GiB = 2**30


# ----------------------------------------------------------------------------- op text form


def test_op_text_form_is_backward_compatible() -> None:
    assert Op.parse("1F3") == Op(1, "F", 3) == Op(1, "F", 3, WHOLE)
    assert str(Op(1, "F", 3)) == "1F3"
    assert Op.parse("1F3.2") == Op(1, "F", 3, 2)
    assert str(Op(12, "W", 30, 0)) == "12W30.0"
    for text in ("1F3", "1F3.2", "0B0.0", "7W11.13"):
        assert str(Op.parse(text)) == text
    assert Op(1, "F", 3, 2).renumbered(9) == Op(1, "F", 9, 2)
    for bad in ("1F3.", "1F3.x", "1F.2", "1X3.1", "1F3.2.1"):
        with pytest.raises(ScheduleError, match="sequence chunk"):
            Op.parse(bad)


def test_sequence_chunk_dependencies() -> None:
    """Forward chunk c after c-1 on the same stage; backward chunks in reverse (Sun et al.)."""
    k, S = 4, 3
    assert op_deps(Op(1, "F", 0, 2), S, False, k) == (Op(0, "F", 0, 2), Op(1, "F", 0, 1))
    assert op_deps(Op(0, "F", 5, 0), S, False, k) == ()
    assert op_deps(Op(1, "B", 0, 1), S, False, k) == (
        Op(1, "F", 0, 1), Op(2, "B", 0, 1), Op(1, "B", 0, 2))
    assert op_deps(Op(2, "B", 0, 3), S, False, k) == (Op(2, "F", 0, 3),)
    assert op_deps(Op(1, "W", 0, 1), S, True, k) == (Op(1, "B", 0, 1),)
    # whole micro-batches: the DESIGN.md rule, unchanged
    assert op_deps(Op(1, "B", 4), S, False) == (Op(1, "F", 4), Op(2, "B", 4))


def test_from_text_reads_fused_groups_and_chunks() -> None:
    s = from_text("rank 0: 0F0 1F0 0F1&1B0&1W0 1F1&0B0&0W0 1B1&1W1 0B1 0W1")
    assert s.fused == frozenset({Op(0, "F", 1), Op(1, "B", 0), Op(1, "F", 1), Op(0, "B", 0),
                                 Op(1, "B", 1)})
    assert s.groups[Op(1, "B", 0)] == (Op(0, "F", 1), Op(1, "B", 0), Op(1, "W", 0))
    assert s.groups[Op(0, "B", 1)] == (Op(0, "B", 1),)
    assert s.grid() == "rank 0: 0F0 1F0 0F1&1B0&1W0 1F1&0B0&0W0 1B1&1W1 0B1 0W1"
    chunked = from_text("0F0.0 0F0.1 0B0.1 0B0.0")
    assert chunked.seq_chunks == 2 and not chunked.fused
    assert from_text(chunked.grid()) == chunked


FUSED_P3 = "rank 0: 0F0 0F1 0B0 0B1\nrank 1: 1F0 {group} 1B1\nrank 2: 2F0 2B0 2F1 2B1"


def test_fused_group_starts_when_all_inputs_are_ready() -> None:
    """DualPipe's pair waits for both inputs: 1F1 (input at 2) waits for 1B0's (at 6)."""
    def duration(op: Op) -> float:
        return 1.0 if op.kind == "F" else 3.0

    fused = from_text(FUSED_P3.format(group="1F1&1B0"))
    assert set(schedule_deps(fused, Op(1, "F", 1))) == {Op(0, "F", 1), Op(1, "F", 0),
                                                        Op(2, "B", 0)}
    assert schedule_deps(fused, Op(1, "B", 0)) == (Op(1, "F", 0), Op(2, "B", 0))
    times = list_schedule(fused, duration)
    assert times[Op(1, "F", 1)] == (6.0, 7.0) and times[Op(1, "B", 0)] == (7.0, 10.0)
    assert times[Op(2, "F", 1)] == (10.0, 11.0)  # 1F1's output is released at the group end
    alone = list_schedule(from_text(FUSED_P3.format(group="1F1 1B0")), duration)
    assert alone[Op(1, "F", 1)] == (2.0, 3.0) and alone[Op(2, "F", 1)] == (6.0, 7.0)


def test_fused_group_that_can_never_start_deadlocks() -> None:
    text = "rank 0: 0F0 0B0 0F1 0B1\nrank 1: 1F0 1B0&1F1 1B1"
    with pytest.raises(ScheduleError, match=r"\*1B0&1F1\(waits 0F1@rank0\)") as info:
        from_text(text)
    assert "*0B0(waits 1B0@rank1)" in str(info.value)


def test_fused_group_outputs_count_at_the_group_end() -> None:
    s = from_text("rank 0: 0F0 0B0\nrank 1: 1F0&1B0")
    durations = {Op(0, "F", 0): 1.0, Op(1, "F", 0): 2.0, Op(1, "B", 0): 3.0, Op(0, "B", 0): 1.0}
    times = list_schedule(s, durations.__getitem__)
    assert times[Op(1, "F", 0)] == (1.0, 3.0) and times[Op(1, "B", 0)] == (3.0, 6.0)
    assert times[Op(0, "B", 0)] == (6.0, 7.0)


def test_validate_rejects_bad_fused_groups_and_chunks() -> None:
    base = dualpipe_v(2, 4)
    with pytest.raises(ScheduleError, match=r"last op of rank 0"):
        validate(Schedule("x", 1, (0,), ((Op(0, "F", 0), Op(0, "B", 0)),),
                          fused=frozenset({Op(0, "B", 0)})))
    with pytest.raises(ScheduleError, match=r"not in the schedule"):
        validate(Schedule("x", 1, (0,), ((Op(0, "F", 0), Op(0, "B", 0)),),
                          fused=frozenset({Op(0, "F", 7)})))
    with pytest.raises(ScheduleError, match=r"fused group 0F0&0W0&0B0 op 0W0 waits on 0B0"):
        from_text("0F0&0W0&0B0")
    with pytest.raises(ScheduleError, match=r"missing 0F0.2"):
        validate(Schedule("x", 1, (0,), ((Op(0, "F", 0, 0), Op(0, "F", 0, 1), Op(0, "B", 0, 1),
                                          Op(0, "B", 0, 0)),), seq_chunks=3))
    with pytest.raises(ScheduleError, match=r"sequence chunks k=0"):
        validate(Schedule("x", 1, (0,), ((Op(0, "F", 0), Op(0, "B", 0)),), seq_chunks=0))
    validate(base)


# ----------------------------------------------------------------------------- validity


@pytest.mark.parametrize("p", range(1, 9))
def test_new_builders_valid_on_grid(p: int) -> None:
    for m in range(1, 17):
        s = dualpipe_v(p, m)
        check_structure(s)
        assert s.num_ranks == p and s.num_microbatches == m and s.split_backward
        assert s.stage_rank == v_stage_rank(p) and s.chunks_per_rank == 2
        for k in (1, 2, 3, 4):
            q = seq1f1b(p, m, 1, k)
            check_structure(q)
            assert q.seq_chunks == k and all(len(ops) == 2 * m * k for ops in q.rank_ops)


@pytest.mark.parametrize("p", range(1, 4))
def test_validate_accepts_new_builders_on_subgrid(p: int) -> None:
    for m in range(1, 13):
        validate(dualpipe_v(p, m))
        for k in (2, 3, 5):
            validate(seq1f1b(p, m, 1, k))


@pytest.mark.parametrize("p,m", [(8, 16), (8, 3), (6, 13), (5, 10)])
def test_validate_accepts_larger_cases(p: int, m: int) -> None:
    validate(dualpipe_v(p, m))
    validate(seq1f1b(p, m, 1, 4))


@given(p=st.integers(1, 6), m=st.integers(1, 12), k=st.integers(1, 5))
@settings(max_examples=30, deadline=None)
def test_forward_before_backward_for_each_microbatch(p: int, m: int, k: int) -> None:
    """In time (list-schedule run), every chunk's F ends before its B starts, B before its W."""
    for s in (dualpipe_v(p, m), seq1f1b(p, m, 1, k), zb_v(p, m), zb_h2(p, m),
              interleaved(p, m, 2)):
        times = list_schedule(s, lambda op: 1.0)
        for op, (start, _) in times.items():
            if op.kind == "B":
                assert times[Op(op.stage, "F", op.mb, op.seq)][1] <= start, (s.name, op)
            if op.kind == "W":
                assert times[Op(op.stage, "B", op.mb, op.seq)][1] <= start, (s.name, op)


def test_dualpipe_v_overlaps_forward_and_backward_of_different_microbatches() -> None:
    s = dualpipe_v(4, 10)
    pairs = [g for g in set(s.groups.values()) if [op.kind for op in g][:2] == ["F", "B"]]
    assert pairs and all(g[0].mb != g[1].mb and g[0].stage != g[1].stage for g in pairs)
    # full backwards are B&W groups; every deferred W is a single op
    for g in set(s.groups.values()):
        kinds = "".join(op.kind for op in g)
        assert kinds in ("F", "B", "W", "BW", "FBW"), kinds
    # each rank holds stages r and 2p - 1 - r and runs 2m of each kind
    for r, ops in enumerate(s.rank_ops):
        assert {op.stage for op in ops} == {r, 7 - r}
        assert Counter(op.kind for op in ops) == {"F": 20, "B": 20, "W": 20}


def test_seq1f1b_order_follows_the_reference_warmup() -> None:
    """Rank r warms up with p - r - 1 + k - 1 chunk forwards (thunlp/Seq1F1B)."""
    p, m, k = 4, 3, 3
    s = seq1f1b(p, m, 1, k)
    for r, ops in enumerate(s.rank_ops):
        first_b = next(i for i, op in enumerate(ops) if op.kind == "B")
        assert first_b == p - r - 1 + k - 1 + 1
        assert ops[first_b] == Op(r, "B", 0, k - 1)  # the last chunk's backward first
        forwards = [(op.mb, op.seq) for op in ops if op.kind == "F"]
        backwards = [(op.mb, op.seq) for op in ops if op.kind == "B"]
        assert forwards == [(mb, c) for mb in range(m) for c in range(k)]
        assert backwards == [(mb, c) for mb in range(m) for c in reversed(range(k))]
    assert seq1f1b(4, 8, 1, 1).rank_ops == one_f_one_b(4, 8).rank_ops


@pytest.mark.parametrize("call,match", [
    (lambda: dualpipe_v(4, 8, 1), r"dualpipe-v: chunks per rank v=1 .* uses v=2"),
    (lambda: dualpipe_v(0, 8), r"p=0"),
    (lambda: seq1f1b(4, 8, 2), r"seq1f1b: chunks per rank v=2"),
    (lambda: seq1f1b(4, 8, 1, 0), r"sequence chunks k=0"),
    (lambda: seq1f1b(4, 8, 1, True), r"sequence chunks k=True"),
])
def test_invalid_arguments(call, match: str) -> None:
    with pytest.raises(ScheduleError, match=match):
        call()


# ----------------------------------------------------------------------------- closed forms


def dualpipe_formula(p: int, m: int, f: float, b: float, w: float) -> float:
    """2m(F + B) + (p - 1)(F&B + B - 3W), F&B = F + B, per-chunk costs (DualPipe README)."""
    return 2 * m * (f + b) + (p - 1) * ((f + b) + b - 3 * w)


@pytest.mark.parametrize("f,w", [(1.0, 1.0), (1.0, 0.5), (2.0, 0.5), (1.5, 0.0), (0.5, 0.5)])
@pytest.mark.parametrize("p", [1, 2, 3, 4, 6])
def test_dualpipe_v_closed_form(f: float, w: float, p: int) -> None:
    """Exact for F = B_input and W <= F (chunk costs F, B_input + W, W), m >= 2p."""
    for m in (2 * p, 2 * p + 1, 3 * p + 2):
        s = dualpipe_v(p, m)
        # uniform_duration takes whole-rank costs: each of the 2 chunks costs half
        got = makespan(s, uniform_duration(s, 2 * f, 2 * (f + w), 2 * w))
        assert got == pytest.approx(dualpipe_formula(p, m, f, f + w, w), abs=TOL)


@pytest.mark.parametrize("fwd,bwd", [(1.0, 2.0), (1.0, 1.0), (0.7, 2.1)])
@pytest.mark.parametrize("p", [1, 2, 4, 8])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
def test_seq1f1b_closed_form(fwd: float, bwd: float, p: int, k: int) -> None:
    """m(F + B) + (p - 1)(F + B)/k: the start-up and drain of 1F1B shrink with the chunks."""
    for m in (1, p, 2 * p + 1):
        s = seq1f1b(p, m, 1, k)
        got = makespan(s, uniform_duration(s, fwd, bwd))
        assert got == pytest.approx(m * (fwd + bwd) + (p - 1) * (fwd + bwd) / k, abs=TOL)


def test_dualpipe_v_through_the_engine_matches_the_oracle_op_by_op() -> None:
    """The engine runs fused groups with the list schedule's semantics, span by span."""
    p, m = 4, 9
    exp = build_experiment(synthetic_experiment(p, m, "dualpipe-v", forward_ms=1.0,
                                                backward_ms=1.5, weight_grad_ms=0.5, vpp=2))
    result = simulate(exp)
    oracle = list_schedule(exp.schedule, uniform_duration(exp.schedule, MS, 1.5 * MS, 0.5 * MS))
    spans = {s.name: s for s in result.timeline.spans if s.stream == "compute"}
    for op, (start, end) in oracle.items():
        assert spans[str(op)].start_s == pytest.approx(start, abs=1e-12), op
        assert spans[str(op)].end_s == pytest.approx(end, abs=1e-12), op
    step = dualpipe_formula(p, m, 0.5, 0.75, 0.25) * MS  # per chunk: F = B_input, W <= F
    assert result.stats["step_time_s"] == pytest.approx(step, rel=1e-9)


def test_fused_group_sends_its_outputs_at_its_end() -> None:
    exp = build_experiment(synthetic_experiment(4, 8, "dualpipe-v", weight_grad_ms=1.0, vpp=2))
    result = simulate(exp)
    compute = {s.name: s for s in result.timeline.spans if s.stream == "compute"}
    sends = {s.name.split()[0]: s for s in result.timeline.spans if s.stream.startswith("send>")}
    group_end = {}
    for group in set(exp.schedule.groups.values()):
        for op in group:
            group_end[str(op)] = compute[str(group[-1])].end_s
    fused_sends = [name for name in sends if name in group_end and
                   compute[name].end_s < group_end[name]]
    assert fused_sends, "some fused forward sends its activation"
    for name, span in sends.items():
        assert span.start_s == pytest.approx(group_end[name], abs=1e-12), name


def test_seq1f1b_through_the_engine_matches_the_oracle() -> None:
    exp = build_experiment(synthetic_experiment(4, 6, "seq1f1b", forward_ms=1.0, backward_ms=2.0))
    result = simulate(exp)
    oracle = list_schedule(exp.schedule, uniform_duration(exp.schedule, MS, 2 * MS))
    spans = {s.name: s for s in result.timeline.spans if s.stream == "compute"}
    assert len(spans) == len(oracle) == 4 * 6 * 4 * 2
    for op, (start, end) in oracle.items():
        assert (spans[str(op)].start_s, spans[str(op)].end_s) == pytest.approx((start, end))


# ----------------------------------------------------------------------------- Seq1F1B costs


def test_equal_flops_chunk_boundaries() -> None:
    """Chunks of equal FLOPs under causal attention: later chunks are shorter (Sun et al.)."""
    for a in (0.0, 0.1, 0.25, 0.6, 1.0):
        for k in (1, 2, 4, 7):
            costs = SyntheticCosts(1.0, 2.0, seq_chunks=k, attention_share=a)
            x = costs.seq_bounds()
            assert len(x) == k + 1 and x[0] == 0.0 and x[-1] == 1.0
            flops = [(1 - a) * x[c + 1] + a * x[c + 1] ** 2 - (1 - a) * x[c] - a * x[c] ** 2
                     for c in range(k)]
            assert flops == pytest.approx([1 / k] * k, abs=1e-12)
            lengths = [x[c + 1] - x[c] for c in range(k)]
            if a > 0 and k > 1:
                assert all(u > v for u, v in zip(lengths, lengths[1:], strict=False))
            shares = [costs.seq_chunk_share(Op(0, "F", 0, c)) for c in range(k)]
            assert shares == pytest.approx(lengths) and sum(shares) == pytest.approx(1.0)
    assert SyntheticCosts(1.0, 2.0, seq_chunks=4, attention_share=0.0).seq_bounds() == (
        0.0, 0.25, 0.5, 0.75, 1.0)


def test_synthetic_chunk_costs() -> None:
    costs = SyntheticCosts(4e-3, 8e-3, 2e-3, activation_bytes=100.0, p2p_message_bytes=40.0,
                           chunks_per_rank=2, seq_chunks=4)
    (seg,) = costs.op_segments(Op(0, "F", 0, 3), False)
    assert seg.duration_s == pytest.approx(4e-3 / 8) and seg.label == "0F0.3"
    (seg,) = costs.op_segments(Op(0, "B", 0, 1), True)
    assert seg.duration_s == pytest.approx(6e-3 / 8)
    assert costs.p2p_bytes() == pytest.approx(10.0)
    assert costs.seq_chunk_share(Op(0, "F", 0)) == 1.0
    # whole micro-batch ops are unchanged
    plain = SyntheticCosts(4e-3, 8e-3)
    assert plain.op_segments(Op(0, "F", 0), False)[0].duration_s == pytest.approx(4e-3)


def test_seq_chunks_config_key() -> None:
    exp = build_experiment({**synthetic_experiment(2, 4, "seq1f1b"),
                            "training": {"global_batch_size": 4, "seq_chunks": 3}})
    assert exp.schedule.seq_chunks == 3 and exp.costs.seq_chunks == 3
    assert build_experiment(synthetic_experiment(2, 4, "seq1f1b")).schedule.seq_chunks == 4
    with pytest.raises(ConfigError, match="training.seq_chunks"):
        build_experiment({**synthetic_experiment(2, 4, "seq1f1b"),
                          "training": {"global_batch_size": 4, "seq_chunks": 0}})


# ----------------------------------------------------------------------------- orderings, memory


def run(p: int, m: int, schedule: str, vpp: int = 1) -> dict:
    """The engine's stats on the ideal cluster, F = 1, B = 2 (B_input = W = 1), 1 GiB per mb."""
    data = synthetic_experiment(p, m, schedule, forward_ms=1.0, backward_ms=2.0,
                                weight_grad_ms=1.0, activation_MB=GiB / 1e6, vpp=vpp)
    exp = build_experiment(data)
    stats = simulate(exp, steps=1).stats  # the isolated step; the period is checked below
    d = uniform_duration(exp.schedule, MS, 2 * MS, MS)
    stats["steady_period_s"] = steady_state_period(exp.schedule, d)
    return stats


@pytest.fixture(scope="module")
def p4m8() -> dict[str, dict]:
    names = {"1f1b": 1, "zb-h1": 1, "zb-h2": 1, "zb-v": 2, "dualpipe-v": 2, "seq1f1b": 1,
             "interleaved": 2}
    return {name: run(4, 8, name, vpp) for name, vpp in names.items()}


def test_bubble_ordering_through_the_engine(p4m8: dict[str, dict]) -> None:
    """ZB-V and ZB-H2 well below ZB-H1, below 1F1B (Qi et al. 2024, fig. and table 4).

    One isolated step under the step barrier: ZB-V < ZB-H1 < 1F1B, but ZB-H2 =
    ZB-H1 = m(F + B) + (p - 1)F, the bound for one chunk per rank
    (REFERENCES.md). ZB-H2's zero bubble needs post-validation, i.e. overlapping
    steps: compare the steady-state periods there, where ZB-H2 and ZB-V reach
    m(F + B) (bubble 0) and ZB-H1 and 1F1B keep theirs.
    """
    bubble = {k: v["bubble_fraction"] for k, v in p4m8.items()}
    assert bubble["zb-v"] < 0.6 * bubble["zb-h1"] < bubble["zb-h1"] < bubble["1f1b"]
    assert bubble["zb-h2"] == pytest.approx(bubble["zb-h1"])
    assert bubble["1f1b"] == pytest.approx(3 / 11)
    period = {k: v["steady_period_s"] for k, v in p4m8.items()}
    ideal = 8 * 3 * MS
    assert period["zb-h2"] == pytest.approx(ideal) and period["zb-v"] == pytest.approx(ideal)
    steady_bubble = {k: 1 - ideal / period[k] for k in period}
    assert max(steady_bubble["zb-h2"], steady_bubble["zb-v"]) < 1e-9
    assert steady_bubble["zb-h1"] > 0.1 and steady_bubble["1f1b"] > steady_bubble["zb-h1"]


def test_memory_relative_to_1f1b_through_the_engine(p4m8: dict[str, dict]) -> None:
    """ZB-H2 about 2x 1F1B's peak ((2p - 1) micro-batches), ZB-V 1x, DualPipe-V (2p + 1)/2."""
    peak = {k: v["peak_memory_gib"] for k, v in p4m8.items()}
    assert peak["1f1b"] == pytest.approx(4.0)
    assert peak["zb-h2"] == pytest.approx(7.0) and 1.5 <= peak["zb-h2"] / peak["1f1b"] <= 2
    assert peak["zb-v"] == pytest.approx(peak["1f1b"])
    assert peak["dualpipe-v"] == pytest.approx(4.5)  # the README's PP + 1 chunks
    assert p4m8["zb-v"]["peak_memory_per_stage_gib"] == pytest.approx([4.0] * 4)


def test_seq1f1b_bubble_and_memory(p4m8: dict[str, dict]) -> None:
    """Bubble about 1/k of 1F1B's (exactly, as idle/busy); peak activation lower (Sun et al.)."""
    base, seq = p4m8["1f1b"], p4m8["seq1f1b"]
    assert seq["bubble_ratio"] == pytest.approx(base["bubble_ratio"] / 4)
    assert seq["bubble_fraction"] < 0.35 * base["bubble_fraction"]
    assert seq["peak_memory_gib"] < 0.5 * base["peak_memory_gib"]
    # token-weighted: rank 0 holds mb 0 and mb 1's chunks 0..2 after warm-up, then swaps
    # a short late chunk for a long early one: 2 - share(3) - share(2) + share(0)
    x = SyntheticCosts(1.0, 2.0, seq_chunks=4).seq_bounds()
    share = [x[c + 1] - x[c] for c in range(4)]
    assert seq["peak_memory_per_stage_gib"][0] == pytest.approx(2 - share[3] - share[2] + share[0])
    assert seq["peak_memory_per_stage_gib"] == sorted(seq["peak_memory_per_stage_gib"],
                                                      reverse=True)


@pytest.mark.parametrize("p", range(2, 7))
def test_peak_activation_counts(p: int) -> None:
    m = 3 * p
    assert peak_activation(dualpipe_v(p, m)) == tuple([pytest.approx((2 * p + 1) / 2)] * p)
    for k in (2, 4):
        peaks = peak_activation(seq1f1b(p, m, 1, k))
        assert peaks == tuple(pytest.approx((p - r + k - 1) / k) for r in range(p))
        assert max(peaks) < p


def test_repeat_steps_keeps_fused_groups_and_chunks() -> None:
    s = dualpipe_v(2, 4)
    r = repeat_steps(s, 3)
    check_structure(r)
    assert r.fused == {op.renumbered(op.mb + 4 * i) for i in range(3) for op in s.fused}
    q = repeat_steps(seq1f1b(2, 3, 1, 2), 2)
    check_structure(q)
    assert q.seq_chunks == 2 and q.num_microbatches == 6
    d = uniform_duration(s, 1.0, 2.0, 1.0)
    # rank 0 is busy until the end of a DualPipe-V step and starts the next one: back-to-back
    # steps cannot overlap, the period is one step
    assert steady_state_period(s, d) == pytest.approx(makespan(s, d))


# ----------------------------------------------------------------------------- deadlocks


def test_deadlock_message_marks_the_ops_that_wait_forever() -> None:
    s = Schedule("bad", 2, (0, 1), (
        (Op(0, "F", 0), Op(0, "F", 1), Op(0, "B", 1), Op(0, "B", 0)),
        (Op(1, "B", 1), Op(1, "F", 0), Op(1, "F", 1), Op(1, "B", 0)),
    ))
    with pytest.raises(ScheduleError) as info:
        validate(s)
    lines = str(info.value).splitlines()
    assert lines[0] == "schedule bad deadlocks; ops marked * wait forever:"
    assert lines[1] == "  rank 0: 0F0 0F1 *0B1(waits 1B1@rank1) 0B0"
    assert lines[2] == "  rank 1: *1B1(waits 1F1 later on rank 1) 1F0 1F1 1B0"


def test_deadlock_message_elides_long_rows_and_names_finished_ranks() -> None:
    m = 20
    ops0 = [Op(0, "F", i) for i in range(m)] + [Op(0, "B", i) for i in range(m)]
    ops1 = [Op(1, "B", 0)] + [Op(1, "F", i) for i in range(m)] + [
        Op(1, "B", i) for i in range(1, m)]
    ops2 = [Op(2, "F", i) for i in range(m)] + [Op(2, "B", i) for i in range(m)]
    with pytest.raises(ScheduleError) as info:
        validate(Schedule("long", m, (0, 1, 2), (tuple(ops0), tuple(ops1), tuple(ops2))))
    lines = str(info.value).splitlines()
    assert lines[1] == ("  rank 0: ...(14 done) 0F14 0F15 0F16 0F17 0F18 0F19 "
                        "*0B0(waits 1B0@rank1) 0B1 0B2 0B3 0B4 0B5 0B6 ...(+13 more)")
    assert lines[2] == ("  rank 1: *1B0(waits 1F0 later on rank 1,2B0@rank2) "
                        "1F0 1F1 1F2 1F3 1F4 1F5 ...(+33 more)")
    assert lines[3].startswith("  rank 2: *2F0(waits 1F0@rank1)")


DEADLOCK_FILE = """\
# rank 1 runs the backward of micro-batch 1 before its forward: it waits forever
rank 0: 0F0 0F1 0B1 0B0
rank 1: 1B1 1F0 1F1 1B0
"""


def test_sim_run_with_a_deadlocking_schedule_file_exits_2_with_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import yaml

    (tmp_path / "dead.txt").write_text(DEADLOCK_FILE)
    data = synthetic_experiment(2, 2, "dead.txt")
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    assert main(["run", str(tmp_path / "exp.yaml")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: schedule='dead.txt': ")
    assert "deadlocks; ops marked * wait forever: | rank 0: 0F0 0F1 *0B1(waits 1B1@rank1) 0B0" \
        in lines[0]
    assert "| rank 1: *1B1(waits 1F1 later on rank 1) 1F0 1F1 1B0" in lines[0]


# ----------------------------------------------------------------------------- golden grids

GOLDEN_CASES = {
    "dualpipe-v_p2_m4": lambda: dualpipe_v(2, 4),
    "dualpipe-v_p4_m8": lambda: dualpipe_v(4, 8),
    "seq1f1b_p2_m2_k3": lambda: seq1f1b(2, 2, 1, 3),
    "seq1f1b_p4_m4_k2": lambda: seq1f1b(4, 4, 1, 2),
}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_golden_grid(case: str) -> None:
    assert_golden_grid(GOLDEN_CASES[case](), GOLDEN_DIR / f"{case}.txt", seq_chunks=True)
