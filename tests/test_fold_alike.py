"""The unnamed ops' fusions shared by a cost model's alike stages
(:func:`workloads.costs.fuse_alike`) equal :func:`~workloads.costs.fuse_compute`'s; the
collapsed fast path's folds shared by ops alike but for their labels and groups
(:func:`workloads.lowering.collapse.folded_alike`) equal a fold of their own
(:func:`workloads.lowering.collapse.fold`, the reference) in every field but the labels of
their runs of collectives (hypothesis: drawn segments with zeros of either sign, NaN and
fixed durations, relabelled copies timed on other groups with the same or other
collective times); ``tests/test_lowering_paths.py`` holds the whole program, named runs
included, to the reference op loop's."""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import combinations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_search_op_work import _costs
from workloads.costs import CommSeg, ComputeSeg, fuse_alike, fuse_compute
from workloads.lowering.collapse import (
    Block,
    Collapse,
    CommRun,
    Folded,
    fold,
    folded_alike,
    stream_use,
    work_key,
)
from workloads.schedules import BACKWARD, FORWARD, WEIGHT_GRAD, Op

NAN = math.nan
VALUES = [0.0, -0.0, 1e12, 2e12, 3.5e12, NAN]
BYTES = [0.0, -0.0, 1e6, 4e6, NAN]
DURATIONS = [None, None, None, 0.0, -0.0, 1e-3, 2.5e-4]


def _compute_s(seg: ComputeSeg) -> float:
    if seg.duration_s is not None:
        return seg.duration_s
    return seg.flops * 1e-15 + seg.hbm_bytes * 1e-12 + seg.elementwise_bytes * 1e-13


def _timer(times: dict) -> object:
    def collective_s(op: str, groups: tuple, nbytes: float) -> float:
        return times[(op, groups[0][0] if groups else -1)] * (1.0 + nbytes * 1e-9)
    return collective_s


@st.composite
def _segments(draw: st.DrawFn) -> list:
    out = []
    for _ in range(draw(st.integers(0, 12))):
        label = draw(st.sampled_from(["a", "b", "L1 qkv", ""]))
        if draw(st.booleans()):
            out.append(ComputeSeg(label, draw(st.sampled_from(VALUES)),
                                  draw(st.sampled_from(VALUES)), draw(st.sampled_from(DURATIONS)),
                                  draw(st.sampled_from(VALUES)), draw(st.sampled_from(VALUES)),
                                  draw(st.sampled_from([(), ((64.0, 1e12),)]))))
        else:
            out.append(CommSeg(label, draw(st.sampled_from(["tp", "tp", "pp"])),
                               draw(st.sampled_from(["all_reduce", "all_gather"])),
                               draw(st.sampled_from(BYTES)), "tp",
                               draw(st.sampled_from(DURATIONS))))
    return out


def _relabelled(segs: list, tag: str) -> tuple:
    return tuple(replace(seg, label=f"{tag} {seg.label}") for seg in segs)


def _unlabelled(folded: Folded) -> str:
    """``folded``'s fields, its cuts' included, as their repr (-0.0 and NaN show) with its
    runs' labels blanked."""
    def plain(part: object) -> object:
        if isinstance(part, Block):
            return part
        return tuple(replace(run, label="") for run in part)  # type: ignore[union-attr]

    runs = (folded.leading, folded.first_comm, folded.trailing)
    cuts = [tuple(map(plain, folded.split(at))) for n in range(len(folded.inner) + 1)
            for at in combinations(range(len(folded.inner)), n)]
    assert all(isinstance(run, CommRun) for part in runs for run in part)
    return repr((folded.whole, folded.head, folded.rest, [plain(r) for r in runs],
                 folded.inner, folded.inner_at, folded.inner_left, folded.trailing_s,
                 folded.has_comm, cuts))


@settings(max_examples=400, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(_segments(), st.sampled_from([1e-4, 0.0, -0.0, NAN]), st.booleans(), st.booleans(),
       st.booleans())
def test_alike_folds_equal_their_own(segs: list, t0: float, same_times: bool,
                                     same_timer: bool, shared: bool) -> None:
    """A fold found by another op's segments (its first relabelled, on other groups) equals
    the op's own fold but for its runs' labels, and its stream use equals the op's."""
    times = {("all_reduce", 0): t0, ("all_gather", 0): 2e-4, ("all_reduce", 8): t0,
             ("all_gather", 8): 2e-4 if same_times else 3e-4}
    collapse = Collapse(compute_s=_compute_s, collective_s=_timer(times))
    other = collapse if same_timer else Collapse(compute_s=_compute_s,
                                                 collective_s=_timer(times))
    memo: dict = {}
    first = _relabelled(segs, "x")
    # another op of the same segments but its first (its name), as a cost model's middle
    # stages are (fuse_alike), or of copies of them all (equal but for labels: no sharing)
    second = (_relabelled(segs[:1], "y") + first[1:] if shared
              else _relabelled(segs, "y"))
    g1, g2 = ((0, 1),), ((8, 9),)
    assert folded_alike(first, collapse, g1, memo)[1] == stream_use([first])
    folded, use = folded_alike(second, other, g2, memo)
    assert _unlabelled(folded) == _unlabelled(fold(second, other, g2))
    assert use == stream_use([second])
    again = folded_alike(second, other, g2, memo)  # (by identity now)
    assert again[0] is folded and again[1] == use


def test_alike_keys() -> None:
    """The key leaves the first segment's label out, holds the others by identity, tells
    apart what a fold reads (work, times, the compute timer) and declines zeros a fold
    passes on."""
    collapse = Collapse(compute_s=_compute_s, collective_s=lambda op, g, n: 1e-4 * (1 + g[0][0]))
    segs = (ComputeSeg("a", 1e12), CommSeg("b", "tp", "all_reduce", 1e6))
    alike = (ComputeSeg("c", 1e12), CommSeg("d", "tp", "all_reduce", 1e6))
    key = work_key(segs, collapse, ((0,),))
    alike = (alike[0], segs[1])  # another op: its own first segment, the others the same
    assert key is not None and key == work_key(alike, collapse, ((0,),))
    assert key != work_key((alike[0], CommSeg("d", "tp", "all_reduce", 1e6)), collapse,
                           ((0,),))  # equal but another object: not known alike
    assert key != work_key(alike, collapse, ((1,),))  # another collective time
    assert key != work_key((ComputeSeg("a", 2e12), segs[1]), collapse, ((0,),))
    assert key != work_key(segs, replace(collapse, compute_s=lambda s: 0.0), ((0,),))
    assert work_key((CommSeg("b", "tp", "all_reduce", -0.0),), collapse, ((0,),)) is None
    assert work_key((ComputeSeg("a", duration_s=0.0),), collapse, ((0,),)) is None
    zero = Collapse(compute_s=_compute_s, collective_s=lambda op, g, n: 0.0)
    assert work_key((CommSeg("b", "tp", "all_reduce", 1e6),), zero, ((0,),)) is None


_POOL = [ComputeSeg("c1", 1e12, 1e9), ComputeSeg("c2", 2e12, elementwise_bytes=3e9),
         ComputeSeg("c3", -0.0, duration_s=1e-3), ComputeSeg("c4", NAN, gemm_dims=((8.0, 1.0),)),
         CommSeg("ar", "tp", "all_reduce", 1e6), CommSeg("ag", "tp", "all_gather", 2e6)]


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from(range(len(_POOL))), max_size=10),
                          st.sampled_from(["0F0", "1F0", "c1", "2B0"])), max_size=6))
def test_fuse_alike_is_fuse_compute(calls: list) -> None:
    """Fusing op after op with the remembered fusions (:func:`~workloads.costs.fuse_alike`,
    segments shared between ops as a cost model's layers are) gives what
    :func:`~workloads.costs.fuse_compute` gives each, labels and types included."""
    memo: dict = {}
    for picks, name in calls:
        segs = [_POOL[k] for k in picks]
        assert repr(fuse_alike(list(segs), name, memo)) == repr(fuse_compute(list(segs), name))


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(costs=_costs())
def test_op_work_fused_alike_is_fused_alone(costs: object) -> None:
    """A cost model's unnamed ops, fused with the fusions of its other ops remembered,
    equal each op fused alone on a fresh copy of the model (labels included: the first
    segment carries its op's name)."""
    if costs is None:
        return
    ops = [(Op(stage, kind, 0), split) for stage in range(len(costs.stage_layers))
           for kind in (FORWARD, BACKWARD, WEIGHT_GRAD) for split in (False, True)]
    for markers in (False, True):  # with markers: what the budget counts
        for op, split in ops:
            assert (repr(costs.op_work(op, split, markers))
                    == repr(replace(costs).op_work(op, split, markers)))


def test_alike_ops_fold_once(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Two ops of the same segments but their first (named for its op), on groups whose
    collectives take the same time: one fold; equal but other objects: a fold each."""
    import workloads.lowering.collapse as collapse_module

    folds = []
    real = collapse_module.fold
    monkeypatch.setattr(collapse_module, "fold", lambda *a: folds.append(1) or real(*a))
    collapse = Collapse(compute_s=_compute_s, collective_s=lambda op, g, n: 1e-4)
    body = (CommSeg("", "tp", "all_reduce", 1e6), ComputeSeg("", 2e12))
    memo: dict = {}
    for name in ("1F0", "2F0", "3F0"):
        folded_alike((ComputeSeg(name, 1e12), *body), collapse, ((int(name[0]),),), memo)
    assert len(folds) == 1
    folded_alike((ComputeSeg("4F0", 1e12), *_relabelled(list(body), "z")), collapse,
                 ((4,),), memo)
    assert len(folds) == 2


_FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0]))


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.builds(ComputeSeg, st.text(max_size=4), _FLOATS, _FLOATS,
                 st.one_of(st.none(), _FLOATS), _FLOATS, _FLOATS,
                 st.lists(st.tuples(_FLOATS, _FLOATS), max_size=3).map(tuple)),
       st.text(max_size=4))
def test_relabeled_is_replace(seg: ComputeSeg, label: str) -> None:
    """:func:`workloads.costs.relabeled` makes what ``dataclasses.replace(seg, label=...)``
    makes: a ComputeSeg of the label and the very same field objects."""
    from dataclasses import fields

    from workloads.costs import relabeled

    names = ("label", "flops", "hbm_bytes", "duration_s", "attn_flops", "elementwise_bytes",
             "gemm_dims")
    # relabeled passes these to the constructor: a field added to ComputeSeg must be added
    # there too, and here
    assert tuple(f.name for f in fields(ComputeSeg)) == names
    got, want = relabeled(seg, label), replace(seg, label=label)
    assert type(got) is type(want) is ComputeSeg
    for name in names:
        a, b = getattr(got, name), getattr(want, name)
        assert a is b or (a == b and repr(a) == repr(b)), name
