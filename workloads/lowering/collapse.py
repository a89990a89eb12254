"""Collapsed lowering: one representative GPU per pipeline rank, its ops folded.

Where every TP and DP replica runs the same program, only one GPU per pipeline rank
is simulated (DESIGN.md, "Large clusters"). Its ops' TP collectives between compute
segments fold into the compute op as blocking communication; every collective, send
and ring pass gets a duration timed on the real topology together with the copies
of the replicas it stands for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from itertools import accumulate
from operator import attrgetter

from topologies.placement import Placement
from workloads.costs import CommSeg, ComputeSeg, Segment
from workloads.lowering.groups import ALL_TO_ALL_ALGO, Groups, replica_offsets, replica_pairs
from workloads.program import ProgramBuilder
from workloads.schedules import Op


@dataclass(frozen=True)
class Collapse:
    """Timers for a collapsed lowering: one representative GPU per pipeline rank.

    In a symmetric layout every TP and DP replica runs the same program, so only
    the GPU of TP rank 0, DP rank 0 of each pipeline rank is simulated. The TP
    collectives between an op's compute segments are folded into one compute
    op as blocking communication; its leading and closing collectives, its DP
    collectives and its pipeline sends stay instructions with precomputed
    durations (:func:`fold`). All are timed on the real topology by
    ``collective_s`` together with the concurrent copies of the replicas they
    stand for (DESIGN.md, "Large clusters"), so where those copies are all the
    traffic there is, the collapsed step equals the full one
    (``tests/test_collapse.py``).
    """

    compute_s: Callable[[ComputeSeg], float]
    """Duration of a compute segment on the representative GPU."""
    collective_s: Callable[[str, tuple[tuple[int, ...], ...], float], float]
    """``collective_s(op, groups, nbytes)``: time of ``op`` run at once on every group."""
    compute_s_of: Callable[[int], Callable[[ComputeSeg], float]] | None = None
    """Mixed GPU types: ``compute_s_of(gpu)`` times segments on that GPU (every GPU of a
    pipeline rank is of one type); None: ``compute_s`` holds for every GPU."""
    skewed_s: Callable[[str, tuple[tuple[int, ...], ...], float, tuple[float, bool]],
                       float] | None = None
    """``skewed_s(op, groups, nbytes, skew)``: a dropless MoE all-to-all whose ranks move
    unequal volumes (:attr:`workloads.costs.CommSeg.skew`); None: ``collective_s``, every
    rank moving the busiest one's ``nbytes``."""

    def on(self, gpu: int) -> Collapse:
        """This collapse with compute timed on representative ``gpu``'s own GPU type."""
        if self.compute_s_of is None:
            return self
        return replace(self, compute_s=self.compute_s_of(gpu), compute_s_of=None)


@dataclass(frozen=True)
class CommRun:
    """Consecutive collectives of one kind, emitted as one instruction (collapsed lowering)."""

    kind: str
    op: str
    label: str
    nbytes: float
    duration_s: float


@dataclass(frozen=True)
class Block:
    """Compute segments and the collectives between them, as one compute op."""

    compute_s: float
    comm_s: float
    """Blocking communication: the collectives between the compute segments."""
    comm_kind: str
    """The kind of ``comm_s`` (``tp`` for a block without communication)."""
    flops: float
    attn_flops: float
    parts: tuple[Block, ...] = ()
    """Blocking communication of several kinds (MoE: TP collectives and EP all-to-alls):
    one single-kind block per kind, in order of first appearance, that together are this
    block (:func:`emit_block` emits them as a chain, so each kind's time is reported as
    that kind); empty for a single kind."""


@dataclass(frozen=True)
class Folded:
    """An op's segments as a collapsed lowering emits them (see :func:`fold`)."""

    leading: tuple[CommRun, ...]
    """Collectives before the first compute segment."""
    whole: Block
    """From the first compute segment to the last."""
    head: Block | None
    """Split form of ``whole`` (None without collectives inside): the compute before the
    first collective, ..."""
    first_comm: tuple[CommRun, ...]
    """... that collective (with any directly following it), ..."""
    rest: Block | None
    """... and the rest, from the next compute segment on."""
    trailing: tuple[CommRun, ...]
    """Collectives after the last compute segment."""
    inner: tuple[frozenset[str], ...] = ()
    """The kinds of each run of consecutive collectives between compute segments (the
    places :meth:`split` may cut), in order."""
    cut: Callable[[tuple[int, ...]], tuple[Block | tuple[CommRun, ...], ...]] | None = \
        field(default=None, compare=False, repr=False)
    """:meth:`split` beyond the first run of ``inner`` (None: ``inner`` has one run at most)."""
    inner_at: tuple[float, ...] = ()
    """When each run of ``inner`` starts, from the op's first compute segment on: the time of
    the compute segments and collectives before it (as in the full program, where nothing
    holds them back)."""
    inner_left: tuple[tuple[str, float], ...] = ()
    """Per kind of :attr:`inner`, how long before the end of the op's compute (its blocking
    communication included) its last collective there ends, as in the full program where
    nothing holds them back."""
    trailing_s: float = 0.0
    """Their total time."""
    has_comm: bool = False
    """Whether the op has any collective."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "trailing_s", sum(run.duration_s for run in self.trailing))
        object.__setattr__(self, "has_comm",
                           bool(self.leading or self.trailing or self.head is not None))

    def split(self, at: tuple[int, ...]) -> tuple[Block | tuple[CommRun, ...], ...]:
        """The compute cut at the runs of collectives ``at`` (ascending indices into
        :attr:`inner`): blocks and, between them, those runs as instructions; ``()`` gives
        ``(whole,)``, ``(0,)`` ``(head, first_comm, rest)``."""
        if not at:
            return (self.whole,)
        if at == (0,):
            assert self.head is not None and self.rest is not None
            return (self.head, self.first_comm, self.rest)
        assert self.cut is not None
        return self.cut(at)


def comm_s(seg: CommSeg, collapse: Collapse, groups: Groups, ep_groups: Groups = (),
           etp_groups: Groups = ()) -> float:
    """A collective's time: its fixed :attr:`CommSeg.duration_s` (TP communication overlap),
    else timed on every group of its kind at once (``ep_groups`` for an EP one,
    ``etp_groups`` for an expert-TP one), its unequal volumes timed by
    :attr:`Collapse.skewed_s` where there is one."""
    if seg.duration_s is not None:
        return seg.duration_s
    if seg.group == "etp":
        return collapse.collective_s(seg.op, etp_groups, seg.nbytes)
    if seg.group != "ep":
        return collapse.collective_s(seg.op, groups, seg.nbytes)
    if seg.skew[0] != 1.0 and collapse.skewed_s is not None:
        return collapse.skewed_s(seg.op, ep_groups, seg.nbytes, seg.skew)
    return collapse.collective_s(seg.op, ep_groups, seg.nbytes)


def seg_times(segs: Sequence[Segment], collapse: Collapse, groups: Groups,
              ep_groups: Groups = (), etp_groups: Groups = ()) -> list[float]:
    """Each segment's time: a compute segment's by ``collapse.compute_s``, a collective's by
    :func:`comm_s` (timed once per distinct collective: an op repeats a layer's few), any
    other 0.0 (:func:`block` and :func:`comm_runs` read none)."""
    timed: dict[tuple, float] = {}
    out = []
    for seg in segs:
        if isinstance(seg, ComputeSeg):
            out.append(collapse.compute_s(seg))
        elif isinstance(seg, CommSeg):
            key = (seg.duration_s, seg.group, seg.op, seg.nbytes, seg.skew)
            t = timed.get(key)
            if t is None:
                t = timed[key] = comm_s(seg, collapse, groups, ep_groups, etp_groups)
            out.append(t)
        else:
            out.append(0.0)
    return out


def comm_runs(segs: Sequence[Segment], collapse: Collapse, groups: Groups,
              ep_groups: Groups = (), etp_groups: Groups = ()) -> tuple[CommRun, ...]:
    """Consecutive collectives of one kind among ``segs`` (all collectives), one
    :class:`CommRun` each."""
    return _comm_runs(segs, seg_times(segs, collapse, groups, ep_groups, etp_groups))


def _comm_runs(segs: Sequence[Segment], times: Sequence[float]) -> tuple[CommRun, ...]:
    """:func:`comm_runs` with the segments' times given (:func:`seg_times`)."""
    runs: list[CommRun] = []
    for seg, t in zip(segs, times, strict=True):
        assert isinstance(seg, CommSeg)
        if runs and runs[-1].kind == seg.kind:
            prev = runs[-1]
            runs[-1] = CommRun(prev.kind, prev.op, f"{prev.label} + {seg.label}",
                                prev.nbytes + seg.nbytes, prev.duration_s + t)
        else:
            runs.append(CommRun(seg.kind, seg.op, seg.label, seg.nbytes, t))
    return tuple(runs)


def block(segs: Sequence[Segment], collapse: Collapse, groups: Groups,
          ep_groups: Groups = (), etp_groups: Groups = ()) -> Block:
    """``segs`` as one compute op: its compute time and the time of the collectives
    among them as blocking communication (of their kind if they have one, else ``tp``).
    With collectives of several kinds, its :attr:`Block.parts`: per kind, the collectives
    of that kind and the compute segments that precede them (the compute after the last
    collective goes with the last part)."""
    eg = (ep_groups, etp_groups)
    return _block(segs, seg_times(segs, collapse, groups, *eg), collapse, groups, *eg)


def _block(segs: Sequence[Segment], times: Sequence[float], collapse: Collapse,
           groups: Groups, ep_groups: Groups = (), etp_groups: Groups = ()) -> Block:
    """:func:`block` with the segments' times given (:func:`seg_times`): the same sums, in
    the same order."""
    work = [k for k, seg in enumerate(segs) if isinstance(seg, ComputeSeg)]
    comm = [k for k, seg in enumerate(segs) if isinstance(seg, CommSeg)]
    kinds = list(dict.fromkeys(segs[k].kind for k in comm))  # type: ignore[union-attr]
    parts: tuple[Block, ...] = ()
    if len(kinds) > 1:
        by_kind: dict[str, list[Segment]] = {kind: [] for kind in kinds}
        waiting: list[Segment] = []
        for seg in segs:
            waiting.append(seg)
            if isinstance(seg, CommSeg):
                by_kind[seg.kind] += waiting
                waiting = []
        by_kind[segs[comm[-1]].kind] += waiting  # type: ignore[union-attr]
        parts = tuple(block(by_kind[kind], collapse, groups, ep_groups, etp_groups)
                      for kind in kinds)
    return Block(sum([times[k] for k in work]), sum([times[k] for k in comm]),
                 kinds[0] if len(kinds) == 1 else "tp",
                 sum([segs[k].flops for k in work]),  # type: ignore[union-attr]
                 sum([segs[k].attn_flops for k in work]), parts)  # type: ignore[union-attr]


def fold(segs: tuple[Segment, ...], collapse: Collapse, groups: Groups,
         ep_groups: Groups = (), etp_groups: Groups = ()) -> Folded:
    """Fold an op's segments for the representative GPU of a collapsed lowering.

    The compute segments, with the TP collectives between them, become one
    compute op whose collectives are blocking communication: in the full
    lowering each of those collectives waits for the compute before it and
    the next compute waits for it. Collectives before the first compute
    segment (sequence parallelism's all-gather) and after the last (the
    closing all-reduce or reduce-scatter) stay separate instructions on their
    stream, as in the full lowering, where the next op's compute does not wait
    for this op's closing collective (only the op's consumers do). Every
    collective is timed with all ``groups`` (the TP groups of every DP
    replica of the pipeline rank) running it at once; MoE all-to-alls with all
    ``ep_groups`` (the rank's EP groups), expert-TP collectives with all ``etp_groups``.
    Where a stream must see one of the collectives between compute segments,
    :meth:`Folded.split` cuts the compute there (:func:`emit_folded`). Each segment is
    timed once (:func:`seg_times`), its time summed wherever it is folded.
    """
    eg = (ep_groups, etp_groups)
    times = seg_times(segs, collapse, groups, *eg)
    bounds = compute_bounds(segs)
    if bounds is None:  # no compute: one blocking fold
        return Folded((), _block(segs, times, collapse, groups, *eg), None, (), None, ())
    first, end = bounds
    middle, mid_t = segs[first:end], times[first:end]
    at = inner_runs(middle)
    head = first_comm = rest = None
    if at:
        i, j = at[0]
        head = _block(middle[:i], mid_t[:i], collapse, groups, *eg)
        first_comm = _comm_runs(middle[i:j], mid_t[i:j])
        rest = _block(middle[j:], mid_t[j:], collapse, groups, *eg)
    cut = None
    if len(at) > 1:
        @cache
        def cut(which: tuple[int, ...]) -> tuple[Block | tuple[CommRun, ...], ...]:
            out: list[Block | tuple[CommRun, ...]] = []
            start = 0
            for i, j in (at[w] for w in which):
                out += [_block(middle[start:i], mid_t[start:i], collapse, groups, *eg),
                        _comm_runs(middle[i:j], mid_t[i:j])]
                start = j
            return (*out, _block(middle[start:], mid_t[start:], collapse, groups, *eg))
    kinds = tuple(frozenset(seg.kind for seg in middle[i:j]) for i, j in at)
    elapsed = (0.0, *accumulate(mid_t))
    return Folded(_comm_runs(segs[:first], times[:first]),
                  _block(middle, mid_t, collapse, groups, *eg), head, first_comm or (), rest,
                  _comm_runs(segs[end:], times[end:]), kinds, cut,
                  tuple(elapsed[i] for i, _ in at),
                  tuple({seg.kind: elapsed[-1] - elapsed[k + 1] for k, seg in enumerate(middle)
                         if isinstance(seg, CommSeg)}.items()))


FOLD_CACHE = 4096
"""Folds :func:`folded_use` keeps in one memo (it starts over past this many)."""


def folded_use(segs: tuple[Segment, ...], collapse: Collapse, groups: Groups,
               memo: dict[tuple, tuple[tuple[Segment, ...], Folded, StreamUse]]
               ) -> tuple[Folded, StreamUse]:
    """:func:`fold` of ``segs`` with ``collapse`` on ``groups``, and :func:`stream_use` of
    them, remembered in ``memo`` (the collapsed fast path's,
    :func:`workloads.lowering.columnar.lower_collapsed`, passes the cost model's own, the
    one its op segments live in: :func:`workloads.lowering.opcosts.op_facts`).

    Both are pure in their arguments: a fold reads the segments, the timers of ``collapse``
    (compared by identity: :func:`sim.api.work_timer` and
    :meth:`sim.commtime.CollectiveTimer.shared` hand out one per device and cluster) and the
    groups. The segments are an interned cost model's (the same tuple for the same op, by
    :func:`workloads.transformer.interned`), so they are looked up by identity, the entry
    holding them (an id is not reused while they live). What it saves is the fold's Python
    work, ~70 us an op's (stage, kind) on GPT-3 175B: every layout of a search or a sweep
    that shares a rank's op segments, its TP groups and the device (another micro-batch
    count or schedule of the same layout, or the same layout again) folds them once.
    Kept on the cost model, the folds go with it when its cache lets it go: a fold of
    segments no kept cost model holds can never be asked for again (an equal cost model
    made afresh makes new segments), and a process-wide memo kept such dead folds, with
    the clusters their timers time on, until it started over (docs/status.md, worker
    memory). ``tests/test_lowering_paths.py`` holds its programs to the reference op
    loop's with the folds remembered."""
    key = (id(segs), collapse, groups)
    hit = memo.get(key)
    if hit is not None and hit[0] is segs:
        return hit[1], hit[2]
    folded, use = fold(segs, collapse, groups), stream_use([segs])
    if len(memo) >= FOLD_CACHE:
        memo.clear()
    memo[key] = (segs, folded, use)
    return folded, use


_COMPUTE_WORK = attrgetter("flops", "hbm_bytes", "duration_s", "attn_flops",
                           "elementwise_bytes", "gemm_dims")
_COMM_WORK = attrgetter("kind", "op", "nbytes", "group", "duration_s", "skew")


def work_key(segs: Sequence[Segment], collapse: Collapse, groups: Groups) -> tuple | None:
    """What :func:`fold` of ``segs`` with ``collapse`` on ``groups`` reads but the first
    segment's label, as a key: the compute timer (by identity), the first segment's type
    and other fields, the identities of the others (the caller keeps them alive while the
    key is kept: an id is not reused meanwhile), and each collective's time on ``groups``
    (:func:`comm_s`, once per distinct collective, as :func:`seg_times` times them). Equal
    for the unnamed ops of a cost model's middle stages on two pipeline ranks: the same
    segment objects but the first, which carries the op's name
    (:func:`workloads.costs.fuse_alike`), where their collectives take the same times (the
    collective timer's reuse across servers, :mod:`sim.commtime`). None where a key could
    tell apart what a fold treats differently: a segment other than a compute segment or a
    collective, or a value a fold passes on as it is (a fixed duration, a collective's bytes
    or time) that is zero (a key compares ``-0.0`` equal to ``0.0``; their folds could
    differ in the sign of a zero). A NaN equals only itself (the same object) in a key."""
    if not segs:
        return (collapse.compute_s,)
    out: list = [collapse.compute_s, tuple(map(id, segs[1:]))]
    add = out.append
    compute, comm = ComputeSeg, CommSeg
    timed: dict[tuple, float] = {}
    for n, seg in enumerate({id(seg): seg for seg in segs}.values()):
        kind = type(seg)
        if kind is compute:
            fields = _COMPUTE_WORK(seg)
            if fields[2] is not None and fields[2] == 0:
                return None
            if not n:
                add(kind)
                add(fields)
        elif kind is comm:
            fields = _COMM_WORK(seg)
            if fields[2] == 0 or fields[4] is not None and fields[4] == 0:
                return None
            t = timed.get(fields)
            if t is None:
                t = timed[fields] = comm_s(seg, collapse, groups)  # type: ignore[arg-type]
                if t == 0:
                    return None
            if not n:
                add(kind)
                add(fields)
            add(t)
        else:
            return None
    return tuple(out)


def folded_alike(segs: tuple[Segment, ...], collapse: Collapse, groups: Groups,
                 memo: dict[tuple, tuple]) -> tuple[Folded, StreamUse]:
    """:func:`folded_use`, shared by ops of the same segments but a first one equal but for
    its label, on groups where their collectives take the same times (:func:`work_key`):
    the fold of one serves the others but for the labels of its runs of collectives
    (:class:`CommRun`), which are the first one's. A fold reads no other label
    (:func:`seg_times` times a segment by its work, :func:`_block` sums times and FLOPs,
    :func:`stream_use` reads kinds) and reads the groups only through its collectives'
    times, so every other field is the fold of ``segs`` on ``groups``. For the collapsed
    fast path, which folds unnamed segments and names its runs from the named fold
    (:func:`workloads.lowering.columnar.lower_collapsed`): the middle stages' ops of a
    uniform model are alike, so a new cost model folds one of them, not each. In ``memo``
    beside :func:`folded_use`'s entries (keys of their own)."""
    hit = memo.get((id(segs), collapse, groups))
    if hit is not None and hit[0] is segs:
        return hit[1], hit[2]
    key = work_key(segs, collapse, groups)
    if key is None:
        return folded_use(segs, collapse, groups, memo)
    alike = ("alike", key)
    found = memo.get(alike)
    if found is None:
        folded, use = folded_use(segs, collapse, groups, memo)
        if len(memo) >= FOLD_CACHE:
            memo.clear()
        memo[alike] = (folded, use, segs)  # (holding the segments whose ids the key holds)
        return folded, use
    if len(memo) >= FOLD_CACHE:
        memo.clear()
    memo[(id(segs), collapse, groups)] = (segs, found[0], found[1])
    return found[0], found[1]


def compute_bounds(segs: Sequence[Segment]) -> tuple[int, int] | None:
    """Where an op's compute runs in ``segs``, from its first compute segment to past its
    last (None without any): what :func:`fold` folds into one compute op."""
    at = [i for i, seg in enumerate(segs) if isinstance(seg, ComputeSeg)]
    return (at[0], at[-1] + 1) if at else None


def inner_runs(middle: Sequence[Segment]) -> tuple[tuple[int, int], ...]:
    """The runs of consecutive collectives between compute segments of ``middle`` (which
    starts and ends with compute), as ``(start, end)`` indices."""
    out: list[tuple[int, int]] = []
    for i, seg in enumerate(middle):
        if isinstance(seg, CommSeg):
            if out and out[-1][1] == i:
                out[-1] = (out[-1][0], i + 1)
            else:
                out.append((i, i + 1))
    return tuple(out)


@dataclass(frozen=True)
class StreamUse:
    """How an op's collectives meet its communication streams, collapsed (the runs it is
    folded as, in order: :func:`stream_use`)."""

    leading: frozenset[str]
    """Kinds of the collectives before its first compute: instructions that wait for
    nothing of the op's, only on their stream for what was issued before them."""
    kinds: frozenset[str]
    """Kinds of all its collectives."""
    folded_last: frozenset[str]
    """Kinds whose last collective of the op is folded into its compute (between compute
    segments): in the full program that collective is the last one of the op on its
    stream, collapsed it is not on the stream at all."""


def stream_use(runs: Sequence[Sequence[Segment]]) -> StreamUse:
    """:class:`StreamUse` of an op that is folded as ``runs`` (one :func:`fold` each, or a
    ring attention alone). A run without compute segments is folded whole, with nothing to
    cut at: its collectives count as on their stream."""
    leading: frozenset[str] = frozenset()
    kinds: set[str] = set()
    folded_last: set[str] = set()
    for n, run in enumerate(runs):
        first, end = compute_bounds(run) or (0, 0)
        for i, seg in enumerate(run):
            if isinstance(seg, CommSeg):
                kinds.add(seg.kind)
                if first < i < end:
                    folded_last.add(seg.kind)
                else:
                    folded_last.discard(seg.kind)
        if n == 0:
            leading = frozenset(seg.kind for seg in run[:first] if isinstance(seg, CommSeg))
    return StreamUse(leading, frozenset(kinds), frozenset(folded_last))


def emit_runs(b: ProgramBuilder, g: int, op: Op, op_name: str, runs: tuple[CommRun, ...],
              deps: tuple[int, ...]) -> tuple[int, ...]:
    """Emit collective runs one after the other on GPU ``g``; the last one's id (or ``deps``)."""
    for run in runs:
        deps = (b.collective((g,), {g: deps}, kind=run.kind, name=f"{op_name} {run.label}",
                             op=run.op, nbytes=run.nbytes, stage=op.stage, mb=op.mb,
                             duration_s=run.duration_s)[g],)
    return deps


def emit_block(b: ProgramBuilder, g: int, op: Op, op_name: str, block: Block,
               deps: tuple[int, ...], alloc: float, free: float) -> int:
    """Emit ``block`` as one compute op of ``op`` on GPU ``g``, or, with several kinds of
    blocking communication, one such op per :attr:`Block.parts` in a chain (memory
    allocated by the first, freed by the last); the id of the last."""
    if block.parts:
        n = len(block.parts)
        for i, part in enumerate(block.parts):
            deps = (emit_block(b, g, op, op_name, part, deps, alloc if i == 0 else 0.0,
                               free if i == n - 1 else 0.0),)
        return deps[0]
    return b.compute(g, op.kind, op_name, deps, stage=op.stage, mb=op.mb,
                     duration_s=block.compute_s, flops=block.flops, attn_flops=block.attn_flops,
                     blocking_comm_s=block.comm_s, blocking_comm_kind=block.comm_kind,
                     alloc_bytes=alloc, free_bytes=free)


def emit_folded(b: ProgramBuilder, g: int, op: Op, op_name: str, folded: Folded,
                deps: tuple[int, ...], alloc: float, free: float, pending: Mapping[str, float],
                cut: frozenset[str] = frozenset(),
                parts: tuple[Block | tuple[CommRun, ...], ...] | None = None) -> int:
    """Emit a folded op on GPU ``g``; returns the id of its last instruction.

    ``pending``: per kind, how long after this op's compute starts an earlier op's
    closing collective may still occupy that kind's stream (:func:`pending_after`). In the
    full lowering the op's first collective of that kind queues behind it on the stream;
    when it may (:func:`first_cuts`), the compute is split there (compute, collective,
    rest) so the collapsed program waits the same way. Otherwise one compute op suffices.

    ``cut``: kinds whose last collective between compute segments a later op's leading
    collective must queue behind, as on the full program's stream (:func:`stream_cuts`):
    the compute is split there too, that collective an instruction on its stream. And it
    is split at the collectives of other kinds that start while the earlier op's closing
    collective may still run (:func:`window_cuts`), so that one overlaps the same compute.

    ``parts``: that split, worked out already (:func:`folded_plan`); None: worked out here.
    """
    if folded.leading:
        deps = emit_runs(b, g, op, op_name, folded.leading, deps)
    if parts is None:
        parts = folded_parts(folded, pending, cut)
    for n, part in enumerate(parts):
        if isinstance(part, Block):
            deps = (emit_block(b, g, op, op_name, part, deps, alloc if n == 0 else 0.0,
                               free if n == len(parts) - 1 else 0.0),)
        else:
            deps = emit_runs(b, g, op, op_name, part, deps)
    last = deps[0]
    if folded.trailing:
        return emit_runs(b, g, op, op_name, folded.trailing, (last,))[0]
    return last


def folded_parts(folded: Folded, pending: Mapping[str, float], cut: frozenset[str] = frozenset()
                 ) -> tuple[Block | tuple[CommRun, ...], ...]:
    """The compute of ``folded`` split as :func:`emit_folded` splits it after ``pending`` with
    ``cut`` (:func:`split_points` of :func:`first_cuts` and :func:`window_cuts`)."""
    return folded.split(split_points(folded, first_cuts(folded, pending), cut,
                                     window_cuts(folded, pending)))


PLAN_CACHE = 4096
"""Plans :func:`folded_plan` keeps in one memo (it starts over past this many)."""


def folded_plan(folded: Folded, pending: Mapping[str, float], cut: frozenset[str],
                closing: bool, memo: dict[tuple, tuple] | None
                ) -> tuple[tuple[Block | tuple[CommRun, ...], ...], dict[str, float]]:
    """(:func:`folded_parts` of ``folded`` after ``pending`` with ``cut``,
    :func:`pending_after` of them with ``closing``), remembered in ``memo`` (one lowering's):
    both are pure in their arguments, and an op loop asks for the same ones again and again
    (every micro-batch of a (stage, kind) meets its rank's streams as the one before it did).
    ``folded`` is looked up by identity, the entry holding it; ``pending`` by its items, in
    order (:func:`pending_after`'s result keeps that order). The pending mapping returned
    may be another op's: it is read, never changed, by the op loops. Without ``memo`` (the
    reference), both worked out afresh."""
    if memo is None:
        return folded_parts(folded, pending, cut), pending_after(pending, folded, closing)
    key = (id(folded), tuple(pending.items()), cut, closing)
    hit = memo.get(key)
    if hit is not None and hit[0] is folded:
        return hit[1], hit[2]
    parts = folded_parts(folded, pending, cut)
    after = pending_after(pending, folded, closing)
    if len(memo) >= PLAN_CACHE:
        memo.clear()
    memo[key] = (folded, parts, after)
    return parts, after


def first_cuts(folded: Folded, pending: Mapping[str, float]) -> frozenset[str]:
    """Kinds at whose first collective between compute segments :func:`emit_folded` splits
    ``folded``: those an earlier op's closing collective may still occupy (``pending``)
    longer than ``folded``'s leading collectives and compute take to reach it. A kind among
    the leading collectives needs no cut: they queue behind it on its stream, and the
    rest of the op after them."""
    leading = {run.kind for run in folded.leading}
    # the leading collectives may start before this op is issued (a negative pending:
    # :func:`pending_after`)
    early = min([0.0, *(left for kind, left in pending.items() if kind in leading)])
    leading_s = early + sum(run.duration_s for run in folded.leading)
    out: set[str] = set()
    for kind, left in pending.items():
        if left <= 0:
            continue
        w = next((w for w, kinds in enumerate(folded.inner) if kind in kinds), None)
        if kind in leading or w is None:
            continue
        before = folded.head if w == 0 else folded.split((w,))[0]
        assert isinstance(before, Block)
        if left - leading_s > before.compute_s:
            out.add(kind)
    return frozenset(out)


def window_cuts(folded: Folded, pending: Mapping[str, float]) -> frozenset[int]:
    """Runs of collectives between compute segments (indices into :attr:`Folded.inner`) of
    other kinds at which :func:`emit_folded` also splits ``folded``, so that an earlier op's
    closing collective still on its stream (``pending``) overlaps the same compute as in
    the full program: each run that starts before that collective may end and before the
    op's first collective of its kind (which queues behind it: :func:`first_cuts`). The
    compute starts after the op's leading collectives, which queue behind the pending ones
    of their kinds (an op that leads with a TP all-gather starts after the closing TP
    collective and whatever closed the op before it).

    Folded, a block runs all of its compute first and its blocking communication after
    it; in the full program the compute stops at each collective. A closing TP all-reduce
    beside an op whose compute waits for an EP all-to-all early on (MoE) is exposed while
    the all-to-all runs: unsplit, the folded op would hide it behind compute that in the
    full program comes later (and the TP exposure would differ). An op whose collectives
    are all of the pending kind (the dense layers' TP) has no such run: only
    :func:`first_cuts` applies."""
    leading = {run.kind for run in folded.leading}
    # the compute starts after the leading collectives, each queued behind its kind's
    # pending one; they may start before this op is issued where the earlier op's last
    # collective of their kind was folded and ended before its compute (a negative
    # pending: :func:`pending_after`)
    early = min([0.0, *(left for kind, left in pending.items() if kind in leading)])
    start_s = max([early + sum(run.duration_s for run in folded.leading),
                   *(left for kind, left in pending.items() if kind in leading)])
    out: set[int] = set()
    for kind, left in pending.items():
        if left <= 0:
            continue
        end = next((w for w, kinds in enumerate(folded.inner) if kind in kinds),
                   len(folded.inner))
        out.update(w for w in range(end) if folded.inner_at[w] < left - start_s)
    return frozenset(out)


def split_points(folded: Folded, first: frozenset[str], cut: frozenset[str],
                 window: frozenset[int] = frozenset()) -> tuple[int, ...]:
    """Where :func:`emit_folded` splits ``folded``'s compute (the ``at`` of
    :meth:`Folded.split`): at the first run of collectives holding each kind of ``first``
    (:func:`first_cuts`), at the last run holding each kind of ``cut`` and every run after
    it, and at the runs ``window`` (:func:`window_cuts`).

    A kind of ``cut`` is one a later op leads with, not waiting for this op
    (:func:`stream_cuts`): in the full program that leading collective starts once this
    op's last collective of its kind ends, and runs beside the rest of this op, whose
    compute stops at each collective of another kind (a MoE layer's EP all-to-alls after
    its last TP collective). Folded, the rest would run all of its compute before its
    blocking communication, and the leading collective would overlap compute that in the
    full program comes later (a different exposure of its kind): so the rest is split at
    each of its runs too."""
    n = len(folded.inner)
    at = {w for kind in cut
          for w in range(max(w for w, kinds in enumerate(folded.inner) if kind in kinds), n)}
    at |= {min(w for w, kinds in enumerate(folded.inner) if kind in kinds) for kind in first}
    return tuple(sorted(at | window))


def stream_cuts(ops: Sequence[tuple[int, int, StreamUse, int]]) -> dict[int, frozenset[str]]:
    """Where collapsed ops must cut their compute at their last folded collective of a kind
    (the ``cut`` of :func:`emit_folded`), by position.

    ``ops``: per op in lowering order, its position, its pipeline rank, its
    :class:`StreamUse` and the latest position among its producers on that rank (-1 for
    none). In the full program a stream runs its collectives in issue order, so an op's
    leading collective (sequence parallelism's all-gather) starts no earlier than the
    end of the rank's previous collective of its kind. Collapsed, where that previous one
    was folded into an earlier op's compute, nothing holds the leading collective back:
    it may start while that compute still runs (DualPipe's fused F&B, where the second op
    does not wait for the first). Unless the op waits for that earlier op (or a later
    one of the rank, which computes after it) anyway, the earlier op is cut there.
    """
    out: dict[int, set[str]] = {}
    folded_at: dict[tuple[int, str], int] = {}  # (rank, kind): the op whose last it folds
    for k, r, use, latest in ops:
        for kind in use.leading:
            before = folded_at.get((r, kind))
            if before is not None and latest < before:
                out.setdefault(before, set()).add(kind)
        for kind in use.kinds:
            if kind in use.folded_last:
                folded_at[(r, kind)] = k
            else:
                folded_at.pop((r, kind), None)
    return {k: frozenset(kinds) for k, kinds in out.items()}


def with_all_to_all(collapse: Collapse) -> Collapse:
    """``collapse`` timing all-to-alls with :data:`ALL_TO_ALL_ALGO` (unequal volumes by a
    timer per skew, :attr:`Collapse.skewed_s`).

    The timer of :mod:`sim.commtime` is built for one algorithm (the default, ``auto``); a second
    instance of the same class on the same cluster times the all-to-alls. Timers
    of another shape are used as they are.
    """
    timer = collapse.collective_s
    cluster = getattr(timer, "cluster", None)
    if cluster is None:
        return collapse
    pairwise = type(timer)(cluster, algo=ALL_TO_ALL_ALGO)
    skewed: dict[tuple[float, bool], object] = {}

    def timed(op: str, groups: Groups, nbytes: float) -> float:
        return (pairwise if op == "all_to_all" else timer)(op, groups, nbytes)

    def timed_skew(op: str, groups: Groups, nbytes: float, skew: tuple[float, bool]) -> float:
        one = skewed.get(skew)
        if one is None:
            one = skewed[skew] = type(timer)(cluster, algo=ALL_TO_ALL_ALGO, skew=skew)
        return one(op, groups, nbytes)  # type: ignore[operator]

    return replace(collapse, collective_s=timed, skewed_s=timed_skew)


def pending_after(pending: Mapping[str, float], folded: Folded, closing: bool = True
                  ) -> dict[str, float]:
    """Per kind, how long the rank's last closing collective of that kind may still occupy
    its stream once ``folded`` is emitted (the ``pending`` of :func:`emit_folded` for the
    next op): for a kind among its closing collectives, their time up to the end of its
    last (none unless ``closing``: the rest of the op waits for them); none for another
    kind it has (they queue in order); for a kind it lacks, what was left less its
    compute time. For a kind whose last collective of the op is folded between its compute
    segments, how long before the op's end it ended, negative (:func:`window_cuts`: a
    later op's leading collective of that kind may start then)."""
    kinds = {run.kind for run in (*folded.leading, *folded.trailing)}.union(*folded.inner)
    out = {kind: left - folded.whole.compute_s for kind, left in pending.items()
           if kind not in kinds and left > folded.whole.compute_s}
    trailing = {run.kind for run in folded.trailing}
    for kind, before in folded.inner_left:
        if kind not in trailing and before > 0:
            out[kind] = -before
    if closing:
        end = 0.0
        for run in folded.trailing:
            end += run.duration_s
            out[run.kind] = end
    return out


def replica_send_s(collapse: Collapse, placement: Placement,
                   cache: dict[tuple[int, int, float], float], src: int, dst: int,
                   nbytes: float) -> float:
    """Time of a pipeline message from rank ``src`` to rank ``dst`` (collapsed lowering):
    every (tp, cp, dp) replica's copy crosses at once, timed together on the topology;
    cached by ``(src, dst, nbytes)``. Where the collective timer times pairs by their
    offsets (:meth:`sim.commtime.CollectiveTimer.offset_pairs_s`: the same float, without
    building and hashing the pairs where another rank pair's timing carries over), by
    those: each pair is the two ranks' first GPUs plus the replica's offset
    (:func:`~workloads.lowering.groups.replica_pairs`)."""
    key = (src, dst, nbytes)
    if key not in cache:
        by_offsets = getattr(collapse.collective_s, "offset_pairs_s", None)
        cache[key] = (collapse.collective_s("send", replica_pairs(placement, src, dst), nbytes)
                      if by_offsets is None else
                      by_offsets("send", replica_offsets(placement), placement.gpu(pp=src),
                                 placement.gpu(pp=dst), nbytes,
                                 lambda: replica_pairs(placement, src, dst)))
    return cache[key]
