"""Collapsed lowering: one representative GPU per pipeline rank, its ops folded.

Where every TP and DP replica runs the same program, only one GPU per pipeline rank
is simulated (DESIGN.md, "Large clusters"). Its ops' TP collectives between compute
segments fold into the compute op as blocking communication; every collective, send
and ring pass gets a duration timed on the real topology together with the copies
of the replicas it stands for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from topologies.placement import Placement
from workloads.costs import CommSeg, ComputeSeg, Segment
from workloads.lowering.groups import ALL_TO_ALL_ALGO, Groups, replica_coords
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
    trailing_s: float = 0.0
    """Their total time."""
    has_comm: bool = False
    """Whether the op has any collective."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "trailing_s", sum(run.duration_s for run in self.trailing))
        object.__setattr__(self, "has_comm",
                           bool(self.leading or self.trailing or self.head is not None))


def comm_runs(segs: Sequence[Segment], collapse: Collapse, groups: Groups,
              ep_groups: Groups = ()) -> tuple[CommRun, ...]:
    runs: list[CommRun] = []
    for seg in segs:
        assert isinstance(seg, CommSeg)
        t = collapse.collective_s(seg.op, ep_groups if seg.group == "ep" else groups,
                                  seg.nbytes)
        if runs and runs[-1].kind == seg.kind:
            prev = runs[-1]
            runs[-1] = CommRun(prev.kind, prev.op, f"{prev.label} + {seg.label}",
                                prev.nbytes + seg.nbytes, prev.duration_s + t)
        else:
            runs.append(CommRun(seg.kind, seg.op, seg.label, seg.nbytes, t))
    return tuple(runs)


def block(segs: Sequence[Segment], collapse: Collapse, groups: Groups,
          ep_groups: Groups = ()) -> Block:
    """``segs`` as one compute op: its compute time and the time of the collectives
    among them as blocking communication (of their kind if they have one, else ``tp``).
    With collectives of several kinds, its :attr:`Block.parts`: per kind, the collectives
    of that kind and the compute segments that precede them (the compute after the last
    collective goes with the last part)."""
    work = [seg for seg in segs if isinstance(seg, ComputeSeg)]
    comm = [seg for seg in segs if isinstance(seg, CommSeg)]
    kinds = list(dict.fromkeys(seg.kind for seg in comm))
    parts: tuple[Block, ...] = ()
    if len(kinds) > 1:
        by_kind: dict[str, list[Segment]] = {kind: [] for kind in kinds}
        waiting: list[Segment] = []
        for seg in segs:
            waiting.append(seg)
            if isinstance(seg, CommSeg):
                by_kind[seg.kind] += waiting
                waiting = []
        by_kind[comm[-1].kind] += waiting
        parts = tuple(block(by_kind[kind], collapse, groups, ep_groups) for kind in kinds)
    return Block(sum(collapse.compute_s(seg) for seg in work),
                 sum(collapse.collective_s(seg.op, ep_groups if seg.group == "ep" else groups,
                                           seg.nbytes) for seg in comm),
                 kinds[0] if len(kinds) == 1 else "tp",
                 sum(seg.flops for seg in work), sum(seg.attn_flops for seg in work), parts)


def fold(segs: tuple[Segment, ...], collapse: Collapse, groups: Groups,
         ep_groups: Groups = ()) -> Folded:
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
    ``ep_groups`` (the rank's EP groups).
    """
    eg = ep_groups
    compute_at = [i for i, seg in enumerate(segs) if isinstance(seg, ComputeSeg)]
    if not compute_at:  # no compute: one blocking fold
        return Folded((), block(segs, collapse, groups, eg), None, (), None, ())
    first, end = compute_at[0], compute_at[-1] + 1
    middle = segs[first:end]
    comm_at = [i for i, seg in enumerate(middle) if isinstance(seg, CommSeg)]
    head = first_comm = rest = None
    if comm_at:
        i = comm_at[0]
        j = next(k for k in range(i, len(middle)) if isinstance(middle[k], ComputeSeg))
        head = block(middle[:i], collapse, groups, eg)
        first_comm = comm_runs(middle[i:j], collapse, groups, eg)
        rest = block(middle[j:], collapse, groups, eg)
    return Folded(comm_runs(segs[:first], collapse, groups, eg),
                   block(middle, collapse, groups, eg), head, first_comm or (), rest,
                   comm_runs(segs[end:], collapse, groups, eg))


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
                deps: tuple[int, ...], alloc: float, free: float, pending_s: float) -> int:
    """Emit a folded op on GPU ``g``; returns the id of its last instruction.

    ``pending_s`` bounds how long after this op's compute starts an earlier
    op's closing collective may still occupy the collective stream. In the
    full lowering the op's first inner collective queues behind it on that
    stream; when it may (``pending_s`` exceeds the compute before that
    collective), the op is emitted split (compute, collective, rest) so the
    collapsed program waits the same way. Otherwise one compute op suffices.
    """
    if folded.leading:
        deps = emit_runs(b, g, op, op_name, folded.leading, deps)
    head, rest = folded.head, folded.rest
    if (head is not None and rest is not None and not folded.leading
            and pending_s > head.compute_s):
        first = emit_block(b, g, op, op_name, head, deps, alloc, 0.0)
        deps = emit_runs(b, g, op, op_name, folded.first_comm, (first,))
        last = emit_block(b, g, op, op_name, rest, deps, 0.0, free)
    else:
        last = emit_block(b, g, op, op_name, folded.whole, deps, alloc, free)
    if folded.trailing:
        return emit_runs(b, g, op, op_name, folded.trailing, (last,))[0]
    return last


def with_all_to_all(collapse: Collapse) -> Collapse:
    """``collapse`` timing all-to-alls with :data:`ALL_TO_ALL_ALGO`.

    The timer of :mod:`sim.commtime` is built for one algorithm (the default, ``auto``); a second
    instance of the same class on the same cluster times the all-to-alls. Timers
    of another shape are used as they are.
    """
    timer = collapse.collective_s
    cluster = getattr(timer, "cluster", None)
    if cluster is None:
        return collapse
    pairwise = type(timer)(cluster, algo=ALL_TO_ALL_ALGO)

    def timed(op: str, groups: Groups, nbytes: float) -> float:
        return (pairwise if op == "all_to_all" else timer)(op, groups, nbytes)

    return replace(collapse, collective_s=timed)


def pending_after(pending_s: float, folded: Folded) -> float:
    """How long the rank's last closing collective may still occupy the collective stream
    once ``folded`` is emitted (the ``pending_s`` of :func:`emit_folded` for the next op):
    its own closing collectives' time; 0 after any other collective (they queue in
    order); after pure compute, what was left less that compute's time."""
    if folded.trailing:
        return folded.trailing_s
    if folded.has_comm:
        return 0.0
    return max(0.0, pending_s - folded.whole.compute_s)


def replica_send_s(collapse: Collapse, placement: Placement,
                   cache: dict[tuple[int, int, float], float], src: int, dst: int,
                   nbytes: float) -> float:
    """Time of a pipeline message from rank ``src`` to rank ``dst`` (collapsed lowering):
    every (tp, cp, dp) replica's copy crosses at once, timed together on the topology;
    cached by ``(src, dst, nbytes)``."""
    key = (src, dst, nbytes)
    if key not in cache:
        pairs = tuple((placement.gpu(tp=u, cp=c, dp=e, pp=src),
                       placement.gpu(tp=u, cp=c, dp=e, pp=dst))
                      for c, e in replica_coords(placement)
                      for u in range(placement.degree("tp")))
        cache[key] = collapse.collective_s("send", pairs, nbytes)
    return cache[key]
