"""Local workers with a queue each: every work item goes to the worker that holds its caches.

:class:`~sim.executors.LocalExecutor` hands items to one shared call queue, so whichever
worker is free first takes the next item, and every worker ends up building the caches
that most items need (a search's schedules, routes and collective plans: each worker
builds them for the items it happens to take). :class:`RoutedExecutor` runs the same
work on worker processes of its own, each fed through its own pipe: an item that names
an *affinity* (its ``affinity`` attribute, any value with a stable ``repr``) goes to
the worker :func:`owner` assigns that affinity, a pure function of the affinity and the
number of workers (the same in every process and every run: a CRC of the ``repr``, not
Python's salted ``hash``), so items that share their caches meet in one worker.

Load balance: each worker holds at most ``depth`` items at once (one running, the next
waiting in its pipe); items beyond that wait here, in their owner's queue, where a
worker that has nothing to run takes the oldest one of another worker's queue (work
stealing) instead of idling. Items without an affinity go to the worker with the fewest
items. The executor asks ``feed`` for more while some worker has room and fewer than
``workers + ahead`` items are out (:class:`~sim.executors.LocalExecutor`'s bound).

What an item computes never depends on the worker that runs it (the caller's contract,
:class:`~sim.executors.Executor`), so routing changes who computes what, never an
answer. A worker that dies (killed, out of memory) fails only its own items: the one it
was running is retried on a new worker, and reported as a
:class:`~sim.executors.WorkerFailure` once it has been running at ``max_breaks``
deaths; the ones waiting behind it are run again without counting against them.
Workers ignore SIGINT and exit when their parent is gone, as the pool's do.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import zlib
from collections import deque
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from base.errors import ConfigError
from sim.executors import (
    _WORKER_FN,
    Executor,
    Feed,
    Task,
    WorkerFailure,
    _init_worker,
    _mp_context,
    _unwrap,
)

__all__ = ["RoutedExecutor", "affinity_of", "owner"]


def owner(affinity: Hashable, workers: int) -> int:
    """The worker (``0 .. workers - 1``) that runs the items of ``affinity``: a CRC-32 of its
    ``repr``, so the same in every process (unlike ``hash``, salted per process)."""
    return zlib.crc32(repr(affinity).encode()) % workers


def affinity_of(item: Any, indexed: bool = False) -> Hashable | None:
    """The affinity an item names (its ``affinity`` attribute; None: any worker), of the
    item of an ``(index, item)`` pair where ``indexed``."""
    return getattr(item[1] if indexed else item, "affinity", None)


def _read(conn: Connection, inbox: queue.SimpleQueue) -> None:
    """A worker's reader thread: every message into ``inbox`` as it arrives, so that the
    parent's sends never wait for the item the worker is running (and a worker blocked on
    sending a large answer never waits for a parent blocked on sending it an item)."""
    try:
        while True:
            msg = conn.recv()
            inbox.put(msg)
            if msg is None:
                return
    except (EOFError, OSError):
        inbox.put(None)


def _serve(task: Task, parent: int, items: Connection, answers: Connection) -> None:
    """A worker process: build the task, then answer ``(seq, item)`` messages in order with
    ``(seq, True, outcome)`` or ``(seq, False, exception)`` until ``None``."""
    _init_worker(task, parent)
    fn = _WORKER_FN[0]
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_read, args=(items, inbox), daemon=True, name="inbox").start()
    while (msg := inbox.get()) is not None:
        seq, item = msg
        try:
            answer = (seq, True, fn(item))
        except Exception as exc:  # noqa: BLE001 - raised again in the caller
            answer = (seq, False, exc)
        try:
            answers.send(answer)
        except Exception as exc:  # noqa: BLE001 - an answer (or exception) that cannot pickle
            answers.send((seq, False, RuntimeError(f"the worker's answer could not be sent: "
                                                   f"{exc!r}")))


@dataclass
class _Worker:
    process: Any
    items: Connection
    """Parent -> worker."""
    answers: Connection
    """Worker -> parent."""
    sent: deque = field(default_factory=deque)
    """``(seq, item, breaks)`` sent and not answered, in the order the worker runs them."""


class RoutedExecutor(Executor):
    """Worker processes on this machine, one queue each, items routed by affinity (see the
    module docstring)."""

    name = "local"

    def __init__(self, workers: int | None = None, max_breaks: int = 2,
                 ahead: int | None = None) -> None:
        """``ahead``: items out beyond one per worker (default one more per worker): each
        worker holds ``1 + ceil(ahead / workers)`` (the next waits in its pipe while it
        runs one), the rest wait in the owners' queues, where an idle worker may take
        them. ``max_breaks``: deaths of its worker an item may be running at before it is
        reported lost."""
        self.workers = workers or os.cpu_count() or 1
        if self.workers < 1:
            raise ConfigError(f"--workers={workers}: must be at least 1")
        self.max_breaks = max_breaks
        self.ahead = self.workers if ahead is None else ahead
        self.depth = 1 + math.ceil(self.ahead / self.workers)
        self._procs: list[_Worker] = []
        self._task: Task | None = None
        self._asking: int | None = None
        self.routed = self.stolen = 0
        """Items sent to their owner / taken by another worker (counts, for benchmarks)."""

    def owner(self, affinity: Hashable) -> int:
        return owner(affinity, self.workers)

    def asking(self) -> int | None:
        return self._asking

    # ------------------------------------------------------------- processes
    def _start(self, task: Task) -> _Worker:
        context = _mp_context()
        if context.get_start_method() == "forkserver":  # as LocalExecutor._ensure_pool
            module = getattr(task.factory, "__module__", None)
            if module and module != "__main__":
                context.set_forkserver_preload(["__main__", module])
        items_r, items_w = context.Pipe(duplex=False)
        answers_r, answers_w = context.Pipe(duplex=False)
        proc = context.Process(target=_serve, args=(task, os.getpid(), items_r, answers_w),
                               daemon=True, name="sim-worker")
        proc.start()
        items_r.close()
        answers_w.close()
        return _Worker(proc, items_w, answers_r)

    def _ensure(self, task: Task) -> list[_Worker]:
        if not self._procs or task != self._task:
            self._shutdown()
            self._procs = [self._start(task) for _ in range(self.workers)]
            self._task = task
        return self._procs

    def _send(self, worker: _Worker, entry: tuple[int, Any, int], indexed: bool) -> None:
        seq, item, _ = entry
        worker.sent.append(entry)
        worker.items.send((seq, item[1] if indexed else item))

    def _shutdown(self) -> None:
        procs, self._procs = self._procs, []
        for w in procs:
            if w.sent:  # busy (Ctrl-C, an error): its answers are not wanted
                w.process.terminate()
            else:
                try:
                    w.items.send(None)
                except OSError:
                    w.process.terminate()
        for w in procs:
            w.process.join(5)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.items.close()
            w.answers.close()

    def close(self) -> None:
        self._shutdown()

    def worker_cpu_each(self) -> list[float] | None:
        """See :meth:`Executor.worker_cpu_each` (from ``/proc``; None where it is missing)."""
        out = []
        try:
            tick = os.sysconf("SC_CLK_TCK")
            for pid in sorted(w.process.pid for w in self._procs):
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out.append((int(fields[11]) + int(fields[12])) / tick)  # utime, stime
        except (OSError, ValueError, IndexError):
            return None
        return out

    # ------------------------------------------------------------- the stream
    def stream(self, task: Task, feed: Feed) -> Iterator[tuple[Any, Any]]:
        """See :meth:`Executor.stream` (up to ``workers + ahead`` items out)."""
        base, indexed = _unwrap(task)
        procs = self._ensure(base)
        n, depth, cap = self.workers, self.depth, self.workers + self.ahead
        queued: list[deque] = [deque() for _ in range(n)]  # (seq, item, breaks)
        seq = out = 0
        dry = False  # feed returned None since the last outcome
        try:
            while True:
                while not dry and out < cap:
                    load = [len(w.sent) + len(q) for w, q in zip(procs, queued, strict=True)]
                    room = min(range(n), key=load.__getitem__)
                    if load[room] >= depth:
                        break
                    self._asking = room
                    try:
                        item = feed()
                    finally:
                        self._asking = None
                    if item is None:
                        dry = True
                        break
                    key = affinity_of(item, indexed)
                    if key is None:
                        k = room
                    else:
                        k = owner(key, n)
                    seq += 1
                    out += 1
                    queued[k].append((seq, item, 0))
                self._dispatch(procs, queued, indexed)
                if not out:
                    return
                for item, outcome in self._collect(procs, queued, indexed):
                    out -= 1
                    dry = False
                    yield item, outcome
        finally:
            if out:  # left early (an exception, Ctrl-C, the caller stopped): drop the workers
                self._shutdown()

    def _dispatch(self, procs: list[_Worker], queued: list[deque], indexed: bool) -> None:
        """Send each worker its own queued items up to ``depth``; a worker with nothing to
        run takes the oldest item queued for another."""
        for k, w in enumerate(procs):
            while len(w.sent) < self.depth:
                if queued[k]:
                    self._send(w, queued[k].popleft(), indexed)
                    self.routed += 1
                    continue
                if w.sent:
                    break
                others = [q for q in queued if q]
                if not others:
                    break
                self._send(w, min(others, key=lambda q: q[0][0]).popleft(), indexed)
                self.stolen += 1

    def _collect(self, procs: list[_Worker], queued: list[deque], indexed: bool
                 ) -> Iterator[tuple[Any, Any]]:
        """Wait for answers (or a worker's death); yield ``(item, outcome)`` for each."""
        by_conn = {w.answers: w for w in procs}
        by_sentinel = {w.process.sentinel: w for w in procs}
        ready = wait([*by_conn, *by_sentinel])
        for r in ready:
            w = by_conn.get(r)
            if w is None or not w.sent:
                continue
            try:
                while w.sent and w.answers.poll():
                    seq, ok, outcome = w.answers.recv()
                    got, item, _ = w.sent.popleft()
                    if got != seq:  # a worker answers in order: this is a bug
                        raise RuntimeError(f"worker answered item {seq}, expected {got}")
                    if not ok:
                        raise outcome
                    yield item, outcome
            except (EOFError, OSError):
                pass  # died mid-answer: handled below, by its sentinel
        for r in ready:
            w = by_sentinel.get(r)
            if w is None or w.process.is_alive():
                continue
            k = procs.index(w)
            lost = list(w.sent)
            w.sent.clear()
            try:
                w.items.close()
                w.answers.close()
            except OSError:
                pass
            w.process.join()
            procs[k] = self._start(self._task)  # type: ignore[arg-type]
            if lost:
                (seq, item, breaks), rest = lost[0], lost[1:]
                # the worker runs its items in order: the first was running, the rest waited
                requeue = [(s, it, b) for s, it, b in rest]
                if breaks + 1 >= self.max_breaks:
                    yield item, WorkerFailure(
                        f"worker process died (exit code {w.process.exitcode})")
                else:
                    requeue.insert(0, (seq, item, breaks + 1))
                queued[k].extendleft(reversed(requeue))
