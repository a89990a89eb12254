"""The sweep: judge and simulate the screened layouts in rounds, best bound first, and
:func:`search`, which runs a whole search."""

from __future__ import annotations

import gc
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from operator import attrgetter
from pathlib import Path
from typing import Any

from base.collector import gc_paused
from base.errors import ConfigError, SimError
from sim.api import AUTO_FULL_MAX_GPUS, FIDELITIES
from sim.calibration import default_profile
from sim.device import DeviceProfile
from sim.executors import Executor, InlineExecutor, Task
from sim.search.bounds import screens_by_family
from sim.search.evaluation import Evaluation, Evaluator
from sim.search.execution import (
    JudgeChunk,
    LocalFallback,
    SearchWorker,
    SimulateOne,
    TimingRelay,
    WorkerSpec,
    as_evaluation,
    screen_all,
    shared_space,
)
from sim.search.layouts import Layout, Pins, file_key, value_text
from sim.search.results import SearchResult, collect_rows
from sim.search.screening import Candidate
from sim.search.space import SearchContext, enumerate_layouts
from sim.search.store import ResultStore

Progress = Callable[[int, int], None]
"""``progress(done, total)``: layouts judged so far out of those that passed screening."""


def _kth_best(results: Iterable[Evaluation], k: int) -> float:
    tokens = sorted((ev.stats["tokens_per_s"] or 0.0 for ev in results
                     if ev.status == "ok" and ev.stats), reverse=True)
    return tokens[k - 1] if len(tokens) >= k else 0.0


def search(
    data: Mapping[str, Any],
    *,
    base_dir: str | Path | None = None,
    gpus: int | None = None,
    pins: Pins | None = None,
    top: int = 10,
    fidelity: str = "collapsed",
    profile: DeviceProfile | None = None,
    executor: Executor | None = None,
    store: ResultStore | None = None,
    prune: bool = True,
    round_size: int = 16,
    progress: Progress | None = None,
    evaluator: Callable[..., Callable[[Layout], Evaluation]] = Evaluator,
) -> SearchResult:
    """Search the layouts of the experiment mapping ``data`` (see the module docstring).

    ``top``: K, the number of best layouts that pruning keeps exact (the
    K best feasible layouts are always simulated). ``prune=False`` simulates
    every layout that passes the memory bound. ``executor`` defaults to this
    process; ``store`` to an in-memory database. ``evaluator`` is the worker
    factory, called as ``evaluator(data, global_batch_size, fidelity, profile,
    base_dir)`` (a hook for tests).
    """
    with young_generation(GC_YOUNG):
        return _search(data, base_dir, gpus, pins, top, fidelity, profile, executor, store,
                       prune, round_size, progress, evaluator)


GC_YOUNG = 50_000
"""The cyclic collector's first threshold during a search (Python's default: 700). A search
allocates millions of short-lived containers and almost no cycles (one worker's search of
the 1,024-GPU example: 4,163 young collections, 245 middle, 1 full, 0.77 CPU s of its ~34,
317 objects collected in all; at 50,000: 12 collections, 0.11 s): objects freed by their
reference counts before a collection are never scanned. Forked workers inherit it."""


@contextmanager
def young_generation(threshold: int) -> Iterator[None]:
    """Run the block with the collector's first threshold at ``threshold`` (the others as
    they are), restored on exit. What is collected does not change, only how often."""
    old = gc.get_threshold()
    gc.set_threshold(threshold, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def _search(data: Mapping[str, Any], base_dir: str | Path | None, gpus: int | None,
            pins: Pins | None, top: int, fidelity: str, profile: DeviceProfile | None,
            executor: Executor | None, store: ResultStore | None, prune: bool,
            round_size: int, progress: Progress | None,
            evaluator: Callable[..., Callable[[Layout], Evaluation]]) -> SearchResult:
    start = time.perf_counter()
    if top < 1:
        raise ConfigError(f"--top={top}: must be at least 1")
    if fidelity not in FIDELITIES:
        raise ConfigError(f"--fidelity={fidelity!r}: choose one of {', '.join(FIDELITIES)}")
    if round_size < 1:
        raise ConfigError(f"round_size={round_size}: must be at least 1")
    pins = dict(pins or {})
    ctx = SearchContext.build(data, base_dir, gpus)
    given = profile
    profile = profile or default_profile(ctx.cluster.gpu.name)
    # a mixed cluster without a given profile: every GPU type with its own, as sim run
    workers_profile = given if ctx.cluster.heterogeneous else profile
    collapsed = fidelity == "collapsed" or (
        fidelity == "auto" and ctx.cluster.num_gpus > AUTO_FULL_MAX_GPUS)
    with gc_paused():  # many long-lived objects, no cycles: the collector's scans are waste
        layouts = list(enumerate_layouts(ctx, pins))
    if not layouts:
        pinned = ", ".join(f"{file_key(d)}={'|'.join(map(value_text, v))}"
                           for d, v in pins.items())
        raise ConfigError(f"no layout of {ctx.cluster.num_gpus} GPUs divides correctly"
                          + (f" with --fix {pinned}" if pinned else "")
                          + f" (global batch {ctx.global_batch_size}, "
                          f"{ctx.model.num_attention_heads} heads, {ctx.model.num_layers} layers)")
    # before any worker starts, so that forked workers inherit the context and the layouts
    with shared_space(ctx, layouts) as space:
        spec = WorkerSpec(ctx.data, str(ctx.base_dir) if ctx.base_dir else None,
                          ctx.global_batch_size, fidelity, workers_profile, collapsed,
                          tuple(sorted(ctx.unsupported.items())),
                          tuple(ctx.schedule_vpps.items()), evaluator,
                          tuple(sorted((d, tuple(v)) for d, v in pins.items())), space)
        task = Task(SearchWorker, (spec,))
        executor = executor or InlineExecutor()
        if executor.workers > 1:  # workers hand each other their collective timings
            executor = TimingRelay(executor)
        local = LocalFallback(spec)
        candidates = screen_all(layouts, executor, task, local, screens_by_family(ctx))
        with gc_paused():
            todo = best_first([c for c in candidates if c.status == "ok"])
        screen_s = time.perf_counter() - start
        fingerprint = ctx.fingerprint(fidelity, profile)
        own_store = store is None
        store = store or ResultStore()
        done = store.load(fingerprint)
        resumed = sum(1 for c in todo if c.layout.key in done) if done else 0
        sweep = _Sweep(todo, done, store, fingerprint, top, prune, round_size,
                       progress or (lambda _done, _total: None), local)
        try:
            sweep.run(executor, task)
        finally:
            if own_store:
                store.close()
            else:
                store.release()  # speculative claims whose results were never wanted
    with gc_paused():
        rows = collect_rows(candidates, sweep.results, sweep.judged, sweep.stopped)
    counts = Counter(map(_STATUS, rows))
    return SearchResult(ctx.config.name, ctx.cluster.num_gpus, ctx.global_batch_size, rows,
                        time.perf_counter() - start, len(layouts), ctx.unsupported, pins,
                        resumed + sweep.shared, sweep.simulated, dict(counts), screen_s,
                        sweep.speculated, sweep.discarded, sweep.wasted_judged)


_STATUS = attrgetter("status")
_LAYOUT_KEY = attrgetter("layout.key")
_TOKENS_BOUND = attrgetter("tokens_bound")


def best_first(todo: list[Candidate]) -> list[Candidate]:
    """The candidates by throughput bound, best first, ties by layout key: ``sorted(todo,
    key=lambda c: (-(c.tokens_bound or 0.0), c.layout.key))``, as two stable sorts whose
    keys are read in C (by key, then by bound in reverse, which keeps the order of ties)
    where no bound is None or NaN (else that sort itself). ~70,000
    candidates in the serial part of a search, between screening and the sweep."""
    bounds = list(map(_TOKENS_BOUND, todo))
    if None in bounds or any(map(math.isnan, bounds)):
        return sorted(todo, key=lambda c: (-(c.tokens_bound or 0.0), c.layout.key))
    out = sorted(todo, key=_LAYOUT_KEY)
    out.sort(key=_TOKENS_BOUND, reverse=True)
    return out


JUDGE_CHUNK = 16
"""Candidates per judging work item."""
LOOKAHEAD = 64
"""How far past the sweep's frontier candidates are judged before any speculation."""
FAR_LOOKAHEAD = 512
"""How far past the frontier idle workers judge, and simulate speculatively."""
POLL_S = 0.5
"""How often a sweep with nothing else to do looks for the results of layouts that
another search sharing its database is simulating."""


class _Sweep:
    """Judges and simulates the screened candidates ``todo`` (best bound first) in rounds.

    The semantics (what is simulated) are those of a serial sweep: the first round is
    the K best bounds, the next ``round_size`` each; each round is judged against the
    K-th best throughput of the rounds before it (:func:`_kth_best`); stored results are
    reused; a layout that cannot fit or cannot reach the threshold is set aside, the
    others are simulated and stored one by one as they finish; the sweep stops at the
    first layout whose screening bound is below the threshold (the order is by that
    bound). So the set of simulated layouts, not only the top K, is the same whatever
    executor or number of workers runs it.

    Several searches may share one database (``--db``): before simulating a layout the
    sweep claims it (:meth:`~sim.search.store.ResultStore.claim`); a layout another live
    search has claimed is not simulated here: its result is taken from the database when
    it arrives (or the layout is claimed here if that search is gone). Results are the
    same floats whoever simulates them, so the outcome does not change, only who works.

    What workers do ahead of that serial order, to stay busy: judging (its verdict and
    bound do not depend on the threshold, only the final comparison does) runs up to
    :data:`LOOKAHEAD` candidates past the frontier, in chunks; and a free worker
    simulates, speculatively, the next judged candidate that would be simulated under
    the best threshold known so far (a lower bound of its round's threshold, which
    only grows). A speculative result is kept only if the serial order reaches its
    layout and simulates it; otherwise it is discarded, never stored. One process
    (:class:`~sim.executors.InlineExecutor`) never speculates.
    """

    def __init__(self, todo: list[Candidate], done: Mapping[str, Evaluation],
                 store: ResultStore, fingerprint: str, top: int, prune: bool,
                 round_size: int, report: Progress, local: Callable[[Any], Any]) -> None:
        self.todo, self.done, self.store, self.fingerprint = todo, done, store, fingerprint
        self.top, self.prune, self.report, self.local = top, prune, report, local
        n = len(todo)
        # round i covers todo[bounds[i]:bounds[i + 1]]; the first is the K best bounds
        self.bounds = [0, *range(min(top, n), n, round_size), n]
        self.results: dict[str, Evaluation] = {}
        self.judged: dict[str, Candidate] = {}
        self.stopped: set[str] = set()
        """Keys of the layouts pruned at the stop (:meth:`_stop`) without a result: their
        screening verdicts, with the status ``pruned``."""
        self.verdicts: list[Candidate | None] = [None] * n
        self.spec: dict[int, Evaluation] = {}
        """Speculative results not (yet) wanted, by index into todo."""
        self.sent: set[int] = set()
        """Indices whose simulation was handed to a worker."""
        self.need: list[int] = []
        """Indices the serial order simulates, not yet handed out."""
        self.waiting: set[int] = set()
        """Indices the serial order simulates, result not in yet."""
        self.judge_next = 0
        self.pos = 0
        """The frontier: every index before it is decided."""
        self.round = 0
        self.threshold = 0.0
        self._known, self._known_at = 0.0, 0
        """K-th best of all results so far (a lower bound of every later round's threshold),
        and the number of results it was computed from."""
        self._index: dict[str, int] = {}
        """Key -> index into todo of the layouts handed out to simulate (:meth:`_simulate`)."""
        self.others: list[int] = []
        """Indices the serial order simulates that another search holds the claim on."""
        self._next_poll = 0.0
        self.from_others: set[int] = set()
        """Indices in :attr:`spec` whose result another search stored."""
        self.finished = 0
        self.simulated = self.speculated = self.discarded = self.wasted_judged = 0
        self.shared = 0
        """Results taken from another search sharing the database."""

    # ------------------------------------------------------------- serial order
    def _round_of(self, i: int) -> int:
        r = self.round
        while self.bounds[r + 1] <= i:
            r += 1
        return r

    def advance(self) -> None:
        """Decide candidates in the serial order as far as the outcomes so far allow."""
        self._advance()
        self.report(self.finished, len(self.todo))

    def _advance(self) -> None:
        todo, n = self.todo, len(self.todo)
        while self.pos < n:
            i = self.pos
            r = self._round_of(i)
            if r != self.round:
                if self.waiting:
                    return  # the round's threshold needs the previous rounds' results
                self.round = r
                self.threshold = _kth_best(self.results.values(), self.top) if self.prune \
                    else 0.0
            c = todo[i]
            key = c.layout.key
            if key in self.done:
                self.results[key] = self.done[key]
            elif self.threshold > 0 and (c.tokens_bound or 0.0) < self.threshold:
                self._stop(i)
                return
            elif (v := self.verdicts[i]) is None:
                return
            elif v.status == "ok" and self.threshold > 0 and (v.tokens_bound or 0.0) \
                    < self.threshold:
                self.judged[key] = replace(v, status="pruned")
            elif v.status == "ok":
                self.judged[key] = v
                self.pos += 1
                if i in self.spec:
                    self._keep(i, self.spec.pop(i), stored=i in self.from_others)
                else:
                    self.waiting.add(i)
                    if i not in self.sent:
                        self.need.append(i)
                continue
            else:
                self.judged[key] = v
            self.finished += 1
            self.pos += 1

    def _stop(self, first: int) -> None:
        """Ordered by the screening bound: no layout from ``first`` on can reach the
        threshold; stored results are still taken."""
        done = self.done
        if done:
            for c in self.todo[first:]:
                if (key := c.layout.key) in done:
                    self.results[key] = done[key]
        self.stopped = set(map(_LAYOUT_KEY, self.todo[first:])) - done.keys()
        rest = self.verdicts[first:]
        self.wasted_judged = len(rest) - rest.count(None)
        self.pos = len(self.todo)
        self.finished = len(self.todo)

    def _keep(self, i: int, ev: Evaluation, stored: bool = False) -> None:
        """A result the serial order wants: store it (its own transaction) and count it;
        ``stored``: another search simulated and stored it."""
        if stored:
            self.shared += 1
        else:
            self.store.put(self.fingerprint, ev)
            self.simulated += 1
        self.results[ev.key] = ev
        self.waiting.discard(i)
        self.finished += 1

    def _claim(self, i: int) -> bool:
        """Whether this sweep may simulate ``todo[i]`` now (it holds the claim). If another
        search stored its result meanwhile, that result is taken (kept if the serial
        order wants it, else held as a speculative one); if another live search holds
        the claim, False."""
        got = self.store.claim(self.fingerprint, self.todo[i].layout.key)
        if isinstance(got, Evaluation):
            self.sent.add(i)
            if i in self.waiting:
                self._keep(i, got, stored=True)
            else:
                self.spec[i] = got
                self.from_others.add(i)
            return False
        return got

    def _poll_others(self) -> int | None:
        """Look again at the layouts other searches hold: take the results that arrived;
        the first whose holder is gone is claimed here and returned (to simulate)."""
        self._next_poll = time.monotonic() + POLL_S
        held, self.others = self.others, []
        mine = None
        for i in held:
            if mine is None and self._claim(i):
                mine = i
            elif i in self.waiting:
                self.others.append(i)
        return mine

    # ------------------------------------------------------------- work for workers
    def _floor(self, i: int) -> float:
        """A lower bound of the threshold that ``todo[i]`` will be judged against: its
        round's own if that round is being decided, else the K-th best result so far
        (thresholds only grow as results come in)."""
        if not self.prune:
            return 0.0
        if self.bounds[self.round] <= i < self.bounds[self.round + 1]:
            return self.threshold
        if self._known_at != len(self.results):
            self._known_at = len(self.results)
            self._known = _kth_best(self.results.values(), self.top)
        return max(self.threshold, self._known)

    def feed(self) -> JudgeChunk | SimulateOne | None:
        """The most useful work for a free worker: a simulation the serial order waits
        for, judging up to :data:`LOOKAHEAD` past the frontier, a speculative simulation,
        judging further ahead (up to :data:`FAR_LOOKAHEAD`, so that the judged candidates
        that speculation picks from do not run out while the serial order waits), or
        nothing."""
        todo, n = self.todo, len(self.todo)
        if self.others and time.monotonic() >= self._next_poll:
            mine = self._poll_others()
            self.advance()  # results that arrived may decide the frontier
            if mine is not None:
                return self._simulate(mine)
        while self.need:
            i = self.need.pop(0)
            if self._claim(i):
                self.sent.add(i)
                return self._simulate(i)
            if i in self.waiting:  # another search holds it: its result is awaited
                self.others.append(i)
            else:
                self.advance()  # its stored result was taken
        near = self._judge_chunk(min(n, self.pos + LOOKAHEAD))
        if near is not None:
            return near
        far = min(n, self.pos + FAR_LOOKAHEAD)
        for i in range(self.pos, far):
            v, floor = self.verdicts[i], self._floor(i)
            if (todo[i].tokens_bound or 0.0) < floor:
                break
            if v is None:
                if todo[i].layout.key in self.done:
                    continue  # never judged: its stored result is taken
                break
            if (v.status == "ok" and (v.tokens_bound or 0.0) >= floor and i not in self.sent
                    and i not in self.spec and todo[i].layout.key not in self.done
                    and self._claim(i)):
                self.sent.add(i)
                self.speculated += 1
                return self._simulate(i)
        return self._judge_chunk(far)

    def _simulate(self, i: int) -> SimulateOne:
        """The work item that simulates ``todo[i]`` (its index is found again by key)."""
        layout = self.todo[i].layout
        self._index[layout.key] = i
        return SimulateOne(layout)

    def _judge_chunk(self, end: int) -> JudgeChunk | None:
        """The next up to :data:`JUDGE_CHUNK` candidates not judged yet, before ``end``."""
        todo = self.todo
        self.judge_next = max(self.judge_next, self.pos)
        chunk: list[int] = []
        while self.judge_next < end and len(chunk) < JUDGE_CHUNK:
            j = self.judge_next
            if (todo[j].tokens_bound or 0.0) < self._floor(j):
                break  # at or past the stop: never judged
            if todo[j].layout.key not in self.done:
                chunk.append(j)
            self.judge_next += 1
        return JudgeChunk(tuple(todo[j] for j in chunk), tuple(chunk)) if chunk else None

    def on_outcome(self, item: JudgeChunk | SimulateOne, outcome: Any) -> None:
        """Take a worker's answer (a lost worker's judging is redone here), then advance."""
        if isinstance(item, JudgeChunk):
            verdicts = outcome if isinstance(outcome, list) else self.local(item)
            for i, v in zip(item.indices, verdicts, strict=True):
                self.verdicts[i] = v
        else:
            i = self._index[item.layout.key]
            ev = as_evaluation(outcome, item.layout)
            if i in self.waiting:
                self._keep(i, ev)
            else:
                self.spec[i] = ev
        self.advance()

    def run(self, executor: Executor, task: Task) -> None:
        """Run the sweep to its end on ``executor`` (``task`` builds a :class:`SearchWorker`)."""
        self.report(0, len(self.todo))
        self.advance()
        while True:
            for item, outcome in executor.stream(task, self.feed):
                self.on_outcome(item, outcome)
            if not self.others:
                break
            time.sleep(max(0.0, self._next_poll - time.monotonic()))  # another search is
            # simulating what this one waits for: feed looks for its results again
        if self.pos < len(self.todo) or self.waiting:
            raise SimError(f"search stalled at layout {self.pos} of {len(self.todo)}")
        self.discarded = len(self.spec.keys() - self.from_others)
