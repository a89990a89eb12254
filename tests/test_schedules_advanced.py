"""Tests of workloads.schedules_advanced: interleaved 1F1B, ZB-H1, ZB-H2, ZB-V.

Four kinds (DESIGN.md, style 6): validity over parameter grids, closed-form
oracles with the exact list-schedule run, orderings and memory between
schedules, and golden op grids (``UPDATE_GOLDEN=1 pytest ...`` rewrites them).
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
from sim.experiment import build_experiment
from workloads.registry import SCHEDULES
from workloads.schedules import (
    Schedule,
    from_text,
    list_schedule,
    one_f_one_b,
    validate,
)
from workloads.schedules_advanced import (
    interleaved,
    makespan,
    microbatch_groups,
    peak_activation,
    repeat_steps,
    steady_state_period,
    uniform_duration,
    v_stage_rank,
    zb_h1,
    zb_h2,
    zb_v,
)

GOLDEN_DIR = Path(__file__).parent / "golden" / "schedules"
TOL = 1e-9


def build_all(p: int, m: int) -> list[Schedule]:
    """Every advanced builder's schedules for (p, m): interleaved for v = 1..4, the others once."""
    return [interleaved(p, m, v) for v in range(1, 5)] + [zb_h1(p, m), zb_h2(p, m), zb_v(p, m)]


# ----------------------------------------------------------------------------- validity


@pytest.mark.parametrize("p", range(1, 9))
def test_every_builder_valid_on_grid(p: int) -> None:
    for m in range(1, 17):
        for s in build_all(p, m):
            check_structure(s)
            assert s.num_ranks == p and s.num_microbatches == m


@pytest.mark.parametrize("p", range(1, 4))
def test_validate_accepts_every_builder_on_subgrid(p: int) -> None:
    for m in range(1, 17):
        for s in build_all(p, m):
            validate(s)


@pytest.mark.parametrize("p,m", [(8, 16), (8, 9), (8, 1), (5, 7)])
def test_validate_accepts_large_corners(p: int, m: int) -> None:
    for s in build_all(p, m):
        validate(s)


@given(p=st.integers(1, 8), m=st.integers(1, 16), v=st.integers(1, 4))
@settings(max_examples=40, deadline=None)
def test_interleaved_placement_and_counts(p: int, m: int, v: int) -> None:
    s = interleaved(p, m, v)
    assert s.stage_rank == tuple(st_ % p for st_ in range(p * v))
    assert s.chunks_per_rank == v and not s.split_backward
    assert all(len(ops) == 2 * m * v for ops in s.rank_ops)


@given(p=st.integers(1, 8), m=st.integers(1, 16))
@settings(max_examples=40, deadline=None)
def test_zero_bubble_placement_and_counts(p: int, m: int) -> None:
    for s in (zb_h1(p, m), zb_h2(p, m)):
        assert s.split_backward and s.stage_rank == tuple(range(p))
        assert all(len(ops) == 3 * m for ops in s.rank_ops)
    v = zb_v(p, m)
    assert v.split_backward and v.stage_rank == v_stage_rank(p) and v.chunks_per_rank == 2
    assert all({v.stage_rank[r], v.stage_rank[2 * p - 1 - r]} == {r} for r in range(p))
    assert all(len(ops) == 6 * m for ops in v.rank_ops)


def test_microbatch_groups() -> None:
    assert microbatch_groups(4, 8) == (4, 4)  # Megatron: groups of p
    assert microbatch_groups(4, 11) == (6, 5)  # >= p each, larger first
    assert microbatch_groups(4, 7) == (7,)
    assert microbatch_groups(4, 3) == (3,)
    for p in range(1, 9):
        for m in range(1, 40):
            g = microbatch_groups(p, m)
            assert sum(g) == m and list(g) == sorted(g, reverse=True) and g[0] - g[-1] <= 1
            assert m < p or min(g) >= p


# ----------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    "call",
    [
        lambda: interleaved(0, 4, 2),
        lambda: interleaved(2, 0, 2),
        lambda: interleaved(2, 4, 0),
        lambda: zb_h1(0, 4),
        lambda: zb_h1(2, 0),
        lambda: zb_h1(2, 4, 2),
        lambda: zb_h2(-1, 4),
        lambda: zb_h2(2, 4, 2),
        lambda: zb_v(2, 0),
        lambda: zb_v(2, 4, 1),
        lambda: zb_v(2, 4, 3),
        lambda: interleaved(2, 4.0, 2),  # type: ignore[arg-type]
        lambda: zb_h1(True, 4),
    ],
)
def test_invalid_arguments_raise_schedule_error(call) -> None:
    with pytest.raises(ScheduleError, match="schedule"):
        call()


def test_schedule_error_is_a_value_error_with_a_clear_message() -> None:
    with pytest.raises(ValueError, match=r"zb-v: chunks per rank v=1 .* uses v=2"):
        zb_v(4, 8, 1)
    with pytest.raises(ValueError, match=r"micro-batches m=0 must be >= 1"):
        interleaved(4, 0, 2)


def test_interleaved_v1_is_1f1b_and_p1_has_no_bubble() -> None:
    assert interleaved(4, 8, 1).rank_ops == one_f_one_b(4, 8).rank_ops
    for v in (2, 3, 4):
        s = interleaved(1, 5, v)
        assert makespan(s, uniform_duration(s, 1.0, 2.0)) == pytest.approx(5 * 3.0, abs=TOL)


@pytest.mark.parametrize("name", ["interleaved", "zb-v", "dualpipe-v"])
def test_multi_chunk_schedule_without_vpp_gets_two_chunks_per_rank(name: str) -> None:
    cfg = synthetic_experiment(4, 8, name)
    del cfg["parallel"]["vpp"]
    exp = build_experiment(cfg)
    assert exp.config.parallel.vpp == 2
    assert exp.schedule.chunks_per_rank == 2
    assert exp.schedule == SCHEDULES[name](4, 8, 2)


def test_a_vpp_the_file_gives_is_kept() -> None:
    exp = build_experiment(synthetic_experiment(4, 8, "interleaved", vpp=1))
    assert exp.schedule.rank_ops == one_f_one_b(4, 8).rank_ops  # asked for: v = 1 is 1F1B
    assert build_experiment(synthetic_experiment(4, 8, "interleaved", vpp=3)).schedule \
        .chunks_per_rank == 3
    cfg = synthetic_experiment(4, 8, "1f1b")
    del cfg["parallel"]["vpp"]
    assert build_experiment(cfg).config.parallel.vpp == 1
    with pytest.raises(ConfigError, match=r"zb-v: chunks per rank v=3 .* uses v=2"):
        build_experiment(synthetic_experiment(4, 8, "zb-v", vpp=3))


# ----------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("fwd,bwd", [(1.0, 2.0), (1.0, 1.0), (2.0, 1.0), (0.3, 1.7), (1.5, 4.5)])
@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_closed_form(fwd: float, bwd: float, p: int, v: int) -> None:
    """m(F + B) + (p - 1)(F + B)/v, with each chunk costing F/v and B/v (Narayanan et al. 2021)."""
    for m in (p, 2 * p, 3 * p):
        s = interleaved(p, m, v)
        want = m * (fwd + bwd) + (p - 1) * (fwd + bwd) / v
        assert makespan(s, uniform_duration(s, fwd, bwd)) == pytest.approx(want, abs=TOL)


@pytest.mark.parametrize("p,v", [(2, 2), (3, 2), (4, 2), (4, 3), (5, 4), (8, 2)])
def test_interleaved_closed_form_when_m_not_multiple_of_p(p: int, v: int) -> None:
    for m in range(p + 1, 3 * p + 1):
        s = interleaved(p, m, v)
        want = m * 3.0 + (p - 1) * 3.0 / v
        assert makespan(s, uniform_duration(s, 1.0, 2.0)) == pytest.approx(want, abs=TOL), m


def zb_h1_formula(p: int, m: int, fwd: float, b_input: float, w: float) -> float:
    """m(F + B) + (p - 1)(F + B - 2W), B the whole backward (Qi et al. 2024)."""
    b = b_input + w
    return m * (fwd + b) + (p - 1) * (fwd + b - 2 * w)


@pytest.mark.parametrize("p", range(1, 9))
def test_zb_h1_closed_form_equal_costs(p: int) -> None:
    """F = B_input = W: bubble (p - 1)F, one third of 1F1B's 3(p - 1)F."""
    for m in range(p, 3 * p + 2):
        s = zb_h1(p, m)
        for unit in (1.0, 0.7):
            got = makespan(s, uniform_duration(s, unit, 2 * unit, unit))
            assert got == pytest.approx(zb_h1_formula(p, m, unit, unit, unit), abs=TOL)
            assert got == pytest.approx(3 * m * unit + (p - 1) * unit, abs=TOL)


@pytest.mark.parametrize(
    "fwd,b_input,w",
    [(1.0, 1.5, 0.5), (2.0, 1.0, 1.0), (1.0, 2.0, 1.0), (1.5, 1.0, 0.25), (3.0, 2.0, 0.0)],
)
@pytest.mark.parametrize("p", [2, 3, 4, 6])
def test_zb_h1_closed_form_general(fwd: float, b_input: float, w: float, p: int) -> None:
    for m in (p, p + 1, 2 * p, 3 * p + 1):
        s = zb_h1(p, m)
        got = makespan(s, uniform_duration(s, fwd, b_input + w, w))
        assert got == pytest.approx(zb_h1_formula(p, m, fwd, b_input, w), abs=TOL)


@given(
    p=st.integers(1, 6),
    extra=st.integers(0, 8),
    fwd=st.integers(1, 20),
    b_input=st.integers(1, 20),
    w=st.integers(0, 20),
)
@settings(max_examples=60, deadline=None)
def test_zb_h1_closed_form_property(p: int, extra: int, fwd: int, b_input: int, w: int) -> None:
    """The formula holds exactly whenever W <= F and W <= B_input (costs in units of 1/8)."""
    w = min(w, fwd, b_input)
    f, bi, ww = fwd / 8, b_input / 8, w / 8
    m = p + extra
    s = zb_h1(p, m)
    got = makespan(s, uniform_duration(s, f, bi + ww, ww))
    assert got == pytest.approx(zb_h1_formula(p, m, f, bi, ww), abs=TOL)


@pytest.mark.parametrize("p", range(1, 9))
def test_zb_h2_and_zb_v_closed_forms_equal_costs(p: int) -> None:
    """F = B_input = W = 1, m >= 2p - 1: both repeat with period 3m (bubble 0).

    One isolated step: ZB-H2 m(F + B) + (p - 1)F (as ZB-H1, the bound under a
    step barrier), ZB-V m(F + B) + (p - 1)F/2 (half-length chunks).
    """
    for m in (2 * p - 1, 2 * p, 3 * p + 1):
        h2, v = zb_h2(p, m), zb_v(p, m)
        d_h2, d_v = uniform_duration(h2, 1.0, 2.0, 1.0), uniform_duration(v, 1.0, 2.0, 1.0)
        assert makespan(h2, d_h2) == pytest.approx(3 * m + (p - 1), abs=TOL)
        assert makespan(v, d_v) == pytest.approx(3 * m + (p - 1) / 2, abs=TOL)
        assert steady_state_period(h2, d_h2) == pytest.approx(3 * m, abs=TOL)
        assert steady_state_period(v, d_v) == pytest.approx(3 * m, abs=TOL)


def test_zb_h2_is_a_gapless_parallelogram() -> None:
    """With F = B_input = W every rank r is busy without a gap from r to r + 3m."""
    p, m = 4, 10
    s = zb_h2(p, m)
    times = list_schedule(s, uniform_duration(s, 1.0, 2.0, 1.0))
    for r, ops in enumerate(s.rank_ops):
        spans = [times[op] for op in ops]
        assert spans[0][0] == pytest.approx(r)
        assert spans[-1][1] == pytest.approx(r + 3 * m)
        assert all(a[1] == pytest.approx(b[0]) for a, b in zip(spans, spans[1:], strict=False))


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 10, 2), (3, 6, 3), (4, 6, 4)])
def test_interleaved_closed_form_through_the_engine(p: int, m: int, v: int) -> None:
    """The engine on the ideal cluster with the synthetic model, to 1e-9: m(F + B) +
    (p - 1)(F + B)/v (F, B whole-rank costs; each of the v chunks costs 1/v)."""
    fwd, bwd = 1.25, 2.5  # ms
    exp = build_experiment(synthetic_experiment(p, m, "interleaved", forward_ms=fwd,
                                                backward_ms=bwd, vpp=v))
    want = (m * (fwd + bwd) + (p - 1) * (fwd + bwd) / v) * 1e-3
    assert simulate(exp).stats["step_time_s"] == pytest.approx(want, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("fwd,b_input,w", [(1.0, 1.0, 1.0), (1.0, 1.5, 0.5), (2.0, 1.0, 1.0)])
@pytest.mark.parametrize("p,m", [(2, 2), (4, 8), (4, 9), (3, 7)])
def test_zb_h1_closed_form_through_the_engine(fwd: float, b_input: float, w: float, p: int,
                                              m: int) -> None:
    """The engine on the ideal cluster with the synthetic model, to 1e-9:
    m(F + B) + (p - 1)(F + B - 2W), B the whole backward (Qi et al. 2024)."""
    exp = build_experiment(synthetic_experiment(p, m, "zb-h1", forward_ms=fwd,
                                                backward_ms=b_input + w, weight_grad_ms=w))
    want = zb_h1_formula(p, m, fwd, b_input, w) * 1e-3
    assert simulate(exp).stats["step_time_s"] == pytest.approx(want, rel=1e-9, abs=1e-15)


# ----------------------------------------------------------------------------- orderings


@pytest.mark.parametrize("m", range(8, 17))
def test_orderings_p4(m: int) -> None:
    """F = B_input = W = 1 (1F1B runs the whole B = 2 unsplit).

    Isolated step: ZB-V < ZB-H1 < 1F1B, and ZB-H2 = ZB-H1: with one chunk per
    rank and a step barrier nothing beats m(F + B) + (p - 1)F (REFERENCES.md).
    Back-to-back steps (post-validation, no barrier): ZB-H2 and ZB-V < ZB-H1 < 1F1B.
    """
    p = 4
    schedules = {"1f1b": one_f_one_b(p, m), "h1": zb_h1(p, m), "h2": zb_h2(p, m), "v": zb_v(p, m)}
    costs = {name: uniform_duration(s, 1.0, 2.0, 1.0) for name, s in schedules.items()}
    step = {name: makespan(s, costs[name]) for name, s in schedules.items()}
    assert step["v"] < step["h1"] < step["1f1b"]
    assert step["h2"] <= step["h1"] + TOL
    period = {name: steady_state_period(s, costs[name]) for name, s in schedules.items()}
    assert max(period["h2"], period["v"]) < period["h1"] < period["1f1b"]
    assert step["1f1b"] == pytest.approx((m + p - 1) * 3.0, abs=TOL)


@pytest.mark.parametrize("fwd,b_input,w", [(1.0, 1.5, 0.5), (1.2, 1.0, 0.8), (1.0, 2.0, 1.0)])
def test_zb_h2_isolated_step_beats_zb_h1_with_unequal_costs(
    fwd: float, b_input: float, w: float
) -> None:
    for p, m in ((4, 12), (8, 24)):
        h1, h2 = zb_h1(p, m), zb_h2(p, m)
        b = b_input + w
        assert makespan(h2, uniform_duration(h2, fwd, b, w)) < makespan(
            h1, uniform_duration(h1, fwd, b, w)
        )


# ----------------------------------------------------------------------------- memory


def test_peak_activation_helper_counts_chunk_units() -> None:
    assert peak_activation(one_f_one_b(4, 8)) == (4, 3, 2, 1)
    # interleaved, rank 0: 2(p - 1) + (v - 1)p + 1 chunk forwards of 1/v rank each.
    assert peak_activation(interleaved(4, 8, 2))[0] == pytest.approx((6 + 4 + 1) / 2)
    assert peak_activation(interleaved(4, 8, 4))[0] == pytest.approx((6 + 12 + 1) / 4)
    # Split backward frees activations at W, not at B.
    s = from_text("0F0 0B0 0F1 0B1 0W0 0W1")
    assert peak_activation(s) == (2,)


@pytest.mark.parametrize("p", range(2, 9))
def test_memory_relative_to_1f1b(p: int) -> None:
    m = 3 * p
    base = peak_activation(one_f_one_b(p, m))[0]
    assert base == p
    h1, h2, v = (peak_activation(b(p, m)) for b in (zb_h1, zb_h2, zb_v))
    assert max(h1) == base  # ZB-H1: same peak as 1F1B, on every rank
    assert all(x == base for x in h1)
    assert h2[0] == 2 * p - 1  # ZB-H2: (2p - 1) micro-batches, about 2x
    assert 1.5 <= h2[0] / base < 2
    assert max(h2) == 2 * p - 1
    assert v[0] == base and max(v) == base  # ZB-V: 2p half-size chunks = 1x


@given(p=st.integers(1, 8), m=st.integers(1, 16))
@settings(max_examples=40, deadline=None)
def test_peak_activation_bounds(p: int, m: int) -> None:
    assert max(peak_activation(zb_h1(p, m))) == min(p, m)
    assert max(peak_activation(zb_h2(p, m))) == min(2 * p - 1, m)
    assert max(peak_activation(zb_v(p, m))) <= p


# ----------------------------------------------------------------------------- helpers


def test_repeat_steps_and_period_helpers() -> None:
    s = zb_h1(3, 4)
    r = repeat_steps(s, 3)
    assert r.num_microbatches == 12 and all(len(ops) == 36 for ops in r.rank_ops)
    check_structure(r)
    with pytest.raises(ScheduleError):
        repeat_steps(s, 0)
    with pytest.raises(ScheduleError):
        steady_state_period(s, lambda op: 1.0, steps=1)
    # 1F1B: rank 0 finishes last, so back-to-back steps do not overlap at all.
    base = one_f_one_b(4, 8)
    d = uniform_duration(base, 1.0, 2.0)
    assert steady_state_period(base, d) == pytest.approx(makespan(base, d))


# ----------------------------------------------------------------------------- golden grids

GOLDEN_CASES = {
    "interleaved_p4_m8_v2": lambda: interleaved(4, 8, 2),
    "interleaved_p2_m4_v2": lambda: interleaved(2, 4, 2),
    "interleaved_p4_m10_v2": lambda: interleaved(4, 10, 2),
    "zb-h1_p4_m8": lambda: zb_h1(4, 8),
    "zb-h2_p4_m8": lambda: zb_h2(4, 8),
    "zb-v_p4_m8": lambda: zb_v(4, 8),
}


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_golden_grid(case: str) -> None:
    assert_golden_grid(GOLDEN_CASES[case](), GOLDEN_DIR / f"{case}.txt")


def _flexible_interleaved_1f1b(p: int, m: int, v: int, r: int) -> list[tuple[int, str, int]]:
    """Rank ``r``'s compute ops (stage, kind, micro-batch) under PyTorch's
    ScheduleFlexibleInterleaved1F1B (pytorch/pytorch torch/distributed/pipelining/schedules.py,
    mid-2024, its rounds later folded into ScheduleInterleaved1F1B), restated from its rule:
    rounds = max(1, m // p), N = m / rounds micro-batches a round; warm-up (v - 1)N +
    2(p - 1 - r) forwards capped at m·v; then one forward and one backward; then the
    backwards. The k-th forward runs chunk (k // N) mod v, the k-th backward chunk
    v - 1 - (k // N) mod v; each chunk takes its micro-batches in order. Idle slots (None in
    PyTorch's table) are timing, not order, and are left out."""
    rounds = max(1, m // p)
    n = m // rounds
    assert m % rounds == 0
    total = m * v
    warmup = min((v - 1) * n + 2 * (p - 1 - r), total)
    fwd_seen: Counter = Counter()
    bwd_seen: Counter = Counter()

    def fwd(k: int) -> tuple[int, str, int]:
        stage = ((k // n) % v) * p + r
        fwd_seen[stage] += 1
        return stage, "F", fwd_seen[stage] - 1

    def bwd(k: int) -> tuple[int, str, int]:
        stage = (v - 1 - (k // n) % v) * p + r
        bwd_seen[stage] += 1
        return stage, "B", bwd_seen[stage] - 1

    ops = [fwd(k) for k in range(warmup)]
    for k in range(total - warmup):
        ops += [fwd(warmup + k), bwd(k)]
    ops += [bwd(k) for k in range(total - warmup, total)]
    return ops


@pytest.mark.parametrize(("p", "m", "v"), [(4, 10, 2), (16, 32, 8), (16, 16, 8), (4, 8, 2),
                                           (3, 9, 2), (2, 6, 3), (4, 3, 2), (8, 24, 4)])
def test_interleaved_is_pytorchs_flexible_interleaved_1f1b(p: int, m: int, v: int) -> None:
    """Llama 3's pipeline schedule (Dubey et al. 2024, sec. 3.3.2 and figure 6: N tunable, the
    figure's case 4 ranks, 10 micro-batches, N = 5, V = 2) as PyTorch ships it publicly: the
    same op order on every rank, so the same stashes in flight (for Llama 3 405B's
    16 ranks, 8 chunks and 32 micro-batches, 141 on rank 1; docs/memory-gaps.md, fifth
    pass)."""
    s = interleaved(p, m, v)
    for r in range(p):
        got = [(o.stage, o.kind, o.mb) for o in s.rank_ops[r]]
        assert got == _flexible_interleaved_1f1b(p, m, v, r), (p, m, v, r)
