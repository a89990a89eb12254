"""Executors: run one task on many items, in this process, in local worker processes or on Ray.

A sweep (:mod:`sim.search`) hands an executor a :class:`Task` (a picklable
factory that each worker calls once to build its evaluator: parsing the
experiment and building the cluster graph happen once per worker, not once per
item) and a batch of items; the executor yields ``(index, outcome)`` pairs as
items finish, in completion order. The caller must not rely on that order:
whatever runs the items, the outcome of an item is the same.

Three implementations of the small :class:`Executor` interface:

- :class:`InlineExecutor`: in the calling process, one item at a time (``--workers 1``;
  tests, debugging, benchmarks of the single-process rate).
- :class:`LocalExecutor`: worker processes of :class:`concurrent.futures.ProcessPoolExecutor`
  (the default), forked from the caller on Linux when it runs no other thread (they
  inherit what it built), else started from a fork server (:func:`_mp_context`).
  Workers ignore SIGINT, so Ctrl-C interrupts the sweep (the caller) without a
  traceback per worker. A worker that dies (killed, out of memory)
  breaks the pool and fails every item in flight: the pool is rebuilt and
  they are retried; an item in flight at ``max_breaks`` breaks is then run
  alone, and reported as a :class:`WorkerFailure` only if it breaks the pool
  on its own, so a crashing layout never takes innocent ones down with it.
- :class:`RayExecutor`: Ray actors, one per worker, on a local Ray runtime or the
  cluster at ``address`` (Moritz et al. 2018, OSDI). ``ray`` is imported only here
  and only when this executor is created; without it a :class:`ConfigError` says
  how to install it. Actors restart and retry their task once when their
  process or node dies; a task that still fails is a :class:`WorkerFailure`.

An item's own failures never reach the executor: the evaluator returns them as
results. A :class:`WorkerFailure` means the worker itself was lost.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from base.errors import ConfigError

__all__ = ["EXECUTORS", "Executor", "Feed", "InlineExecutor", "LocalExecutor", "RayExecutor",
           "Task", "WorkerFailure", "make_executor", "map_ordered"]

EXECUTORS = ("local", "ray")
"""Names accepted by :func:`make_executor` (and ``sim search --executor``)."""


@dataclass(frozen=True)
class Task:
    """What every worker runs: ``factory(*args)`` once, then the result on each item.

    ``factory`` must be importable by name (a module-level class or function) and
    ``args`` picklable, so that worker processes and Ray actors can rebuild it.
    """

    factory: Callable[..., Callable[[Any], Any]]
    args: tuple[Any, ...] = ()

    def build(self) -> Callable[[Any], Any]:
        return self.factory(*self.args)


@dataclass(frozen=True)
class WorkerFailure:
    """The outcome of an item whose worker was lost (process killed, node crashed)."""

    message: str


Feed = Callable[[], Any]
"""``feed()``: the next item to run, or ``None`` when there is nothing to run until an
outcome arrives (a stream ends when ``feed`` returns ``None`` and nothing is in flight)."""


class Executor(ABC):
    """Runs a :class:`Task` on items; ``with`` it (or call :meth:`close`) to release workers."""

    name: str = "executor"
    workers: int = 1

    @abstractmethod
    def stream(self, task: Task, feed: Feed) -> Iterator[tuple[Any, Any]]:
        """Yield ``(item, outcome)`` as items finish, asking ``feed`` for the next item
        whenever a worker is free (at most :attr:`workers` items are in flight; an executor
        may queue a few more, :class:`LocalExecutor`'s ``ahead``). Items
        must not be ``None``. The caller handles each outcome before ``feed`` is asked
        again, so ``feed`` may depend on every outcome yielded so far."""

    def run(self, task: Task, items: Sequence[Any]) -> Iterator[tuple[int, Any]]:
        """Yield ``(index into items, outcome)`` for every item, in completion order."""
        pending = iter(enumerate(items))

        def feed() -> tuple[int, Any] | None:
            return next(pending, None)

        for (i, _), outcome in self.stream(_Indexed(task), feed):
            yield i, outcome

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release workers; idempotent."""

    def worker_cpu_s(self) -> float | None:
        """CPU seconds (user + system) the live worker processes have used so far; 0 when
        items run in the calling process, None where not known (benchmarks)."""
        each = self.worker_cpu_each()
        return None if each is None else sum(each)

    def worker_cpu_each(self) -> list[float] | None:
        """:meth:`worker_cpu_s` per live worker process (ordered by process id); empty when
        items run in the calling process, None where not known."""
        return None

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


@dataclass(frozen=True)
class _Indexed:
    """``task`` with items that travel as ``(index, item)`` pairs (:meth:`Executor.run`):
    workers apply ``task``'s evaluator to the item, so pools and actors built for
    ``task`` are reused."""

    task: Task


def is_indexed(task: Task | _Indexed) -> bool:
    """Whether ``task``'s items travel as ``(index, item)`` pairs (:meth:`Executor.run`), for
    an executor that wraps another and its items."""
    return isinstance(task, _Indexed)


def _unwrap(task: Task | _Indexed) -> tuple[Task, bool]:
    """(The task the workers build, whether items are ``(index, item)`` pairs)."""
    return (task.task, True) if isinstance(task, _Indexed) else (task, False)


class InlineExecutor(Executor):
    """Runs items one after another in the calling process."""

    name = "inline"

    def __init__(self) -> None:
        self.workers = 1
        self._task: Task | None = None
        self._fn: Callable[[Any], Any] | None = None

    def worker_cpu_each(self) -> list[float]:
        return []

    def stream(self, task: Task, feed: Feed) -> Iterator[tuple[Any, Any]]:
        base, indexed = _unwrap(task)
        if self._fn is None or base != self._task:
            self._task, self._fn = base, base.build()
        fn = self._fn
        while (item := feed()) is not None:
            yield item, fn(item[1] if indexed else item)


# ----------------------------------------------------------------------------- local processes

_WORKER_FN: list[Callable[[Any], Any]] = []
"""This worker process's evaluator (set once by the pool's initializer; empty in the parent)."""


WATCH_PARENT_S = 0.5
"""How often a worker checks that the process that started its pool is still alive."""


def _init_worker(task: Task, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    threading.Thread(target=_exit_with, args=(parent,), daemon=True,
                     name="watch-parent").start()
    _WORKER_FN[:] = [task.build()]


def _exit_with(parent: int) -> None:
    """Exit this worker as soon as process ``parent`` is gone. A parent killed with SIGKILL
    cannot shut its pool down, and a forkserver's workers are not its children, so nothing
    else would stop them (they would go on evaluating their items)."""
    while True:
        time.sleep(WATCH_PARENT_S)
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            os._exit(1)
        except PermissionError:  # alive, someone else's: the pid was reused
            os._exit(1)


def _run_in_worker(item: Any, indexed: bool) -> Any:
    return _WORKER_FN[0](item[1] if indexed else item)


def _mp_context() -> multiprocessing.context.BaseContext:
    """``fork`` on Linux while this process runs no other thread, else ``forkserver`` where
    available, else ``spawn``.

    Forking is what lets workers inherit what the caller built before the pool starts (a
    search's context and enumerated layouts: :func:`sim.search.execution.shared_space`) and
    the modules it imported, instead of rebuilding them. It is safe only from a
    single-threaded process: a fork copies the locks other threads hold (the progress
    bar's monitor, logging, a pool's manager thread) but not the threads that would release
    them. Hence the check at each pool start: :class:`ProcessPoolExecutor` with ``fork``
    starts all its workers before its own manager thread, a rebuilt pool starts after the
    old one's threads are joined, and with any other thread alive (a progress bar) the
    workers start from a clean, single-threaded fork server instead. macOS lists ``fork``
    but its system libraries are not fork-safe, so only Linux forks."""
    methods = multiprocessing.get_all_start_methods()
    if sys.platform == "linux" and "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


class LocalExecutor(Executor):
    """Worker processes on this machine (``concurrent.futures.ProcessPoolExecutor``)."""

    name = "local"

    def __init__(self, workers: int | None = None, max_breaks: int = 2,
                 ahead: int | None = None) -> None:
        """``max_breaks``: pool breaks an item may be caught in before it is run alone (and
        breaks it may cause alone before it is reported lost). ``ahead``: items handed to
        the pool beyond one per worker (default: one more per worker), queued in the pool's
        shared call queue, so that a worker that finishes an item takes the next at once
        instead of idling through a round trip to this process (its answer read here,
        ``feed`` asked, the next item pickled and sent); whichever worker is free first
        takes a queued item."""
        self.workers = workers or os.cpu_count() or 1
        if self.workers < 1:
            raise ConfigError(f"--workers={workers}: must be at least 1")
        self.max_breaks = max_breaks
        self.ahead = self.workers if ahead is None else ahead
        self._pool: ProcessPoolExecutor | None = None
        self._task: Task | None = None

    def _ensure_pool(self, task: Task) -> ProcessPoolExecutor:
        if self._pool is None or task != self._task:
            self._shutdown()
            context = _mp_context()
            if context.get_start_method() == "forkserver":
                # the server imports the task's module once; workers (and the workers of a
                # rebuilt pool) fork from it with the module loaded instead of importing it
                # each (sim.search and what it imports: about 0.8 s of CPU; `sim search`'s
                # __main__ imports it only lazily). Takes effect when the server starts,
                # i.e. for this process's first pool.
                module = getattr(task.factory, "__module__", None)
                if module and module != "__main__":
                    context.set_forkserver_preload(["__main__", module])
            self._pool = ProcessPoolExecutor(self.workers, mp_context=context,
                                             initializer=_init_worker,
                                             initargs=(task, os.getpid()))
            self._task = task
        return self._pool

    def stream(self, task: Task, feed: Feed) -> Iterator[tuple[Any, Any]]:
        """See :meth:`Executor.stream` (here up to ``workers + ahead`` items are in flight).
        An item lost with a broken pool is retried (before new items); one caught in
        ``max_breaks`` breaks is then run alone, and reported as a :class:`WorkerFailure`
        if it breaks the pool alone."""
        base, indexed = _unwrap(task)
        retry: list[tuple[Any, int]] = []  # (item, breaks so far), oldest first
        alone: list[tuple[Any, int]] = []
        futures: dict[Future, tuple[int, Any, int]] = {}  # -> (sequence, item, breaks)
        seq = 0
        while True:
            pool = self._ensure_pool(base)
            if alone:  # drain, then run the suspect by itself
                if not futures:
                    item, n = alone.pop(0)
                    if not self._submit(pool, futures, (seq, item, n), indexed):
                        alone.insert(0, (item, n))
                    seq += 1
            else:
                while len(futures) < self.workers + self.ahead:
                    if retry:
                        item, n = retry.pop(0)
                    elif (item := feed()) is None:
                        break
                    else:
                        n = 0
                    seq += 1
                    if not self._submit(pool, futures, (seq, item, n), indexed):
                        retry.insert(0, (item, n))
                        break
            if not futures:
                if retry or alone:
                    continue
                return
            done, _ = wait(futures, return_when=FIRST_COMPLETED)
            lone = len(futures) == 1
            lost: list[tuple[Any, int]] = []
            for fut in sorted(done, key=lambda f: futures[f][0]):
                _, item, n = futures.pop(fut)
                try:
                    outcome = fut.result()
                except BrokenProcessPool as exc:
                    if lone and n + 1 >= self.max_breaks:
                        # it broke the pool while running alone: it is the culprit
                        yield item, WorkerFailure(f"worker process died ({exc})")
                    else:
                        lost.append((item, n + 1))
                    continue
                yield item, outcome
            if lost:
                # every item still in flight is lost with the pool: collect them too
                for fut, (_, item, n) in sorted(futures.items(), key=lambda kv: kv[1][0]):
                    try:
                        outcome = fut.result()
                    except BrokenProcessPool:
                        lost.append((item, n + 1))
                        continue
                    yield item, outcome
                futures.clear()
                self._shutdown()
                for item, n in lost:
                    (alone if n >= self.max_breaks else retry).append((item, n))

    def _submit(self, pool: ProcessPoolExecutor, futures: dict[Future, tuple[int, Any, int]],
                entry: tuple[int, Any, int], indexed: bool) -> bool:
        """Submit ``entry``'s item; False if the pool broke since the last result (then it
        is rebuilt once nothing is in flight)."""
        try:
            futures[pool.submit(_run_in_worker, entry[1], indexed)] = entry
        except BrokenProcessPool:
            if not futures:
                self._shutdown()
            return False
        return True

    def _shutdown(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        # Kill workers still busy (Ctrl-C, or a broken pool): waiting for their items would
        # only delay the exit; their results are not wanted.
        for proc in list(getattr(pool, "_processes", {}).values()):
            if proc.is_alive():
                proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)

    def worker_cpu_each(self) -> list[float] | None:
        """See :meth:`Executor.worker_cpu_each` (from ``/proc``; None where it is missing)."""
        pids = sorted(getattr(self._pool, "_processes", None) or {})
        out = []
        try:
            tick = os.sysconf("SC_CLK_TCK")
            for pid in pids:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out.append((int(fields[11]) + int(fields[12])) / tick)  # utime, stime
        except (OSError, ValueError, IndexError):
            return None
        return out

    def close(self) -> None:
        self._shutdown()


# ----------------------------------------------------------------------------- Ray


class _RayWorker:
    """The body of a Ray actor: builds the task's evaluator once, then evaluates items."""

    def __init__(self, task: Task) -> None:
        self._fn = task.build()

    def run(self, item: Any) -> Any:
        return self._fn(item)


class RayExecutor(Executor):
    """Ray actors: ``workers`` of them, each with one CPU.

    ``address``: an existing cluster (``ray://host:10001`` or ``auto``); ``None``
    starts a local runtime with ``workers`` CPUs (``ray.init(num_cpus=...)``) unless
    one is already running in this process. A runtime started here is shut down
    by :meth:`close`. Workers must be able to import this package (install it on
    every node of a remote cluster).
    """

    name = "ray"

    def __init__(self, workers: int | None = None, address: str | None = None,
                 max_retries: int = 1) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError("--executor ray: the 'ray' package is not installed; install it "
                              "with: pip install 'llm-cluster-sim[ray]' (or pip install ray)"
                              ) from None
        self._ray = ray
        self.workers = workers or os.cpu_count() or 1
        if self.workers < 1:
            raise ConfigError(f"--workers={workers}: must be at least 1")
        self.max_retries = max_retries
        self._owns_runtime = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                      "logging_level": logging.WARNING}
            if address is None:
                kwargs["num_cpus"] = self.workers
            try:
                ray.init(address=address, **kwargs)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ConfigError(f"--ray-address={address!r}: cannot connect to Ray: "
                                  f"{exc}") from None
            self._owns_runtime = True
        self._actors: list[Any] = []
        self._task: Task | None = None

    def _ensure_actors(self, task: Task) -> list[Any]:
        if not self._actors or task != self._task:
            self._kill_actors()
            actor = self._ray.remote(num_cpus=1, max_restarts=self.max_retries,
                                     max_task_retries=self.max_retries)(_RayWorker)
            self._actors = [actor.remote(task) for _ in range(self.workers)]
            self._task = task
        return self._actors

    def stream(self, task: Task, feed: Feed) -> Iterator[tuple[Any, Any]]:
        ray = self._ray
        base, indexed = _unwrap(task)
        actors = self._ensure_actors(base)
        idle = list(range(len(actors)))
        idle.reverse()  # pop() from the end hands items to actor 0 first
        pending: dict[Any, tuple[Any, int]] = {}
        while True:
            while idle and (item := feed()) is not None:
                a = idle.pop()
                pending[actors[a].run.remote(item[1] if indexed else item)] = (item, a)
            if not pending:
                return
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                item, a = pending.pop(ref)
                idle.append(a)
                try:
                    outcome = ray.get(ref)
                except ray.exceptions.RayError as exc:  # actor or node lost beyond retries
                    outcome = WorkerFailure(f"Ray worker lost ({type(exc).__name__}: "
                                            f"{str(exc).splitlines()[0] if str(exc) else ''})")
                yield item, outcome

    def _kill_actors(self) -> None:
        for actor in self._actors:
            try:
                self._ray.kill(actor)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._actors = []

    def close(self) -> None:
        self._kill_actors()
        if self._owns_runtime and self._ray.is_initialized():
            self._ray.shutdown()
        self._owns_runtime = False


def make_executor(name: str = "local", workers: int | None = None,
                  ray_address: str | None = None) -> Executor:
    """The executor ``name`` (``local`` or ``ray``); ``local`` with one worker runs inline."""
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers={workers}: must be at least 1")
    if ray_address is not None and name != "ray":
        raise ConfigError(f"--ray-address={ray_address!r}: only used with --executor ray")
    if name == "local":
        return InlineExecutor() if workers == 1 else LocalExecutor(workers)
    if name == "ray":
        return RayExecutor(workers, ray_address)
    raise ConfigError(f"--executor={name!r}: choose one of {', '.join(EXECUTORS)}")


def map_ordered(fn: Callable[[Any], Any], items: Sequence[Any], workers: int = 1,
                progress: Callable[[int, int], None] | None = None, chunksize: int = 2
                ) -> list[Any]:
    """``[fn(item) for item in items]`` in ``workers`` processes (a plain process pool; in
    this process for one worker or fewer than two items), calling ``progress(done,
    total)`` as results come in, in order. For short pure jobs whose failures are the
    caller's (``sim validate``'s rows); a sweep that must survive a lost worker uses an
    :class:`Executor`."""
    out: list[Any] = []
    pool = (ProcessPoolExecutor(max_workers=workers) if workers > 1 and len(items) >= 2
            else None)
    results = map(fn, items) if pool is None else pool.map(fn, items, chunksize=chunksize)
    try:
        for res in results:
            out.append(res)
            if progress:
                progress(len(out), len(items))
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return out
