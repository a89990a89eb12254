"""``sim search``: enumeration, pins, the memory and step-time bounds, the sweep, the CLI,
resuming a killed sweep, and Hagemann et al. 2023's qualitative findings."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from functools import cache
from pathlib import Path

import pytest
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from base.errors import ConfigError
from sim.cli import main
from sim.experiment import build_experiment
from sim.search import (
    DIMS,
    Evaluation,
    Evaluator,
    Layout,
    ResultStore,
    Screener,
    SearchContext,
    SearchResult,
    cp_min_tokens,
    enumerate_layouts,
    parse_pins,
    pins_from_file,
    rows_csv,
    search,
)

SMALL = {
    "name": "gpt-1.3b-16",
    "model": {"preset": "gpt3-1.3b"},
    "cluster": {"preset": "dgx-a100-80g", "num_gpus": 16},
    "training": {"global_batch_size": 32},
}
"""A cheap search: every collapsed simulation takes a few tens of ms."""


def _data(**changes: object) -> dict:
    out = json.loads(json.dumps(SMALL))
    for key, value in changes.items():
        section, _, name = key.rpartition("__")
        (out.setdefault(section, {}) if section else out)[name] = value
    return out


@cache
def _context(name: str) -> SearchContext:
    return SearchContext.build(BOUND_SETUPS[name][0])


# ----------------------------------------------------------------------------- layouts, pins


@pytest.mark.parametrize("example", ["search-gpt3-175b-1024", "search-llama-13b-64",
                                     "search-hetero-placement"])
def test_enumerated_layouts_carry_the_keys_their_values_give(example: str) -> None:
    """Enumeration builds each key from parts its loops share (``Layout.with_key``): every
    layout equals ``Layout(*values)`` field for field, with the key that formats."""
    from sim.config import read_yaml

    ctx = SearchContext.build(read_yaml(ROOT / "workloads" / "examples" / f"{example}.yaml"))
    layouts = list(enumerate_layouts(ctx))
    assert layouts
    for lay in layouts:
        ref = Layout(*lay.values())
        assert lay == ref and vars(lay) == {**vars(ref), "key": ref.key}
        assert Layout.from_key(lay.key) == lay


def test_layout_key_round_trips_and_selects_the_layout() -> None:
    layout = Layout(tp=2, pp=4, dp=2, vpp=2, sequence_parallel=True, zero_stage=2,
                    micro_batch_size=2, recompute="selective", schedule="interleaved")
    assert Layout.from_key(layout.key) == layout
    assert layout.key.startswith("tp=2 pp=4 dp=2 cp=1 ep=1 vpp=2 sp=true zero=2 mbs=2")
    exp = build_experiment(_data()).with_changes(layout.changes(32))
    assert (exp.placement.degree("tp"), exp.placement.degree("pp"),
            exp.placement.degree("dp")) == (2, 4, 2)
    assert exp.schedule.chunks_per_rank == 2 and exp.num_microbatches == 8
    settings_ = layout.settings()
    assert settings_["parallel"]["sequence_parallel"] is True
    assert settings_["training"] == {"micro_batch_size": 2, "recompute": "selective"}


def test_parse_pins_aliases_alternatives_and_errors() -> None:
    pins = parse_pins(["parallel.tp=8,schedule=1f1b", "mbs=1|2", "sp=true", "zero=0|1"])
    assert pins == {"tp": (8,), "schedule": ("1f1b",), "micro_batch_size": (1, 2),
                    "sequence_parallel": (True,), "zero_stage": (0, 1)}
    assert parse_pins(["tp=1|2|4", "parallel.tp=2|8"]) == {"tp": (2,)}  # pins intersect
    for bad, needle in (("tp", "KEY=VALUE"), ("foo=1", "KEY=VALUE"), ("tp=x", "integer"),
                        ("zero=4", "0..3"), ("recompute=some", "selective"),
                        ("sp=maybe", "true or false"), ("tp=1,tp=2", "share no value")):
        with pytest.raises(ConfigError, match=needle):
            parse_pins([bad])


def test_pins_from_file_pin_only_what_the_file_sets() -> None:
    pins = pins_from_file(_data(parallel__tp=2, training__micro_batch_size=1, schedule="zb-h1"))
    assert pins == {"tp": (2,), "micro_batch_size": (1,), "schedule": ("zb-h1",)}


def test_enumeration_divides_correctly_without_duplicates() -> None:
    ctx = SearchContext.build(_data())
    layouts = list(enumerate_layouts(ctx))
    assert len(layouts) == len(set(layouts)) > 1000
    model, n, gbs = ctx.model, 16, 32
    for lay in layouts:
        assert lay.tp * lay.pp * lay.dp * lay.cp == n
        assert gbs % (lay.micro_batch_size * lay.dp) == 0
        assert model.num_attention_heads % lay.tp == 0
        assert lay.pp * lay.vpp <= model.num_layers
        assert not lay.sequence_parallel or lay.tp > 1          # SP without TP: a no-op
        assert lay.pp > 1 or lay.schedule == "1f1b"             # one rank: one schedule
        assert lay.dp > 1 or lay.zero_stage == 0                # ZeRO needs replicas
        assert lay.ep == 1                                      # a dense model
        assert lay.cp == 1 or 2048 % (2 * lay.cp) == 0         # 2·cp equal sequence chunks
        assert lay.zero_stage < 3 or "zero=3" not in ctx.unsupported  # as the probe finds
        if lay.schedule == "seq1f1b":                           # as the probe finds
            assert "schedule=seq1f1b" not in ctx.unsupported and lay.cp == 1
    assert "ep=2" in ctx.unsupported


def test_enumeration_is_complete_against_the_experiment_builder() -> None:
    """Every layout the experiment builder accepts (up to the documented duplicates) is
    enumerated, and every enumerated layout that screening keeps builds."""
    data = _data(cluster={"preset": "ideal", "num_gpus": 8}, training={"global_batch_size": 16})
    pins = {"recompute": ("none",), "zero_stage": (1,), "sequence_parallel": (False,),
            "cp": (1,)}
    ctx = SearchContext.build(data)
    found = set(enumerate_layouts(ctx, pins))
    base = build_experiment(_neutral_valid(data))
    accepted = set()
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8):
            if 8 % (tp * pp):
                continue
            dp = 8 // (tp * pp)
            for mbs in (1, 2, 4, 8, 16):
                for sched in ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v",
                              "dualpipe-v", "seq1f1b"):
                    for vpp in (1, 2, 3, 4, 6, 12):
                        lay = Layout(tp, pp, dp, vpp=vpp, micro_batch_size=mbs, schedule=sched)
                        try:
                            base.with_changes(lay.changes(16))
                        except ConfigError:
                            continue
                        accepted.add(lay)
    dropped = {lay for lay in accepted - found if not _documented_duplicate(lay, ctx)}
    assert not dropped, sorted(lay.key for lay in dropped)[:5]
    screener = Screener(ctx)
    for lay in found:
        if screener.judge(screener.screen(lay)).status != "invalid":
            assert lay in accepted, lay.key


def _neutral_valid(data: dict) -> dict:
    return {**data, "parallel": {"tp": 1, "pp": 1}}


def _documented_duplicate(lay: Layout, ctx: SearchContext) -> bool:
    """The duplicates enumeration drops on purpose (module docstring of sim.search)."""
    layers = ctx.model.num_layers
    return ((lay.pp == 1 and lay.schedule != "1f1b")
            or (lay.schedule == "interleaved" and (lay.vpp == 1 or layers % (lay.pp * lay.vpp))))


def test_enumeration_drops_cp_degrees_whose_ring_cannot_hide_its_passes() -> None:
    """Unpinned, CP degrees with fewer than ``(kv/h)·F/B`` tokens per rank are not enumerated
    (1,040 on A100 with multi-head attention); pinned, they are. On a case where the rule
    drops some, the best layout of a sweep over every CP degree is one it keeps."""
    data = _data(model={"preset": "gpt3-1.3b", "seq_length": 8192})
    ctx = SearchContext.build(data)
    assert cp_min_tokens(ctx) == pytest.approx(312e12 / 300e9)
    assert {lay.cp for lay in enumerate_layouts(ctx)} == {1, 2, 4}  # 8192/8 = 1024 < 1040
    every = parse_pins(["cp=1|2|4|8|16"])
    assert {lay.cp for lay in enumerate_layouts(ctx, every)} == {1, 2, 4, 8, 16}
    gqa = SearchContext.build(_data(model={"preset": "llama2-70b", "num_layers": 8,
                                           "seq_length": 2048}))
    assert cp_min_tokens(gqa) == pytest.approx(312e12 / 300e9 / 8)
    assert {lay.cp for lay in enumerate_layouts(gqa)} == {1, 2, 4, 8}  # 2048/16 < 130
    others = "tp=1|2,pp=1|2,mbs=1,recompute=none|full,zero=1,sp=false,schedule=1f1b"
    kept = search(data, pins=parse_pins([others]), top=1)
    full = search(data, pins=parse_pins([others, "cp=1|2|4|8|16"]), top=1)
    assert full.enumerated > kept.enumerated
    assert (kept.best.layout, kept.best.stats) == (full.best.layout, full.best.stats)


def test_screening_chunks_keep_groups_on_one_worker() -> None:
    """Screening chunks cover every layout once, about eight per worker, each made of whole
    (tp, cp, micro-batch) groups (whose op times and TP collectives a worker then computes
    once), unless a group is larger than a chunk or in the tail (the first ``workers``
    chunks, handed out last, in pieces)."""
    from sim.search.execution import SCREEN_CHUNKS_PER_WORKER, SCREEN_TAIL_PIECES, screen_chunks

    layouts = list(enumerate_layouts(SearchContext.build(_data())))
    n = len(layouts)
    assert screen_chunks(layouts, 1) == [list(range(n))] and screen_chunks([], 2) == []
    group = {i: (lay.tp, lay.cp, lay.micro_batch_size) for i, lay in enumerate(layouts)}
    sizes = Counter(group.values())
    for workers in (2, 3):
        chunks = screen_chunks(layouts, workers)
        assert sorted(i for chunk in chunks for i in chunk) == list(range(n))
        size = -(-n // (SCREEN_CHUNKS_PER_WORKER * workers))
        holders: dict[tuple, set[int]] = {}
        for c, chunk in enumerate(chunks):
            assert chunk == sorted(chunk, key=lambda i: (group[i], i))
            for i in chunk:
                holders.setdefault(group[i], set()).add(c)
        # split only if larger than a chunk, or in the tail's pieces (the first chunks)
        tail = {c for c in range(len(chunks)) if c < workers * SCREEN_TAIL_PIECES}
        for g, where in holders.items():
            assert len(where) == 1 or sizes[g] > size or where <= tail, g
        target = SCREEN_CHUNKS_PER_WORKER * workers
        assert target // 2 <= len(chunks) <= 4 * target


def test_family_terms_are_computed_once_and_change_no_verdict() -> None:
    """With more than one worker, screening first computes each family's state terms on one
    worker (:func:`~sim.search.execution.family_chunks`: every family once, whole
    (tp, cp, ep, pp) groups) and hands them to the screening chunks: the verdicts are
    those of one worker screening everything."""
    from sim.executors import InlineExecutor, Task
    from sim.search import SearchWorker, WorkerSpec
    from sim.search.bounds import state_family
    from sim.search.execution import LocalFallback, family_chunks, screen_all

    ctx = SearchContext.build(_data())
    layouts = list(enumerate_layouts(ctx))
    first = {state_family(lay): lay for lay in reversed(layouts)}
    chunks = family_chunks(list(first.values()))
    assert sorted(state_family(lay) for c in chunks for lay in c) == sorted(first)
    assert all(len({(lay.tp, lay.cp, lay.ep, lay.pp) for lay in c}) == 1 for c in chunks)
    assert len(chunks) == len({(lay.tp, lay.cp, lay.ep, lay.pp) for lay in layouts})
    spec = WorkerSpec(ctx.data, None, ctx.global_batch_size, "collapsed", None, True,
                      tuple(sorted(ctx.unsupported.items())),
                      tuple(ctx.schedule_vpps.items()))
    task = Task(SearchWorker, (spec,))
    one = screen_all(layouts, InlineExecutor(), task, LocalFallback(spec), True)
    two = InlineExecutor()
    two.workers = 2  # the two-phase path, in this process
    assert screen_all(layouts, two, task, LocalFallback(spec), True) == one


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), in_flight=st.integers(1, 6))
def test_screening_by_family_in_one_stream_holds_each_chunk_for_its_families(
        seed: int, in_flight: int) -> None:
    """Screening by family on several workers is one stream: the family chunks first, each
    screening chunk once its families' terms are in. Whatever order the answers come in,
    no screening chunk leaves before the families it needs, and the verdicts are those of
    one worker screening everything."""
    import random

    from sim.executors import Executor, InlineExecutor, Task
    from sim.search import SearchWorker, WorkerSpec
    from sim.search.bounds import state_family
    from sim.search.execution import (
        FamilyChunk,
        LocalFallback,
        ScreenChunk,
        screen_all,
        space_digest,
    )

    ctx, layouts = _small_space()
    spec = WorkerSpec(ctx.data, None, ctx.global_batch_size, "collapsed", None, True,
                      tuple(sorted(ctx.unsupported.items())),
                      tuple(ctx.schedule_vpps.items()))
    task = Task(SearchWorker, (spec,))
    group = [state_family(lay)[:4] for lay in layouts]
    assert space_digest(layouts)

    class Shuffled(Executor):
        """Up to ``in_flight`` items out; answers the one ``rng`` picks."""

        workers = 2

        def __init__(self) -> None:
            self.done: set[tuple] = set()
            self.kinds: list[str] = []

        def stream(self, task, feed):  # type: ignore[no-untyped-def]
            rng, out, worker = random.Random(seed), [], task.build()
            while True:
                while len(out) < in_flight and (item := feed()) is not None:
                    if isinstance(item, ScreenChunk):
                        assert {group[i] for i in item.indices} <= self.done
                    self.kinds.append(type(item).__name__)
                    out.append(item)
                if not out:
                    return
                item = out.pop(rng.randrange(len(out)))
                answer = worker(item)
                if isinstance(item, FamilyChunk):
                    self.done.add(state_family(Layout(*item.layouts[0]))[:4])
                yield item, answer

    one = screen_all(layouts, InlineExecutor(), task, LocalFallback(spec), True)
    shuffled = Shuffled()
    assert screen_all(layouts, shuffled, task, LocalFallback(spec), True) == one
    assert "FamilyChunk" in shuffled.kinds and "ScreenChunk" in shuffled.kinds


@cache
def _small_space() -> tuple[SearchContext, list[Layout]]:
    ctx = SearchContext.build(_data())
    return ctx, list(enumerate_layouts(ctx))


def test_workers_screen_the_shared_space_or_enumerate_the_same_one() -> None:
    """Screening chunks carry indices into the search's layouts: a worker that shares them
    (this process, or forked inside :func:`~sim.search.execution.shared_space`) reads the
    caller's list; one that does not (a fork server, spawn, Ray) enumerates the space from
    its spec and gets the same verdicts; a spec that describes another space is refused."""
    from dataclasses import replace

    from base.errors import SimError
    from sim.search import SearchWorker, WorkerSpec
    from sim.search.execution import ScreenChunk, shared_space, space_digest

    ctx = SearchContext.build(SMALL)
    layouts = list(enumerate_layouts(ctx, PINS_SMALL))
    spec = WorkerSpec(ctx.data, None, ctx.global_batch_size, "collapsed", None, True,
                      tuple(sorted(ctx.unsupported.items())),
                      tuple(ctx.schedule_vpps.items()),
                      pins=tuple(sorted(PINS_SMALL.items())))
    chunk = ScreenChunk(tuple(range(len(layouts)))[::-1], space_digest(layouts))
    alone = SearchWorker(spec)
    with shared_space(ctx, layouts) as token:
        shared = SearchWorker(replace(spec, space=token))
        assert shared.layouts is layouts and shared.context is ctx
        assert shared(chunk) == alone(chunk)
    assert alone.layouts == layouts and alone.layouts is not layouts
    other = SearchWorker(replace(spec, pins=tuple(sorted({**PINS_SMALL, "tp": (1,)}.items()))))
    with pytest.raises(SimError, match="other layouts"):
        other(chunk)


def _space_is_shared(token: str) -> object:
    """A worker function: whether this worker process sees the space ``token``."""
    from sim.search.execution import _SPACES

    return lambda _item: (os.getpid(), token in _SPACES)


def test_forked_workers_inherit_the_shared_space_and_threads_prevent_forking() -> None:
    """On Linux a single-threaded caller forks its workers, which inherit the spaces shared
    before the pool starts; with another thread alive (a progress bar's monitor) the pool
    starts from the fork server instead, whose workers enumerate again."""
    import threading

    from sim.executors import LocalExecutor, Task, _mp_context
    from sim.search.execution import shared_space

    if sys.platform != "linux":
        pytest.skip("fork is used on Linux only")
    ctx = SearchContext.build(SMALL)
    with shared_space(ctx, []) as token:
        assert _mp_context().get_start_method() == "fork"
        with LocalExecutor(2) as executor:
            seen = [out for _, out in executor.run(Task(_space_is_shared, (token,)), [0] * 4)]
        assert all(inherited for _, inherited in seen)
        assert {pid for pid, _ in seen} - {os.getpid()}  # in worker processes
        stop = threading.Event()
        thread = threading.Thread(target=stop.wait)
        thread.start()
        try:
            assert _mp_context().get_start_method() in ("forkserver", "spawn")
        finally:
            stop.set()
            thread.join()


def test_an_adopted_timing_is_the_timers_own_float() -> None:
    """:meth:`CollectiveTimer.adopt`: a timer given another timer's timings of the same
    cluster answers them without timing (the floats it would compute)."""
    from sim.commtime import CollectiveTimer

    cluster = SearchContext.build(SMALL).cluster
    first = CollectiveTimer(cluster)
    calls = [("all_reduce", ((0, 1, 2, 3), (8, 9, 10, 11)), 1e8),
             ("send", ((0, 8), (1, 9)), 3e7), ("all_gather", ((0, 8),), 5e6)]
    times = [first(*c) for c in calls]
    assert first.size == 3 and first.timings_since(1) == first.timings_since(0)[1:]
    fresh = CollectiveTimer(cluster)
    assert [fresh(*c) for c in calls] == times  # pure: a fresh timer, the same floats
    other = CollectiveTimer(cluster)
    other.adopt(first.timings_since(0))

    def refuse(*_args: object) -> float:
        raise AssertionError("timed an adopted collective again")

    other._timed = refuse  # type: ignore[method-assign]
    assert [other(*c) for c in calls] == times and other.size == 3


def _relay_worker() -> object:
    """A worker function for :class:`TimingRelay`: answers ``item * 2``, reports the timing
    ``((item,), item / 10)`` and remembers every timing it was handed."""
    from sim.search.execution import Relayed

    held: dict[tuple, float] = {}

    def fn(wrapped: Relayed) -> Relayed:
        held.update(wrapped.timings)
        return Relayed((wrapped.item * 2, sorted(held)), (((wrapped.item,), wrapped.item / 10),),
                       wrapped.upto, 1)

    return fn


def test_a_timing_relay_hands_each_answer_s_timings_to_later_items() -> None:
    """:class:`TimingRelay`: the caller sees plain items and answers; the timings an answer
    reports travel with the items sent after it (to whichever worker takes them)."""
    from sim.executors import InlineExecutor, Task
    from sim.search.execution import TimingRelay

    inner = InlineExecutor()
    inner.workers = 2
    relay = TimingRelay(inner)
    got = dict(relay.run(Task(_relay_worker), [1, 2, 3]))
    assert {i: a for i, (a, _) in got.items()} == {0: 2, 1: 4, 2: 6}
    assert got[2][1] == [(1,), (2,)]  # the third item carried the first two answers' timings
    assert relay.log == [((1,), 0.1), ((2,), 0.2), ((3,), 0.3)]


def test_enumeration_respects_pins() -> None:
    ctx = SearchContext.build(_data())
    pins = parse_pins(["tp=2|4,pp=2,mbs=1,schedule=interleaved|zb-v,recompute=none"])
    layouts = list(enumerate_layouts(ctx, pins))
    assert layouts
    for lay in layouts:
        assert lay.tp in (2, 4) and lay.pp == 2 and lay.micro_batch_size == 1
        assert lay.schedule in ("interleaved", "zb-v") and lay.recompute == "none"
    assert {lay.vpp for lay in layouts if lay.schedule == "zb-v"} == {2}
    # a pin keeps values enumeration would drop as duplicates
    one_rank = list(enumerate_layouts(ctx, parse_pins(["pp=1,schedule=gpipe,tp=1,zero=1,cp=1"])))
    assert one_rank and {(lay.schedule, lay.dp, lay.zero_stage) for lay in one_rank} == {
        ("gpipe", 16, 1)}
    with pytest.raises(ConfigError, match="unknown schedule"):
        list(enumerate_layouts(ctx, parse_pins(["schedule=zigzag"])))


# ----------------------------------------------------------------------------- bounds

BOUND_SETUPS = {
    "gpt-1.3b/16 collapsed": (_data(), "collapsed"),
    "llama-7b(8 layers)/16 collapsed": (_data(model={"preset": "llama-7b", "num_layers": 8},
                                              training={"global_batch_size": 32}), "collapsed"),
    "llama2-70b(8 layers, GQA)/32 collapsed": (
        _data(model={"preset": "llama2-70b", "num_layers": 8, "seq_length": 2048},
              cluster={"preset": "dgx-a100-80g", "num_gpus": 32},
              training={"global_batch_size": 32}), "collapsed"),
    "gpt-1.3b/8 full": (_data(cluster={"preset": "dgx-a100-80g", "num_gpus": 8},
                              training={"global_batch_size": 16}), "full"),
}


@cache
def _setup(name: str) -> tuple[SearchContext, Screener, Evaluator, list[Layout]]:
    data, fidelity = BOUND_SETUPS[name]
    ctx = _context(name)
    screener = Screener(ctx, comm=fidelity == "collapsed")
    evaluator = Evaluator(ctx.data, ctx.global_batch_size, fidelity, screener.profile)
    layouts = [lay for lay in enumerate_layouts(ctx) if lay.micro_batch_size <= 4]
    return ctx, screener, evaluator, layouts


@settings(max_examples=24, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(setup=st.sampled_from(sorted(BOUND_SETUPS)), pick=st.integers(0, 10**9))
def test_bounds_never_exceed_the_simulation(setup: str, pick: int) -> None:
    """The memory pre-filter never rejects a layout the simulator says fits, and both step
    bounds (the loose one that orders the search, the list-schedule one that prunes) are
    at most the simulated step time."""
    _, screener, evaluator, layouts = _setup(setup)
    layout = layouts[pick % len(layouts)]
    screened = screener.screen(layout)
    judged = screener.judge(screened, threshold=1e-300) if screened.status == "ok" else screened
    ev = evaluator(layout)
    assert ev.status in ("ok", "oom", "invalid"), ev.error
    if ev.status == "invalid":
        assert judged.status == "invalid", layout.key
        return
    stats = ev.stats
    slack = 1 + 1e-9
    assert screened.memory_bound_gib <= stats["peak_memory_gib"] * slack, layout.key
    if judged.status == "memory":
        assert stats["oom"], f"{layout.key}: rejected by the memory bound but fits"
    assert judged.status in ("ok", "memory", "pruned"), (layout.key, judged.reason)
    if judged.status != "memory":
        assert judged.memory_bound_gib <= stats["peak_memory_gib"] * slack, layout.key
        assert stats["tokens_per_s"] <= judged.tokens_bound * slack, layout.key
    if screened.status == "ok":
        assert stats["tokens_per_s"] <= screened.tokens_bound * slack, layout.key


def test_memory_bound_is_the_simulated_peak_for_the_current_memory_model() -> None:
    """The walk allocates as the engine does, so on these layouts it is exact. Seq1F1B's
    sequence chunks are not walked chunk by chunk: there the walk is only a lower bound
    (test_bounds_never_exceed_the_simulation)."""
    _, screener, evaluator, layouts = _setup("gpt-1.3b/16 collapsed")
    layouts = [lay for lay in layouts if lay.schedule != "seq1f1b"]
    for layout in layouts[:: max(1, len(layouts) // 12)]:
        judged = screener.judge(screener.screen(layout))
        ev = evaluator(layout)
        if judged.status in ("ok", "memory") and ev.stats:
            assert judged.memory_bound_gib == pytest.approx(ev.stats["peak_memory_gib"],
                                                            rel=1e-9), layout.key


# ----------------------------------------------------------------------------- the sweep

PINS_SMALL = parse_pins(["tp=1|2,pp=2|4,mbs=1|2,recompute=none,zero=1,sp=false,cp=1|2"])


@cache
def _small(prune: bool) -> SearchResult:
    return search(SMALL, pins=PINS_SMALL, top=3, prune=prune)


def test_pruning_keeps_the_top_k_exact() -> None:
    full, pruned = _small(False), _small(True)
    assert pruned.simulated < full.simulated
    assert [(r.layout, r.stats) for r in pruned.top(3)] == [(r.layout, r.stats)
                                                            for r in full.top(3)]
    best = full.best
    assert best is not None and best.rank == 1
    ranked = [r.figure("tokens_per_s") for r in full.feasible]
    assert ranked == sorted(ranked, reverse=True)
    for row in pruned.rows:  # pruned layouts really are below the K-th best
        if row.status == "pruned":
            assert row.tokens_bound < pruned.top(3)[-1].figure("tokens_per_s")
    assert pruned.counts["pruned"] > 0 and sum(pruned.counts.values()) == pruned.enumerated


def _sim_run_stats(tmp_path: Path, capsys: pytest.CaptureFixture, data: dict,
                   layout: Layout, gbs: int) -> dict:
    """``sim run --json`` of ``layout`` in the experiment ``data`` (a copy is changed)."""
    exp_file = tmp_path / "best.yaml"
    data = json.loads(json.dumps(data))
    for key, value in layout.changes(gbs).items():
        section, _, name = key.rpartition(".")
        if value is not None:
            (data.setdefault(section, {}) if section else data)[name] = value
    exp_file.write_text(json.dumps(data))
    assert main(["run", str(exp_file), "--json", "--fidelity", "collapsed"]) == 0
    return json.loads(capsys.readouterr().out)


def test_search_result_matches_sim_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    best = _small(True).best
    assert _sim_run_stats(tmp_path, capsys, _data(), best.layout, 32) == best.stats


def test_file_settings_beyond_the_layout_reach_the_search(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    """A per-stage layer split, gradient buckets and a placement in the file: only layouts
    with that many stages are enumerated, the screener's cost model is the one ``sim run``
    builds, and the search's figures are ``sim run``'s."""
    data = _data(parallel={"layers_per_stage": [4, 8, 8, 4], "overlap_grad_reduce": True,
                           "grad_bucket_MB": 40, "placement": "tp-pp-cp-dp"})
    pins = parse_pins(["tp=1|2,mbs=1|2,recompute=none,zero=1,sp=false,cp=1"])
    ctx = SearchContext.build(data)
    layouts = list(enumerate_layouts(ctx, pins))
    assert layouts and {lay.pp * lay.vpp for lay in layouts} == {4}
    evaluator = Evaluator(ctx.data, ctx.global_batch_size)
    for lay in layouts[:: max(1, len(layouts) // 8)]:
        assert ctx.costs_for(lay, lay.pp * lay.vpp) == evaluator.experiment(lay).costs, lay.key
    result = search(data, pins=pins, top=2)
    assert result.counts.get("invalid", 0) == 0
    for row in result.top(2):
        assert row.layout.pp * row.layout.vpp == 4
        assert _sim_run_stats(tmp_path, capsys, data, row.layout, 32) == row.stats


MOE = {"name": "mixtral-4l-16",
       "model": {"preset": "mixtral-8x7b", "num_layers": 4, "seq_length": 1024},
       "cluster": {"preset": "dgx-h100", "num_gpus": 16}, "training": {"global_batch_size": 32}}


def test_zero3_with_expert_parallelism_is_searched(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    """ZeRO-3 with ep > 1 is enumerated, its bounds hold, and its figures are ``sim run``'s."""
    ctx = SearchContext.build(MOE)
    assert any(lay.ep > 1 and lay.zero_stage == 3 for lay in enumerate_layouts(ctx))
    pins = parse_pins(["zero=3,ep=2|4,tp=2,pp=1|2,mbs=1,recompute=full,sp=true,cp=1,"
                       "schedule=1f1b"])
    result = search(MOE, pins=pins, top=4, prune=False)
    assert result.counts == {"ok": 4}
    assert {(r.layout.ep, r.layout.zero_stage) for r in result.rows} == {(2, 3), (4, 3)}
    for row in result.rows:
        assert row.memory_bound_gib <= row.figure("peak_memory_gib") * (1 + 1e-9), row.layout.key
        assert row.figure("tokens_per_s") <= row.tokens_bound * (1 + 1e-9), row.layout.key
    best = result.best
    assert _sim_run_stats(tmp_path, capsys, MOE, best.layout, 32) == best.stats


def test_a_failing_layout_is_recorded_and_the_sweep_goes_on() -> None:
    store = ResultStore()
    first = search(SMALL, pins=PINS_SMALL, top=2, prune=False, store=store,
                   evaluator=_FailingEvaluator)
    errors = [r for r in first.rows if r.status == "error"]
    assert len(errors) == 1 and "boom" in errors[0].error
    assert first.counts["ok"] == first.simulated - 1
    again = search(SMALL, pins=PINS_SMALL, top=2, prune=False, store=store,
                   evaluator=_FailingEvaluator)
    assert again.simulated == 0 and again.resumed == first.simulated
    assert [r.status for r in again.rows] == [r.status for r in first.rows]


class _FailingEvaluator(Evaluator):
    """Raises on one layout, as a bug in the simulator would (the Evaluator catches it)."""

    def experiment(self, layout: Layout):  # type: ignore[no-untyped-def]
        if layout.pp == 2 and layout.schedule == "zb-h1" and layout.micro_batch_size == 2 \
                and layout.tp == 1 and layout.cp == 1:
            raise RuntimeError("boom")
        return super().experiment(layout)


def test_store_keeps_results_per_experiment(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    ev = Evaluation("tp=1 pp=1", "ok", {"tokens_per_s": 1.0}, elapsed_s=0.5)
    with ResultStore(db) as store:
        store.put("exp-a", ev)
        store.put("exp-a", ev)  # replaces
    with ResultStore(db) as store:
        assert store.count() == 1
        assert store.load("exp-a")["tp=1 pp=1"].same_result(ev)
        assert store.load("exp-b") == {}
    (tmp_path / "junk.sqlite").write_text("not a database" * 100)
    with pytest.raises(ConfigError, match="not a usable SQLite"):
        ResultStore(tmp_path / "junk.sqlite").load("x")


def test_store_refuses_another_schema_and_damaged_rows(tmp_path: Path) -> None:
    """Issue 21: another table layout and a row with broken JSON were tracebacks."""
    import sqlite3

    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE results (a, b)")
    with pytest.raises(ConfigError, match="columns a, b, not those of sim search"):
        ResultStore(other)
    db = tmp_path / "r.sqlite"
    with ResultStore(db) as store:
        store.put("exp", Evaluation("tp=1 pp=1", "ok", {"tokens_per_s": 1.0}))
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE results SET stats = '{broken'")
    with ResultStore(db) as store, pytest.raises(ConfigError,
                                                 match="layout 'tp=1 pp=1' is damaged"):
        store.load("exp")


def test_store_claims(tmp_path: Path) -> None:
    """Issue 21: two searches on one database split the work. A claim is held until its
    result is stored, it is released, or its process is gone; a stored result is handed
    to whoever claims next."""
    db = tmp_path / "r.sqlite"
    ev = Evaluation("tp=1 pp=1", "ok", {"tokens_per_s": 1.0})
    with ResultStore(db) as a, ResultStore(db) as b:
        assert a.claim("exp", ev.key) is True and a.claim("exp", ev.key) is True
        assert b.claim("exp", ev.key) is False  # a lives (this very process)
        a.put("exp", ev)
        got = b.claim("exp", ev.key)
        assert isinstance(got, Evaluation) and got.same_result(ev)
        assert a.claim("exp", "other") is True
        a.release("exp", "other")
        assert b.claim("exp", "other") is True
        assert a.claim("exp", "third") is True
    with ResultStore(db) as c:  # closing a and b released their claims
        assert c.claim("exp", "other") is True and c.claim("exp", "third") is True
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    with sqlite3.connect(db) as conn:  # a claim of a search that was killed
        conn.execute("INSERT INTO claims VALUES ('exp', 'gone', ?, ?, 'x', 0)",
                     (os.uname().nodename, int(dead.stdout)))
    with ResultStore(db) as d:
        assert d.claim("exp", "gone") is True


def test_a_search_waits_for_a_layout_another_search_is_simulating(tmp_path: Path) -> None:
    """A layout another search holds is not simulated again: its result is taken from the
    database when that search stores it, and the outcome is the same."""
    import threading

    ref_db = tmp_path / "ref.sqlite"
    with ResultStore(ref_db) as store:
        ref = search(SMALL, pins=PINS_SMALL, top=2, prune=False, store=store)
    with sqlite3.connect(ref_db) as conn:
        fingerprint, key = conn.execute(
            "SELECT experiment, layout FROM results WHERE status = 'ok' ORDER BY layout"
        ).fetchone()
    with ResultStore(ref_db) as store:
        result = store.load(fingerprint)[key]
    db = tmp_path / "shared.sqlite"
    claimed = threading.Event()

    def other_search() -> None:  # holds the layout for a second, then stores its result
        with ResultStore(db) as other:
            assert other.claim(fingerprint, key) is True
            claimed.set()
            time.sleep(1.0)
            other.put(fingerprint, result)

    worker = threading.Thread(target=other_search)
    worker.start()
    assert claimed.wait(30)
    with ResultStore(db) as store:
        mine = search(SMALL, pins=PINS_SMALL, top=2, prune=False, store=store)
    worker.join()
    assert mine.resumed == 1 and mine.simulated == ref.simulated - 1
    assert [(r.layout.key, r.status, r.stats) for r in mine.rows] == [
        (r.layout.key, r.status, r.stats) for r in ref.rows]


def test_csv_has_every_layout_and_the_dimensions() -> None:
    result = _small(True)
    text = rows_csv(result.rows)
    lines = text.splitlines()
    assert len(lines) == 1 + result.enumerated
    header = lines[0].split(",")
    assert header[:3] == ["rank", "status", "key"] and all(d in header for d in DIMS)
    assert lines[1].startswith("1,ok,")


# ----------------------------------------------------------------------------- CLI


def _write(tmp_path: Path, data: dict, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_cli_json_out_csv_plot(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    exp = _write(tmp_path, SMALL)
    out = tmp_path / "out"
    argv = ["search", str(exp), "--json", "--top", "3", "--workers", "1", "--out", str(out),
            "--fix", "tp=1|2,pp=2|4,mbs=1|2,recompute=none,zero=1,sp=false"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert {"evaluated", "feasible", "elapsed_s", "best", "simulated", "resumed"} <= set(summary)
    best = summary["best"]
    assert set(best) >= {"parallel", "training", "schedule", "stats"}
    assert best["stats"]["step_time_s"] > 0 and "mfu" in best["stats"]
    assert summary["feasible"] >= 3 and len(summary["top"]) == 3
    for name in ("results.csv", "pareto.png", "search.json", "results.sqlite"):
        assert (out / name).is_file(), name
    # again with the same database: nothing is simulated twice
    assert main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["simulated"] == 0 and again["resumed"] == summary["simulated"]
    assert again["best"] == best


def test_cli_table(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    exp = _write(tmp_path, SMALL)
    assert main(["search", str(exp), "--top", "2", "--workers", "1", "--fix",
                 "pp=2,mbs=1,recompute=none,zero=1,tp=1"]) == 0
    text = capsys.readouterr().out
    assert "layouts evaluated" in text and "MFU %" in text
    assert text.count("\n1  tp1 pp2 dp8") == 1


@pytest.mark.parametrize(("argv", "needle"), [
    (["--fix", "tp=3"], "no layout of 16 GPUs divides correctly"),
    (["--fix", "tp"], "KEY=VALUE"),
    (["--top", "0"], "--top=0"),
    (["--workers", "0"], "--workers=0"),
    (["--ray-address", "auto"], "only used with --executor ray"),
    (["--gpus", "0"], "--gpus=0"),
])
def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                 argv: list[str], needle: str) -> None:
    exp = _write(tmp_path, SMALL)
    assert main(["search", str(exp), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and needle in err and err.count("\n") == 1


def test_cli_rejects_synthetic_models(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    exp = _write(tmp_path, {"model": {"synthetic": {"forward_ms": 1, "backward_ms": 2}},
                            "cluster": {"preset": "ideal", "num_gpus": 4},
                            "training": {"global_batch_size": 8}})
    assert main(["search", str(exp)]) == 2
    assert "transformer model" in capsys.readouterr().err


def test_pareto_plot_is_deterministic(tmp_path: Path) -> None:
    from plots.pareto import pareto_front, plot_pareto

    assert pareto_front([(1, 5), (2, 4), (2, 6), (3, 6), (0.5, 1)]) == [(0.5, 1), (1, 5), (2, 6)]
    rows = [r.as_dict() for r in _small(False).rows]
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    plot_pareto(rows, a, title="t", best_key=rows[0]["key"])
    plot_pareto(rows, b, title="t", best_key=rows[0]["key"])
    assert a.read_bytes() == b.read_bytes() and a.stat().st_size > 10_000
    plot_pareto([], tmp_path / "empty.svg")
    with pytest.raises(ValueError, match="suffix"):
        plot_pareto(rows, tmp_path / "x.gif")


# ----------------------------------------------------------------------------- killed sweeps

KILL_PINS = "pp=2|4,tp=1|2,recompute=none|full,zero=1,mbs=1|2,sp=false"
"""160 layouts, all simulated (``--exhaustive``): slow enough that a loaded machine's
polling cannot miss the sweep's middle (40 could all finish before the signal)."""


def default_sigint() -> None:
    """A ``preexec_fn``: Ctrl-C's default disposition in the child, whatever the test run's
    (a shell running the suite as a background job without job control ignores SIGINT, and
    an ignored signal stays ignored across exec, so ``sim search`` would never see it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(exp: Path, db: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "sim", "search", str(exp), "--db", str(db), "--json",
         "--workers", "1", "--exhaustive", "--fix", KILL_PINS],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_sigint)


def _db_keys(db: Path) -> set[str]:
    if not db.exists():
        return set()
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            return {k for (k,) in conn.execute("SELECT layout FROM results")}
    except sqlite3.OperationalError:  # the table is not created yet
        return set()


def _interrupt(proc: subprocess.Popen, db: Path, results: int, sig: signal.Signals) -> str:
    """Send ``sig`` once the database holds ``results`` results; returns stderr."""
    deadline = time.monotonic() + 60
    while len(_db_keys(db)) < results:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the sweep made no progress"
        time.sleep(0.02)
    proc.send_signal(sig)
    return proc.communicate(timeout=30)[1]


def test_a_killed_sweep_resumes_without_redoing_or_losing_work(tmp_path: Path) -> None:
    """Ctrl-C, then SIGKILL mid-sweep, then a full run: every stored result survives each
    interruption and is reused, and nothing is simulated twice."""
    exp = _write(tmp_path, SMALL)
    db = tmp_path / "results.sqlite"
    err = _interrupt(_start(exp, db), db, 3, signal.SIGINT)
    assert err.strip() == "error: interrupted"
    first = _db_keys(db)
    proc = _start(exp, db)
    _interrupt(proc, db, len(first) + 3, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    second = _db_keys(db)
    assert first < second  # nothing lost, more done
    proc = _start(exp, db)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    summary = json.loads(out)
    final = _db_keys(db)
    assert second <= final and summary["resumed"] == len(second)
    assert summary["simulated"] == len(final) - len(second)  # only what was missing ran
    counts = summary["counts"]
    assert len(final) == counts.get("ok", 0) + counts.get("oom", 0) == summary["enumerated"]
    reference = search(SMALL, pins=parse_pins([KILL_PINS]), top=1)
    assert summary["best"]["stats"] == reference.best.stats


# ----------------------------------------------------------------------------- Hagemann et al.

HAGEMANN_SPACE = ("tp=1|2|4|8,pp=1|2|4|8|16,mbs=1|2|4|8,recompute=none|full,schedule=1f1b,zero=1,"
                  "cp=1")
"""The measured layout space of Hagemann et al. 2023 (REFERENCES.md): 1F1B, ZeRO-1, TP up to
8, PP up to 16, micro-batch up to 8, every-layer checkpointing or none, SP on or off."""


def _hagemann(model: str, seq: int, gpus: int) -> dict:
    """One group of the sweep with the sweep framework's loss over gathered logits (the rest
    of its profile, ``training.framework: scaling``, makes micro-batch 2 win the 13B 2k-token
    group: TP1 PP2 mbs 2), and its 2-byte gradient buffer and bucket reductions (scaling's
    grad_buffer_bytes and grad_reduce_bytes): Megatron-LM's profile has them under fp16 only
    (its --bf16 forces fp32 gradients, which also make micro-batch 2 win that group)."""
    return {"name": f"{model}-{seq}-{gpus}",
            "model": {"preset": model, "seq_length": seq, "vocab_size": 128_000},
            "cluster": {"preset": "dgx-a100-80g", "num_gpus": gpus},
            "training": {"global_batch_size": 4_194_304 // seq, "attention": "flash2",
                         "fused_norm": True, "vocab_parallel_loss": False,
                         "precision": "fp16"}}


@cache
def _best(group: tuple[str, int, int], extra: str = "", framework: str | None = None
          ) -> tuple[Layout, float]:
    """(layout, tokens/s) of the best layout of a group in the paper's space (+ pins), with
    the stand-in profile or ``framework``."""
    exp = _hagemann(*group)
    if framework is not None:
        exp["training"]["framework"] = framework
    result = search(exp, pins=parse_pins([HAGEMANN_SPACE + extra]), top=1)
    assert result.best is not None
    return result.best.layout, result.best.figure("tokens_per_s")


G13_2K, G13_8K, G30_2K, G30_8K = (("llama-13b", 2048, 64), ("llama-13b", 8192, 64),
                                  ("llama-30b", 2048, 64), ("llama-30b", 8192, 64))
_MBS_XFAIL = pytest.mark.xfail(strict=True, reason=(
    "at 30B and 2k tokens the GEMM model (real M x K x N shapes, cube-side efficiency curve) "
    "still makes micro-batch 2 faster at TP >= 2, as the measurements also show at TP 2-8 "
    "(13B TP2 PP1: 63.1% vs 59.8% MFU): the search picks 30B TP2 PP2 mbs 2"))


# 13B at 2k tokens: with the vocabulary-parallel embedding's and head's TP collectives timed
# (wp-headtp) the search picks TP 1, DP 64, mbs 1 (148,465 tokens/s), no longer TP 2 PP 1
# mbs 4 (its pick before, 148,635 tokens/s then): the stand-in profile's per-micro-batch
# embedding-gradient add no longer tips it to a larger micro-batch


@pytest.mark.parametrize("group", [G13_2K, G13_8K,
                                   pytest.param(G30_2K, marks=_MBS_XFAIL), G30_8K])
def test_hagemann_micro_batch_1_wins(group: tuple[str, int, int]) -> None:
    layout, _ = _best(group)
    assert layout.micro_batch_size == 1, layout.key


@pytest.mark.parametrize("group", [G13_2K, G13_8K, G30_2K, G30_8K])
def test_hagemann_model_parallelism_beats_activation_checkpointing(
        group: tuple[str, int, int]) -> None:
    no_ckpt, tput = _best(group, ",recompute=none")
    ckpt, tput_ckpt = _best(group, ",recompute=full")
    assert tput > 1.1 * tput_ckpt, (no_ckpt.key, ckpt.key)
    assert no_ckpt.tp * no_ckpt.pp >= ckpt.tp * ckpt.pp  # it buys the memory with MP


def test_hagemann_sequence_parallelism_matters_only_for_large_models_and_long_sequences(
        ) -> None:
    """SP's gain (best with SP allowed over best without): below 3% for 13B and 30B at 2k
    tokens (measured: -0.3%, -0.8%), above 5% for 30B at 8k tokens (measured: +11%); 13B at
    8k tokens, the next test. With the sweep's own framework (``scaling``), whose sequence
    parallelism keeps the gathered input for the backward (``sp_saves_gathered_input``): the
    stand-in Megatron profile all-gathers it again beside the dgrad GEMM, whose compute NCCL's
    kernels now slow (sim.contention), a cost the measured stack did not have (30B 8k: +8.3%
    with scaling, +5.0% with the stand-in, +5.4% before the contention charge)."""
    gain = {g: _best(g, framework="scaling")[1] / _best(g, ",sp=false", "scaling")[1] - 1
            for g in (G13_2K, G30_2K, G30_8K)}
    assert max(gain[G13_2K], gain[G30_2K]) < 0.03, gain
    assert gain[G30_8K] > 0.05, gain


@pytest.mark.xfail(strict=True, reason=(
    "a missed OOM: with the 24% allocator overhead fitted by issue 19's criterion (fewest runs "
    "that ran flagged at >= 95% accuracy), 13B at 8k tokens on TP2 PP1 with SP is predicted at "
    "77.7 GiB of 79.3 and wins by 10.6%; the sweep's run ran out of memory (as did TP2 PP1 "
    "without SP), so the measured best is TP2 PP2 either way"))
def test_hagemann_sequence_parallelism_does_not_matter_for_13b_at_8k_tokens() -> None:
    """SP's gain for 13B at 8k tokens below 3% (measured: +0.03%)."""
    assert _best(G13_8K)[1] / _best(G13_8K, ",sp=false")[1] - 1 < 0.03


def test_a_relay_log_with_a_cap_sends_each_entry_a_bounded_number_of_times() -> None:
    """:class:`sim.search.execution._RelayLog` as the plans use it: an entry travels in at
    most ``cap`` items, and in none once every worker but its reporter holds it; without a
    cap (the timings), from the least up-to-date worker's point on, as before."""
    from sim.search.execution import _RelayLog

    log = _RelayLog(2, cap=3)
    log.take(((("a",), 1),), pid=10, upto=0)
    log.take((), pid=11, upto=0)
    assert [log.tail()[0] for _ in range(4)] == [((("a",), 1),)] * 3 + [()]
    log.take(((("b",), 2),), pid=10, upto=1)
    assert log.tail() == (((("b",), 2),), 2)
    log.take((), pid=11, upto=2)  # the other worker holds both: b is not sent again
    assert log.tail() == ((), 2)
    plain = _RelayLog(2)
    plain.take(((("a",), 1),), pid=10, upto=0)
    assert [plain.tail()[0] for _ in range(4)] == [((("a",), 1),)] * 4  # one worker reported
    plain.take((), pid=11, upto=1)
    assert plain.tail() == (((("a",), 1),), 1)  # its reporter has not said it holds it
    plain.take((), pid=10, upto=1)
    assert plain.tail() == ((), 1)
