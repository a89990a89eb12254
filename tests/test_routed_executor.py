"""Workers with a queue each (sim.routed): items go to the worker that owns their affinity,
the owner is the same in every process, an idle worker takes queued work, a lost worker
fails only its own item, and a search's output is byte for byte one process's."""

from __future__ import annotations

import json
import operator
import os
import subprocess
import sys
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT
from test_executors import UPPER, _die_on
from test_search import PINS_SMALL, SMALL

from sim.executors import LocalExecutor, Task, WorkerFailure, make_executor
from sim.routed import RoutedExecutor, _Worker, affinity_of, owner
from sim.search import SearchResult, search
from sim.search.execution import (
    FamilyChunk,
    JudgeChunk,
    Relayed,
    ScreenChunk,
    SimulateOne,
    group_affinity,
)
from sim.search.layouts import Layout

AFFINITIES = [("plan", "1f1b", 8, 192, 1), ("group", 2, 1, 1, 8), ("screen", 4, 1, 2), "x", 7,
              ("plan", "zb-v", 16, 96, 2)]


def test_the_owner_is_the_same_in_every_process() -> None:
    """A CRC of the affinity's repr, not the salted ``hash``: another interpreter with
    another hash seed routes every affinity to the same worker."""
    here = [[owner(a, n) for a in AFFINITIES] for n in (1, 2, 3, 5)]
    code = ("import json, sys; from sim.routed import owner; "
            f"print(json.dumps([[owner(a, n) for a in {AFFINITIES!r}] for n in (1, 2, 3, 5)]))")
    for seed in ("0", "12345"):
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, text=True,
                             capture_output=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": seed})
        assert json.loads(out.stdout) == here
    assert all(0 <= w < n for row, n in zip(here, (1, 2, 3, 5), strict=True) for w in row)
    assert len({owner(("group", tp, 1, 1, 8), 2) for tp in (1, 2, 4, 8)}) == 2  # spreads


def test_items_name_the_caches_they_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """A simulation (where simulations are routed) and its group's family chunk share one
    affinity (the DP groups' collectives); a relayed item routes as the item it carries;
    indexed pairs route by their item."""
    import sim.search.execution

    lay = Layout(tp=2, pp=8, dp=64, micro_batch_size=1)
    one = SimulateOne(lay)
    monkeypatch.setattr(sim.search.execution, "ROUTE_SIMULATIONS", False)
    assert one.affinity is None
    monkeypatch.setattr(sim.search.execution, "ROUTE_SIMULATIONS", True)
    assert one.affinity == group_affinity(lay) == ("group", 2, 1, 1, 8)
    fam = FamilyChunk((lay.values(),), group_affinity(lay))
    assert owner(fam.affinity, 2) == owner(one.affinity, 2)
    assert Relayed(one).affinity == one.affinity
    assert affinity_of((3, one), indexed=True) == one.affinity
    assert affinity_of("plain") is None
    assert ScreenChunk((1,), "d").affinity is None and JudgeChunk(()).affinity is None


class _Pipe:
    def __init__(self) -> None:
        self.got: list = []

    def send(self, msg) -> None:  # type: ignore[no-untyped-def]
        self.got.append(msg)


def _fake(n: int) -> list[_Worker]:
    return [_Worker(SimpleNamespace(pid=i), _Pipe(), None) for i in range(n)]  # type: ignore[arg-type]


def test_dispatch_sends_own_items_first_and_an_idle_worker_takes_the_oldest() -> None:
    """Each worker gets its own queue's items up to ``depth``; a worker with nothing sent
    and nothing of its own takes the oldest item queued for another; a busy worker never
    takes another's."""
    ex = RoutedExecutor(2, ahead=2)  # depth 2; no process is started by _dispatch
    assert ex.depth == 2
    procs = _fake(2)
    queued = [deque([(1, "a1", 0), (3, "a2", 0), (4, "a3", 0), (6, "a4", 0)]),
              deque([(2, "b1", 0)])]
    ex._dispatch(procs, queued, False)
    assert [m[1] for m in procs[0].items.got] == ["a1", "a2"]
    assert [m[1] for m in procs[1].items.got] == ["b1"]  # busy with b1: takes nothing else
    assert [e[1] for e in queued[0]] == ["a3", "a4"] and ex.stolen == 0
    procs[1].sent.clear()  # b1 answered: worker 1 is idle, its queue empty
    ex._dispatch(procs, queued, False)
    assert [m[1] for m in procs[1].items.got] == ["b1", "a3"]  # the oldest of worker 0's
    assert [e[1] for e in queued[0]] == ["a4"] and ex.stolen == 1
    assert ex.routed == 3


def _pids(x: object) -> int:
    return os.getpid()


def test_items_of_one_affinity_run_on_their_owner() -> None:
    """Items fed one at a time (the next once the last is answered), all of worker 0's
    affinity: nothing waits in worker 0's queue, so worker 1 takes nothing; the
    executor asks for each item on behalf of the least busy worker."""
    key = next(a for a in AFFINITIES if owner(a, 2) == 0)
    pending = [SimpleNamespace(affinity=key, n=i) for i in range(6)]
    busy, asked = [False], []
    with RoutedExecutor(2) as ex:
        task = Task(_getpid_task)
        pid_of = {w.process.pid: k for k, w in enumerate(ex._ensure(task))}

        def feed() -> object:
            asked.append(ex.asking())
            if busy[0] or not pending:
                return None
            busy[0] = True
            return pending.pop(0)

        got = []
        for _, pid in ex.stream(task, feed):
            busy[0] = False
            got.append(pid_of[pid])
        assert got == [0] * 6 and ex.stolen == 0 and ex.routed == 6
        assert ex.asking() is None and set(asked) <= {0, 1} and 1 in asked


def _getpid_task() -> object:
    return _pids


def test_routed_workers_run_every_item_once_and_retry_a_lost_one(tmp_path: Path) -> None:
    items = [f"item{i}" for i in range(12)]
    with RoutedExecutor(2) as ex:
        assert dict(ex.run(UPPER, items)) == {i: s.upper() for i, s in enumerate(items)}
        assert dict(ex.run(UPPER, items[:2])) == {0: "ITEM0", 1: "ITEM1"}  # reused
        each = ex.worker_cpu_each()
        assert each is None or len(each) == 2
    task = Task(_die_on, (str(tmp_path / "died-once"),))
    with RoutedExecutor(2) as ex:
        got = dict(ex.run(task, ["a", "once", "b", "die", "c"]))
    assert got[0] == "A" and got[1] == "ONCE" and got[2] == "B" and got[4] == "C"
    assert isinstance(got[3], WorkerFailure) and "died" in got[3].message


def test_a_worker_exception_reaches_the_caller() -> None:
    with RoutedExecutor(2) as ex, pytest.raises(AttributeError):
        dict(ex.run(Task(operator.methodcaller, ("upper",)), ["a", 3]))
    with RoutedExecutor(2) as ex:  # and the executor still works after it
        assert dict(ex.run(UPPER, ["z"])) == {0: "Z"}


def _output(result: SearchResult) -> tuple[str, str]:
    from sim.search.results import rows_csv

    summary = {k: v for k, v in result.summary().items()
               if k not in ("elapsed_s", "screen_s", "layouts_per_s", "speculated",
                            "discarded")}
    return rows_csv(result.rows), json.dumps(summary, sort_keys=True)


@pytest.mark.parametrize("workers,ahead", [(2, 0), (2, 1), (2, 4), (3, None)])
def test_routed_workers_write_the_bytes_of_one_process(workers: int, ahead: int | None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The CSV of every row and the summary (timings aside) on routed workers equal one
    process's and the shared pool's, with small chunks so that every kind of item
    spreads over the workers."""
    import sim.search.execution
    import sim.search.sweep

    one = search(SMALL, pins=PINS_SMALL, top=3)
    monkeypatch.setattr(sim.search.execution, "SCREEN_CHUNK_MIN", 4)
    monkeypatch.setattr(sim.search.sweep, "JUDGE_CHUNK", 2)
    with RoutedExecutor(workers, ahead=ahead) as ex:
        routed = search(SMALL, pins=PINS_SMALL, top=3, executor=ex)
        assert ex.routed > 0
    with LocalExecutor(workers) as pool:
        shared = search(SMALL, pins=PINS_SMALL, top=3, executor=pool)
    assert routed.simulated == one.simulated > 0
    assert _output(routed) == _output(one) == _output(shared)


def test_make_executor_routes_unless_asked_not_to() -> None:
    assert isinstance(make_executor("local", 2), RoutedExecutor)
    assert isinstance(make_executor("local", 2, routed=False), LocalExecutor)
    assert RoutedExecutor(2).owner("x") == owner("x", 2)
    assert LocalExecutor(2).owner("x") is None
