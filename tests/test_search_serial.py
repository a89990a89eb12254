"""The parent's serial part of a search (enumeration to screening, screening to the sweep, the
rows): each fast path beside the plain reference it replaces, equal on random inputs."""

from __future__ import annotations

import gc
import math
from operator import attrgetter

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.search import Candidate, Evaluation, Layout
from sim.search.bounds import _work_key, family_group, family_of, group_of, state_family
from sim.search.execution import (
    _SCREEN_GROUP,
    _screen_group,
    candidates,
    screen_chunks,
)
from sim.search.layouts import RECOMPUTE
from sim.search.results import collect_rows, collect_rows_reference
from sim.search.sweep import best_first, young_generation

_layouts = st.builds(
    Layout, tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]),
    dp=st.sampled_from([1, 2, 16]), cp=st.sampled_from([1, 2]), ep=st.sampled_from([1, 2]),
    vpp=st.sampled_from([1, 2, 3]), sequence_parallel=st.booleans(),
    zero_stage=st.sampled_from([0, 1, 2, 3]), micro_batch_size=st.sampled_from([1, 2, 4]),
    recompute=st.sampled_from(RECOMPUTE),
    schedule=st.sampled_from(["1f1b", "gpipe", "interleaved", "zb-v"]),
    placement=st.sampled_from([None, "tp-cp-dp-pp", "tp-cp-pp-dp"]))
_bounds = st.one_of(st.none(), st.floats(allow_nan=True), st.sampled_from([0.0, 1.0, 2.0]))
_statuses = st.sampled_from(["ok", "memory", "invalid", "pruned"])


@st.composite
def _candidates(draw: st.DrawFn, max_size: int = 40) -> list[Candidate]:
    """Candidates of distinct layouts (as a search's are), bounds with ties, None and NaN."""
    layouts = draw(st.lists(_layouts, max_size=max_size, unique_by=attrgetter("key")))
    return [Candidate(lay, draw(_statuses), draw(st.sampled_from(["", "why"])),
                      draw(_bounds), draw(_bounds)) for lay in layouts]


@settings(max_examples=200, deadline=None)
@given(layout=_layouts)
def test_family_and_key_getters_equal_the_functions(layout: Layout) -> None:
    assert family_of(layout) == state_family(layout)
    assert group_of(layout) == family_group(state_family(layout))
    assert _SCREEN_GROUP(layout) == _screen_group(layout)
    assert _work_key(layout) == (layout.tp, layout.cp, layout.ep, layout.pp, layout.dp,
                                 layout.vpp, layout.schedule, layout.placement,
                                 layout.micro_batch_size, layout.sequence_parallel,
                                 layout.recompute)


@settings(max_examples=100, deadline=None)
@given(cands=_candidates())
def test_candidates_are_the_dataclass_s_own(cands: list[Candidate]) -> None:
    layouts = [c.layout for c in cands]
    verdicts = [(c.status, c.reason, c.memory_bound_gib, c.tokens_bound) for c in cands]
    fast = candidates(layouts, verdicts)
    reference = [Candidate(lay, *v) for lay, v in zip(layouts, verdicts, strict=True)]
    assert [list(c.__dict__.items()) for c in fast] == \
        [list(c.__dict__.items()) for c in reference]
    assert all(type(c) is Candidate for c in fast)


@settings(max_examples=300, deadline=None)
@given(cands=_candidates())
def test_best_first_is_the_sort_by_bound_then_key(cands: list[Candidate]) -> None:
    reference = sorted(cands, key=lambda c: (-(c.tokens_bound or 0.0), c.layout.key))
    got = best_first(list(cands))
    if any(c.tokens_bound is not None and math.isnan(c.tokens_bound) for c in cands):
        assert got == reference  # NaN: the fast path steps aside for the sort itself
    assert [c.layout.key for c in got] == [c.layout.key for c in reference]


@st.composite
def _sweeps(draw: st.DrawFn) -> tuple:
    """(candidates, results, judged, stopped keys) as a sweep leaves them: a row is ``ok``
    only with a result (the candidates' and the judged verdicts are not ``ok`` here)."""
    cands = [c if c.status != "ok" else Candidate(c.layout, "memory", c.reason,
                                                  c.memory_bound_gib, c.tokens_bound)
             for c in draw(_candidates())]
    keys = [c.layout.key for c in cands]
    picked = draw(st.lists(st.sampled_from(keys), unique=True)) if keys else []
    results, judged, pruned = {}, {}, set()
    for key in picked:
        c = next(c for c in cands if c.layout.key == key)
        what = draw(st.sampled_from(["result", "judged", "both", "pruned"]))
        if what in ("judged", "both"):
            judged[key] = Candidate(c.layout, draw(st.sampled_from(["memory", "invalid",
                                                                    "pruned"])), "judged",
                                    draw(_bounds),
                                    draw(_bounds))
        if what in ("result", "both"):
            tokens = draw(st.sampled_from([1.0, 2.0, None]))
            results[key] = Evaluation(key, draw(st.sampled_from(["ok", "oom", "error"])),
                                      {"tokens_per_s": tokens, "peak_memory_gib": 1.0},
                                      draw(st.sampled_from(["", "e"])), elapsed_s=0.5)
        if what == "pruned":
            pruned.add(key)
    return cands, results, judged, pruned


@settings(max_examples=200, deadline=None)
@given(sweep=_sweeps())
def test_rows_are_the_reference_s_field_for_field(sweep: tuple) -> None:
    fast = collect_rows(*sweep)
    reference = collect_rows_reference(*sweep)
    assert [list(r.__dict__.items()) for r in fast] == \
        [list(r.__dict__.items()) for r in reference]


def _screen_chunks_reference(layouts: list[Layout], workers: int) -> list[list[int]]:
    """:func:`screen_chunks` as it was, its groups found by comparing neighbours (the part
    the fast path changed; the chunks made of them by the same
    :func:`~sim.search.execution.chunks_of_groups`)."""
    from sim.search.execution import SCREEN_CHUNK_MIN, SCREEN_CHUNKS_PER_WORKER, chunks_of_groups

    n = len(layouts)
    if workers <= 1 or n == 0:
        return [list(range(n))] if n else []
    size = max(SCREEN_CHUNK_MIN, -(-n // (SCREEN_CHUNKS_PER_WORKER * workers)))
    keys = [_screen_group(lay) for lay in layouts]
    order = sorted(range(n), key=keys.__getitem__)
    groups = []
    start = 0
    for k in range(1, n + 1):
        if k == n or keys[order[k]] != keys[order[start]]:
            groups.append((start, k))
            start = k
    return chunks_of_groups(order, groups, size, workers)


@settings(max_examples=200, deadline=None)
@given(layouts=st.lists(_layouts, max_size=40), workers=st.integers(1, 4),
       copies=st.sampled_from([1, 2, 200]))
def test_screen_chunks_are_the_reference_s(layouts: list[Layout], workers: int,
                                           copies: int) -> None:
    """Groups larger than a chunk too (the layouts repeated: only their keys matter)."""
    layouts = layouts * copies
    assert screen_chunks(layouts, workers) == _screen_chunks_reference(layouts, workers)


def test_young_generation_is_restored() -> None:
    before = gc.get_threshold()
    with young_generation(12_345):
        assert gc.get_threshold() == (12_345, *before[1:])
    assert gc.get_threshold() == before
