"""Execution on workers: the work items of a sweep, the worker that answers them, and
screening in chunks spread over an executor (:mod:`sim.executors`)."""

from __future__ import annotations

import hashlib
import itertools
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from base.collector import gc_paused
from base.errors import SimError
from sim.commtime import CollectiveTimer
from sim.device import DeviceProfile
from sim.executors import Executor, Feed, Task, WorkerFailure, is_indexed
from sim.search.bounds import StateTerms, family_group, family_of, state_family
from sim.search.evaluation import Evaluation, Evaluator
from sim.search.layouts import Layout
from sim.search.screening import Candidate, Screener
from sim.search.space import SearchContext, enumerate_layouts


@dataclass(frozen=True)
class ScreenChunk:
    """Work item: screen these layouts (:meth:`Screener.screen`).

    Layouts travel as indices into the search's space (:attr:`SearchWorker.layouts`: the
    enumeration the worker inherited or repeats), and the verdicts come back as
    ``(status, reason, memory_bound_gib, tokens_bound)`` tuples (:func:`_compact`): the
    caller has the layouts already."""

    indices: tuple[int, ...]
    space: str
    """:func:`space_digest` of the caller's layouts (a worker that enumerates them again
    checks that its list is the same)."""
    states: tuple[tuple[tuple[Any, ...], StateTerms], ...] = ()
    """The state terms of the families of these layouts, computed beforehand by
    :class:`FamilyChunk` items (none: the worker computes what it needs)."""


@dataclass(frozen=True)
class FamilyChunk:
    """Work item: the model-state terms of these families (:meth:`Screener.state_terms`),
    one layout of each, as :meth:`Layout.values` tuples; answered in order (None for a
    family whose cost model cannot be built)."""

    layouts: tuple[tuple[Any, ...], ...]


@dataclass(frozen=True)
class JudgeChunk:
    """Work item: judge these candidates (:meth:`Screener.judge`, no threshold)."""

    candidates: tuple[Candidate, ...]
    indices: tuple[int, ...] = ()
    """Where the candidates are in the sweep's order (for the sweep; workers ignore it)."""


@dataclass(frozen=True)
class SimulateOne:
    """Work item: simulate this layout (the evaluator)."""

    layout: Layout


@dataclass(frozen=True)
class Relayed:
    """An item or an answer with collective timings and plans attached (:class:`TimingRelay`).

    To a worker: ``item``, the timings other workers reported that this one may lack
    (``timings``), and ``upto``, the length of the relay's log once this worker has
    them; likewise the plans judging built (``plans``, ``plans_upto``). From a worker:
    its answer (``item``), the timings and plans it made for it, its process id and how
    much of each log it holds."""

    item: Any
    timings: tuple[tuple[tuple, float], ...] = ()
    upto: int = 0
    pid: int = 0
    plans: tuple[tuple[tuple, Any], ...] = ()
    plans_upto: int = 0


class _RelayLog:
    """One log of a :class:`TimingRelay`: ``(key, value)`` entries in the order they came
    in (each key once, with the worker that reported it), and how much of it each worker
    holds.

    ``cap`` (None: no limit): an entry travels in at most this many items, and not once
    every worker other than its reporter holds it (what :meth:`tail` then leaves out is
    only work a worker may repeat: every entry is a pure function of its key)."""

    def __init__(self, workers: int, cap: int | None = None) -> None:
        self.workers, self.cap = workers, cap
        self.log: list[tuple[tuple, Any]] = []
        self._known: set[tuple] = set()
        self._seen: dict[int, int] = {}
        """Worker process id -> log entries it holds (the latest ``workers`` reporters)."""
        self._by: list[int] = []
        """Per entry: the process id that reported it."""
        self._sends: list[int] = []
        """Per entry: the items it travelled in (counted where ``cap`` is set)."""
        self.sent = 0
        """Entries handed out in all."""

    def tail(self) -> tuple[tuple[tuple[tuple, Any], ...], int]:
        """(The entries the worker that holds least of the log may lack, the log's length.)"""
        seen, log = self._seen, self.log
        start = min(seen.values()) if len(seen) >= self.workers else 0
        if self.cap is None:
            out = tuple(log[start:])
        else:
            cap, by, sends, full = self.cap, self._by, self._sends, len(seen) >= self.workers
            picked = []
            for i in range(start, len(log)):
                if sends[i] >= cap or full and all(
                        p == by[i] or upto > i for p, upto in seen.items()):
                    continue
                sends[i] += 1
                picked.append(log[i])
            out = tuple(picked)
        self.sent += len(out)
        return out, len(log)

    def take(self, entries: tuple[tuple[tuple, Any], ...], pid: int, upto: int) -> None:
        known, log = self._known, self.log
        for entry in entries:
            if entry[0] not in known:
                known.add(entry[0])
                log.append(entry)
                self._by.append(pid)
                self._sends.append(0)
        seen = self._seen
        seen.pop(pid, None)
        seen[pid] = upto
        while len(seen) > self.workers:  # a worker replaced after a pool break
            del seen[next(iter(seen))]


PLAN_SENDS = 2
"""A plan travels in at most this many items per worker (:class:`TimingRelay`)."""


class TimingRelay(Executor):
    """``executor`` with each worker's new collective timings and judging's plans handed
    to the others.

    Every worker of a search times collectives on its own copy of the cluster's shared
    timer (:meth:`sim.commtime.CollectiveTimer.shared`); without this, a timing one
    worker computed is computed again by another that needs it (the sends between stages
    and the DP groups that several layouts' simulations and bounds share). Answers
    come back with the timings their worker computed (:class:`Relayed`); the relay
    logs them, and each item it sends carries the part of the log that the worker
    which has absorbed least of it lacks (it cannot know which worker takes the
    item; a worker past that point skips what it has). A timing is a pure function
    of its key and the cluster (:meth:`~sim.commtime.CollectiveTimer.adopt`), so
    answers are the same floats with or without the relay, whoever times what.

    The plans judging builds travel the same way, in a log of their own, without their
    schedules (:meth:`~sim.search.bounds.Bounds.plans_since`, :meth:`~sim.search.bounds.
    Bounds.adopt_plans`: a plan is a pure function of its key and the search's context;
    the candidates of one schedule lie all along the sweep's order, so both workers
    judge nearly every schedule's)."""

    def __init__(self, executor: Executor) -> None:
        self.inner = executor
        self.name = executor.name
        self.workers = executor.workers
        self.timings = _RelayLog(executor.workers)
        self.plans = _RelayLog(executor.workers, PLAN_SENDS * executor.workers)

    @property
    def log(self) -> list[tuple[tuple, float]]:
        """The timings logged so far."""
        return self.timings.log

    def _wrap(self, item: Any) -> Relayed:
        timings, upto = self.timings.tail()
        plans, plans_upto = self.plans.tail()
        return Relayed(item, timings, upto, 0, plans, plans_upto)

    def _take(self, answer: Any) -> Any:
        if not isinstance(answer, Relayed):
            return answer  # a lost worker (WorkerFailure)
        self.timings.take(answer.timings, answer.pid, answer.upto)
        self.plans.take(answer.plans, answer.pid, answer.plans_upto)
        return answer.item

    def stream(self, task: Task, feed: Feed) -> Iterator[tuple[Any, Any]]:
        indexed = is_indexed(task)

        def wrapped() -> Any:
            item = feed()
            if item is None:
                return None
            return (item[0], self._wrap(item[1])) if indexed else self._wrap(item)

        for item, outcome in self.inner.stream(task, wrapped):
            original = (item[0], item[1].item) if indexed else item.item
            yield original, self._take(outcome)

    def worker_cpu_each(self) -> list[float] | None:
        return self.inner.worker_cpu_each()


@dataclass(frozen=True)
class WorkerSpec:
    """What a :class:`SearchWorker` needs to rebuild the sweep's context (picklable)."""

    data: dict[str, Any]
    base_dir: str | None
    global_batch_size: int
    fidelity: str
    profile: DeviceProfile | None
    """The device profile (None: each GPU type's default, on a mixed cluster)."""
    comm: bool
    """Time collectives in the step bounds (:class:`Screener`)."""
    unsupported: tuple[tuple[str, str], ...]
    schedule_vpps: tuple[tuple[str, tuple[int, ...]], ...]
    """In the context's (probe) order, which enumeration follows."""
    evaluator: Callable[..., Callable[[Layout], Evaluation]] = Evaluator
    """The simulation factory, called as ``evaluator(data, global_batch_size, fidelity,
    profile, base_dir)``."""
    pins: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    """The search's pins: the space is ``enumerate_layouts(context, pins)``."""
    space: str | None = None
    """The token of the space the caller shared (:func:`shared_space`), if any."""


_SPACES: dict[str, tuple[SearchContext, Sequence[Layout]]] = {}
"""Search spaces shared with this process's workers: token -> (context, layouts). A worker
forked inside :func:`shared_space` finds its search's entry here (a copy of the parent's);
one started otherwise (a fork server, spawn, Ray) does not, and enumerates the space."""
_TOKENS = itertools.count()


def space_digest(layouts: Sequence[Layout]) -> str:
    """A digest of the layout keys in order: two lists with the same digest are the same
    space, so the same indices name the same layouts."""
    return hashlib.sha1("\n".join(map(_KEY, layouts)).encode()).hexdigest()


@contextmanager
def shared_space(ctx: SearchContext, layouts: Sequence[Layout]) -> Iterator[str]:
    """``with shared_space(ctx, layouts) as token``: a search's context and enumerated
    layouts, available to workers in this process and to those forked from it inside the
    block (a fork copies :data:`_SPACES`); ``token`` is what a :class:`WorkerSpec` carries."""
    token = f"{os.getpid()}.{next(_TOKENS)}"
    _SPACES[token] = (ctx, layouts)
    try:
        yield token
    finally:
        del _SPACES[token]


class SearchWorker:
    """The callable every worker of a sweep builds once: it screens chunks of layouts, judges
    chunks of candidates and simulates layouts, keeping the screener's caches (collective
    times, op times, schedules) and the evaluator's cluster for the worker's lifetime.

    Its context and layouts are the caller's where it shared them (:func:`shared_space`:
    a worker forked after it inherits them), else rebuilt from the :class:`WorkerSpec`;
    the screener and the evaluator are built on first use. Every answer is a pure
    function of the item, so it is the same in whichever worker computes it.
    """

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self._ctx: SearchContext | None = None
        self._layouts: Sequence[Layout] | None = None
        self._digest: str | None = None
        self._screener: Screener | None = None
        self._evaluate: Callable[[Layout], Evaluation] | None = None
        self._absorbed = 0
        """Entries of a :class:`TimingRelay`'s log of timings this worker holds."""
        self._plans_absorbed = 0
        """...and of its log of plans."""

    def _shared(self) -> tuple[SearchContext, Sequence[Layout]] | None:
        return _SPACES.get(self.spec.space or "")

    @property
    def context(self) -> SearchContext:
        """The search's context: the one the caller shared, else rebuilt from the spec
        without probing the simulator again (the probe results travel in the spec)."""
        if self._ctx is None:
            shared, sp = self._shared(), self.spec
            self._ctx = shared[0] if shared else SearchContext.build(
                sp.data, sp.base_dir, probed=(dict(sp.unsupported), dict(sp.schedule_vpps)))
        return self._ctx

    @property
    def layouts(self) -> Sequence[Layout]:
        """The search's space, which :class:`ScreenChunk` indices point into: the caller's
        list when shared (same process, or inherited by a fork), else enumerated again
        (deterministic: the same context and pins give the same list)."""
        if self._layouts is None:
            shared = self._shared()
            self._layouts = shared[1] if shared else list(
                enumerate_layouts(self.context, dict(self.spec.pins)))
        return self._layouts

    @property
    def digest(self) -> str:
        """:func:`space_digest` of :attr:`layouts`, computed once."""
        if self._digest is None:
            self._digest = space_digest(self.layouts)
        return self._digest

    @property
    def screener(self) -> Screener:
        """The worker's screener, built on first use from the spec."""
        if self._screener is None:
            sp = self.spec
            self._screener = Screener(self.context, sp.profile, comm=sp.comm,
                                      collapsed_only=sp.fidelity == "collapsed")
        return self._screener

    def __call__(self, item: Relayed | ScreenChunk | FamilyChunk | JudgeChunk | SimulateOne
                 ) -> Any:
        if isinstance(item, Relayed):  # from a TimingRelay: take the timings and plans,
            timer = CollectiveTimer.shared(self.context.cluster)  # report ours
            timer.adopt(item.timings)
            self._absorbed = max(self._absorbed, item.upto)
            if item.plans:
                self.screener.adopt_plans(item.plans)
            self._plans_absorbed = max(self._plans_absorbed, item.plans_upto)
            start = timer.size
            built = self._screener.plans_built if self._screener is not None else 0
            answer = self(item.item)
            plans = self._screener.plans_since(built) if self._screener is not None else ()
            return Relayed(answer, timer.timings_since(start), self._absorbed, os.getpid(),
                           plans, self._plans_absorbed)
        if isinstance(item, ScreenChunk):
            layouts = self.layouts
            if self._shared() is None and self.digest != item.space:
                raise SimError("screening: this worker enumerated other layouts than the "
                               "search's (the WorkerSpec does not describe its space)")
            self.screener.adopt_state_terms(item.states)
            screen = self.screener.screen
            return [_compact(screen(layouts[i])) for i in item.indices]
        if isinstance(item, FamilyChunk):
            return [self.screener.state_terms(Layout(*values)) for values in item.layouts]
        if isinstance(item, JudgeChunk):
            return [self.screener.judge(c) for c in item.candidates]
        if self._evaluate is None:
            sp = self.spec
            self._evaluate = sp.evaluator(sp.data, sp.global_batch_size, sp.fidelity,
                                          sp.profile, sp.base_dir)
        return self._evaluate(item.layout)


SCREEN_CHUNKS_PER_WORKER = 8
"""Screening is split into about this many chunks per worker (load balance against cache
reuse: see :func:`screen_chunks`)."""
SCREEN_CHUNK_MIN = 256
SCREEN_TAIL_PIECES = 4
"""The ``workers`` screening chunks handed out last are split into this many pieces."""
SCREEN_TAIL_MIN = 64
"""...of at least this many layouts."""


class LocalFallback:
    """A :class:`SearchWorker` in this process, built only if a worker is lost mid-chunk."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self._worker: SearchWorker | None = None

    def __call__(self, item: Any) -> Any:
        if self._worker is None:
            self._worker = SearchWorker(self.spec)
        return self._worker(item)


def screen_all(layouts: Sequence[Layout], executor: Executor, task: Task,
                local: Callable[[Any], Any], families: bool = False) -> list[Candidate]:
    """Screen every layout, in chunks spread over the executor's workers; the candidates
    come back in the order of ``layouts`` whatever ran them. A chunk whose worker was lost
    is screened here. ``layouts`` must be the space of ``task``'s :class:`WorkerSpec`
    (the chunks carry indices into it).

    ``families`` (screening by family, :func:`~sim.search.bounds.screens_by_family`) and
    more than one worker: the state terms of every family
    (:func:`~sim.search.bounds.state_family`) are computed, each family by one worker
    (:func:`family_chunks`), and handed to the screening chunks that need them, so that
    no two workers compute the same family's terms. One stream, no barrier: the family
    chunks go first, ordered by the first screening chunk that needs them, and each
    screening chunk leaves as soon as the families it needs are in
    (:class:`_ScreenFeed`)."""
    parts = screen_chunks(layouts, executor.workers)
    digest = space_digest(layouts)
    verdicts: list[tuple[Any, ...] | None] = [None] * len(layouts)
    # handed out last chunk first: the widest TP groups come last, whose collectives make
    # them the costliest, and a costly chunk should not come last
    parts.reverse()
    if families and executor.workers > 1:
        feed = _ScreenFeed(layouts, parts, digest)
        for item, outcome in executor.stream(task, feed):
            feed.take(item, outcome if isinstance(outcome, list) else local(item), verdicts)
        if not feed.finished():  # the feed sends every chunk: this is a bug
            raise SimError("screening stopped before every chunk was sent")
    else:
        chunks = [ScreenChunk(tuple(part), digest) for part in parts]
        for i, outcome in executor.run(task, chunks):
            got = outcome if isinstance(outcome, list) else local(chunks[i])
            for j, verdict in zip(parts[i], got, strict=True):
                verdicts[j] = verdict
    missing = sum(1 for v in verdicts if v is None)
    if missing:  # the chunks cover every layout: this is a bug, not a user error
        raise SimError(f"screening lost {missing} of {len(layouts)} layouts")
    with gc_paused():  # 90,000 long-lived objects: the collector's scans would cost half
        return candidates(layouts, verdicts)  # type: ignore[arg-type]  # none is None


def candidates(layouts: Sequence[Layout], verdicts: Sequence[tuple[Any, ...]]
               ) -> list[Candidate]:
    """``[Candidate(lay, *verdict) for lay, verdict in zip(layouts, verdicts)]``, field for
    field (the same ``__dict__``), without the frozen dataclass's ``__init__`` (one
    ``object.__setattr__`` per field): every layout's verdict becomes one, in the serial
    part of a search between screening and the sweep. ``verdict``: the four fields after
    the layout (:func:`_compact`)."""
    new, cls = object.__new__, Candidate
    out = []
    append = out.append
    for lay, verdict in zip(layouts, verdicts, strict=True):
        c = new(cls)
        d = c.__dict__
        d["layout"] = lay
        d["status"], d["reason"], d["memory_bound_gib"], d["tokens_bound"] = verdict
        append(c)
    return out


class _ScreenFeed:
    """The work items of screening by family on several workers, as one stream
    (:meth:`Executor.stream`'s ``feed``): every :class:`FamilyChunk` first, then each
    :class:`ScreenChunk` of ``parts`` (indices into ``layouts``, in hand-out order) once
    the state terms of all its families are in, carrying them; None (wait for an answer)
    while the next screening chunk still waits for a family. The family chunks are
    ordered by the first screening chunk that needs them, so screening starts while the
    later families are computed. What each chunk computes does not depend on when it is
    sent (verdicts are pure functions of the layout, the terms of the family)."""

    def __init__(self, layouts: Sequence[Layout], parts: Sequence[Sequence[int]],
                 digest: str) -> None:
        self.parts, self.digest = parts, digest
        self.family = family = list(map(family_of, layouts))  # once: both read it
        first: dict[tuple[Any, ...], Layout] = {}
        for f, lay in zip(family, layouts, strict=True):
            first.setdefault(f, lay)
        # a family chunk is a whole (tp, cp, ep, pp) group
        self.groups = [{family_group(family[i]) for i in part} for part in parts]
        need: dict[tuple[int, int, int, int], int] = {}
        for k, groups in enumerate(self.groups):
            for g in groups:
                need.setdefault(g, k)
        ordered = sorted(family_chunks(list(first.values())),  # stable: largest first
                         key=lambda part: need[_group(part[0])])
        self.families = [FamilyChunk(tuple(lay.values() for lay in part)) for part in ordered]
        self.family_parts = {id(c): part for c, part in zip(self.families, ordered,
                                                             strict=True)}
        self.screens: dict[int, tuple[ScreenChunk, Sequence[int]]] = {}
        """Screening chunks handed out, by ``id``: (the chunk, its indices)."""
        self.sent = 0
        """Family chunks handed out."""
        self.next = 0
        """The next screening chunk to hand out (an index into ``parts``)."""
        self.done: set[tuple[int, int, int, int]] = set()
        """Groups whose family chunk is answered."""
        self.states: dict[tuple[Any, ...], StateTerms] = {}

    def __call__(self) -> FamilyChunk | ScreenChunk | None:
        if self.sent < len(self.families):
            self.sent += 1
            return self.families[self.sent - 1]
        k = self.next
        if k >= len(self.parts) or not self.groups[k] <= self.done:
            return None
        self.next += 1
        part, family, states = self.parts[k], self.family, self.states
        mine = {f: states[f] for f in dict.fromkeys(map(family.__getitem__, part))
                if f in states}
        chunk = ScreenChunk(tuple(part), self.digest, tuple(mine.items()))
        self.screens[id(chunk)] = (chunk, part)
        return chunk

    def take(self, item: FamilyChunk | ScreenChunk, answer: list[Any],
             verdicts: list[tuple[Any, ...] | None]) -> None:
        """Record ``item``'s answer (its family terms, or its verdicts into ``verdicts``)."""
        if isinstance(item, FamilyChunk):
            part = self.family_parts[id(item)]
            for lay, terms in zip(part, answer, strict=True):
                if terms is not None:
                    self.states[state_family(lay)] = terms
            self.done.add(_group(part[0]))
            return
        _, part = self.screens.pop(id(item))
        for j, verdict in zip(part, answer, strict=True):
            verdicts[j] = verdict

    def finished(self) -> bool:
        return self.sent == len(self.families) and self.next == len(self.parts)


def _group(lay: Layout) -> tuple[int, int, int, int]:
    """The ``(tp, cp, ep, pp)`` group of a layout (a :func:`family_chunks` chunk): its
    family's :func:`~sim.search.bounds.family_group`, so the feed's groups are the chunks'."""
    return family_group(state_family(lay))


def family_chunks(representatives: Sequence[Layout]) -> list[list[Layout]]:
    """One layout of each family, in chunks of whole ``(tp, cp, ep, pp)`` groups (the
    families of a group share their DP groups and collective times), largest first."""
    groups: dict[tuple[int, int, int, int], list[Layout]] = {}
    for lay in representatives:
        groups.setdefault(_group(lay), []).append(lay)
    return sorted(groups.values(), key=len, reverse=True)


def _compact(c: Candidate) -> tuple[Any, ...]:
    """A screening verdict without its layout (what travels back from a worker)."""
    return (c.status, c.reason, c.memory_bound_gib, c.tokens_bound)


def _screen_group(lay: Layout) -> tuple[int, int, int]:
    """Layouts that share most of the screener's cached work: the op times and their TP
    collectives depend on tp, cp and the micro-batch size (and the stage's layer count,
    which many pp·vpp share), not on pp, ZeRO or the schedule."""
    return (lay.tp, lay.cp, lay.micro_batch_size)


_SCREEN_GROUP = attrgetter("tp", "cp", "micro_batch_size")
"""``_SCREEN_GROUP(lay) == _screen_group(lay)``, the tuple built in C (for every layout)."""
_KEY = attrgetter("key")


def screen_chunks(layouts: Sequence[Layout], workers: int) -> list[list[int]]:
    """Indices into ``layouts`` of the screening chunks (every index in one chunk).

    About :data:`SCREEN_CHUNKS_PER_WORKER` chunks per worker (one for one worker), made of
    whole groups of :func:`_screen_group` (layouts ordered by group, then index): the
    screener's caches are per worker, so a group screened by one worker computes its op
    times and times its collectives once. A group larger than a chunk is split into even
    pieces, and so are the first ``workers`` chunks (:data:`SCREEN_TAIL_PIECES`; those
    :func:`screen_all` hands out last, so that no worker waits long for the last one).
    """
    n = len(layouts)
    if workers <= 1 or n == 0:
        return [list(range(n))] if n else []
    size = max(SCREEN_CHUNK_MIN, -(-n // (SCREEN_CHUNKS_PER_WORKER * workers)))
    keys = list(map(_SCREEN_GROUP, layouts))
    order = sorted(range(n), key=keys.__getitem__)  # stable: by group, then index
    # [start, end) positions in order of each group: their sizes, in the groups' order
    ends = list(itertools.accumulate(count for _, count in sorted(Counter(keys).items())))
    return chunks_of_groups(order, list(zip([0, *ends[:-1]], ends, strict=True)), size,
                            workers)


def chunks_of_groups(order: list[int], groups: list[tuple[int, int]], size: int,
                     workers: int) -> list[list[int]]:
    """:func:`screen_chunks`' chunks from ``order`` (the layouts' indices by group, then
    index) and ``groups`` (each group's ``[start, end)`` in ``order``, in order): whole
    groups filled up to ``size``, a larger group in even pieces, the first ``workers``
    chunks cut again (:data:`SCREEN_TAIL_PIECES`)."""
    spans: list[tuple[int, int]] = []
    a = b = 0  # the chunk being filled: [a, b)
    for gs, ge in groups:
        if ge - gs > size:  # a big group: its own even pieces
            if b > a:
                spans.append((a, b))
            pieces = -(-(ge - gs) // size)
            cuts = [gs + (ge - gs) * k // pieces for k in range(pieces + 1)]
            spans += list(zip(cuts, cuts[1:], strict=False))
            a = b = ge
        elif b - a + ge - gs > size:
            spans.append((a, b))
            a, b = gs, ge
        else:
            b = ge
    if b > a:
        spans.append((a, b))
    # the chunks handed out last (the first ones: the narrowest TP, the cheapest per
    # layout) in pieces, so that the workers finish screening about together: the sweep
    # cannot start before the last verdict is in
    tail: list[tuple[int, int]] = []
    for a, b in spans[:workers]:
        pieces = max(1, min(SCREEN_TAIL_PIECES, (b - a) // SCREEN_TAIL_MIN))
        cuts = [a + (b - a) * k // pieces for k in range(pieces + 1)]
        tail += list(zip(cuts, cuts[1:], strict=False))
    return [order[a:b] for a, b in tail + spans[workers:]]


def as_evaluation(outcome: Any, layout: Layout) -> Evaluation:
    """A worker's answer for ``layout`` as an evaluation (a lost worker: an ``error``)."""
    if isinstance(outcome, Evaluation):
        return outcome
    message = outcome.message if isinstance(outcome, WorkerFailure) else repr(outcome)
    return Evaluation(layout.key, "error", error=message)
