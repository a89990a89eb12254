"""Screening is a fast path beside simulation: on random small experiments and search spaces,
every bound is a true lower bound of what the simulator finds (peak memory, step time),
and neither screening nor judging nor pruning discards the layout that simulating every
layout would rank first."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sim.search import Evaluation, Evaluator, Layout, Screener, SearchContext, search
from sim.search.plan import KINDS
from sim.search.space import enumerate_layouts
from workloads.schedules import Op

MODELS = {
    "gpt3-1.3b": {},
    "llama-7b": {},
    "llama2-70b": {},  # grouped-query attention
    "mixtral-8x7b": {"seq_length": 2048},  # mixture of experts
}
SLACK = 1 + 1e-9
"""Relative slack of a bound against the simulation (the engine sums in another order)."""
MAX_LAYOUTS = 48
"""Spaces are pinned down to at most this many layouts, so that every one is simulated."""


@st.composite
def _experiments(draw: st.DrawFn) -> tuple[dict, dict[str, tuple]]:
    """A small experiment (model cut to a few layers, 4-16 GPUs of one type) and pins."""
    preset = draw(st.sampled_from(sorted(MODELS)))
    model = {"preset": preset, **MODELS[preset], "num_layers": draw(st.sampled_from([2, 4, 6]))}
    model["seq_length"] = min(model.get("seq_length", 4096), draw(st.sampled_from([1024, 2048])))
    gpus = draw(st.sampled_from([4, 8, 16]))
    cluster = {"preset": draw(st.sampled_from(["dgx-a100-40g", "dgx-a100-80g", "dgx-h100"])),
               "num_gpus": gpus}
    data = {"name": "random", "model": model, "cluster": cluster,
            "training": {"global_batch_size": draw(st.sampled_from([8, 16, 32]))}}
    pins: dict[str, tuple] = {
        "micro_batch_size": (draw(st.sampled_from([1, 2, 4])),),
        "sequence_parallel": (draw(st.booleans()),),
        "zero_stage": tuple(draw(st.sets(st.sampled_from([0, 1, 2, 3]), min_size=1,
                                          max_size=2))),
        "recompute": tuple(draw(st.sets(st.sampled_from(["none", "selective", "full"]),
                                         min_size=1, max_size=2))),
        "schedule": tuple(draw(st.lists(st.sampled_from(
            ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipe-v",
             "seq1f1b"]), min_size=1, max_size=3, unique=True))),
    }
    if draw(st.booleans()):
        pins["cp"] = (1,)
    return data, pins


def _pinned(ctx: SearchContext, pins: dict[str, tuple]) -> list[Layout]:
    """The space's layouts, cut to :data:`MAX_LAYOUTS` by pinning tp to its smallest values
    (deterministic: a pin, so the search below sees the same space)."""
    layouts = list(enumerate_layouts(ctx, pins))
    tps = sorted({lay.tp for lay in layouts})
    while len(layouts) > MAX_LAYOUTS and len(tps) > 1:
        tps.pop()
        pins["tp"] = tuple(tps)
        layouts = list(enumerate_layouts(ctx, pins))
    return layouts


def _rank_key(ev: Evaluation) -> tuple:
    """How a search ranks simulated layouts: throughput, then less memory, then the key."""
    return (-(ev.stats["tokens_per_s"] or 0.0), ev.stats["peak_memory_gib"], ev.key)


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=_experiments())
def test_bounds_hold_and_screening_keeps_the_best_layout(case: tuple) -> None:
    data, pins = case
    ctx = SearchContext.build(data)
    layouts = _pinned(ctx, pins)
    if not layouts:
        return
    screener = Screener(ctx, comm=True, collapsed_only=True)
    evaluate = Evaluator(ctx.data, ctx.global_batch_size, "collapsed", screener.profile)
    simulated: dict[str, Evaluation] = {}
    for layout in layouts:
        ev = simulated[layout.key] = evaluate(layout)
        assert ev.status in ("ok", "oom", "invalid"), (layout.key, ev.error)
        screened = screener.screen(layout)
        judged = screener.judge(screened, threshold=1e-300) if screened.status == "ok" \
            else screened
        event(f"simulated {ev.status}, judged {judged.status}")
        if ev.status == "invalid":
            continue
        assert judged.status != "invalid", (layout.key, judged.reason)
        stats = ev.stats
        assert screened.memory_bound_gib <= stats["peak_memory_gib"] * SLACK, layout.key
        if judged.status == "memory":  # rejected without simulation: it must not fit
            assert stats["oom"], layout.key
            continue
        assert judged.memory_bound_gib <= stats["peak_memory_gib"] * SLACK, layout.key
        step_bound = ctx.global_batch_size * ctx.model.seq_length / judged.tokens_bound
        assert step_bound <= stats["step_time_s"] * SLACK, layout.key
        assert stats["tokens_per_s"] <= screened.tokens_bound * SLACK, layout.key
    feasible = sorted((ev for ev in simulated.values() if ev.status == "ok"), key=_rank_key)

    def replay(*_args: object) -> object:  # the search's simulations, from the table above
        return lambda layout: simulated[layout.key]

    found = search(data, pins=pins, top=1, prune=True, evaluator=replay)
    event(f"search simulated {found.simulated} of {len(layouts)}")
    if not feasible:
        assert found.best is None
        return
    assert found.best is not None, feasible[0].key
    assert found.best.layout.key == feasible[0].key
    assert found.best.stats == feasible[0].stats


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=_experiments(), zero_pinned=st.booleans())
def test_screening_by_family_is_the_reference_screening(case: tuple, zero_pinned: bool) -> None:
    """The fast path of :meth:`Screener.screen` (terms cached per family of layouts) gives
    every layout of a whole space the reference's verdict, float for float."""
    data, pins = case
    ctx = SearchContext.build(data)
    # the families must vary: only the schedules (and maybe the ZeRO stages) stay pinned
    kept = {k: v for k, v in pins.items() if k == "schedule" or (zero_pinned and k == "zero_stage")}
    layouts = list(enumerate_layouts(ctx, kept))
    fast = Screener(ctx, comm=True, collapsed_only=True)
    reference = Screener(ctx, comm=True, collapsed_only=True)
    assert fast.families
    event(f"{len(layouts) // 100 * 100}+ layouts")
    for layout in layouts:
        assert fast.screen(layout) == reference.screen(layout, reference=True), layout.key


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=_experiments(), partial=st.sampled_from([None, 1]))
def test_memory_walk_caches_are_the_plain_walk(case: tuple, partial: int | None) -> None:
    """The judge's memory walk (:meth:`Screener.memory_bound_gib`, activations and working
    memory cached per cost-model shape and stage class) is, float for float, the walk
    that asks the cost model for every stage and every op (with ``recompute_num_layers``
    the stages' layers differ, and the caches fall back to the stage)."""
    data, pins = case
    if partial is not None:
        data = {**data, "training": {**data["training"], "recompute_num_layers": partial}}
    ctx = SearchContext.build(data)
    screener = Screener(ctx, comm=True, collapsed_only=True)
    layouts = list(enumerate_layouts(ctx, {k: v for k, v in pins.items() if k != "schedule"}))
    for layout in layouts[:: max(1, len(layouts) // 60)]:
        plan = screener.plan(layout)
        if isinstance(plan, str):
            continue
        costs = ctx.costs_for(layout, layout.pp * layout.vpp)
        plain = []
        for stages, rows in zip(plan.rank_stages, plan.in_flight, strict=True):
            static = costs.static_bytes(stages)
            if not plan.exact:
                plain.append(screener._gib(static, 0.0))
                continue
            act = np.array([costs.activation_bytes_per_mb(s) for s in stages])
            extra = np.array([costs.transient_bytes(Op(k // 3, KINDS[k % 3], 0))
                              for k in rows[:, -1].astype(int).tolist()])
            plain.append(screener._gib(static, float((rows[:, :-1] @ act + extra).max())))
        assert screener.memory_bound_gib(costs, plan) == plain, layout.key


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=_experiments(), split=st.integers(0, 3))
def test_judging_on_relayed_plans_is_judging_on_built_ones(case: tuple, split: int) -> None:
    """A worker judging on plans another worker built and relayed
    (:meth:`Screener.plans_since` -> pickle -> :meth:`Screener.adopt_plans`, schedules
    left behind) gives every candidate the verdict of a screener that builds its own,
    float for float, and builds none of the plans it was handed."""
    import pickle

    data, pins = case
    ctx = SearchContext.build(data)
    layouts = _pinned(ctx, pins)
    reference = Screener(ctx, comm=True, collapsed_only=True)
    builder = Screener(ctx, comm=True, collapsed_only=True)
    relayed = Screener(ctx, comm=True, collapsed_only=True)
    candidates = [reference.screen(lay) for lay in layouts]
    cut = len(candidates) * split // 4  # the relayed worker builds its own plans for these
    for c in candidates[cut:]:
        builder.judge(c)
    relayed.adopt_plans(pickle.loads(pickle.dumps(builder.plans_since(0))))
    assert relayed.plans_built == 0
    for c in candidates[cut:] + candidates[:cut]:
        assert relayed.judge(c) == reference.judge(c), c.layout.key
    assert relayed.plans_since(0) == () or cut > 0
