"""Executors: in-process, local worker processes and a real local Ray runtime.

Whatever runs a sweep, its results are the same; a lost worker is retried and
then reported; Ctrl-C stops a multi-process sweep cleanly.
"""

from __future__ import annotations

import json
import operator
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT
from test_search import (
    KILL_PINS,
    PINS_SMALL,
    SMALL,
    _db_keys,
    _interrupt,
    _small,
    _write,
    default_sigint,
)

from base.errors import ConfigError
from sim.executors import (
    InlineExecutor,
    LocalExecutor,
    RayExecutor,
    Task,
    WorkerFailure,
    make_executor,
)
from sim.search import ResultStore, SearchResult, search

UPPER = Task(operator.methodcaller, ("upper",))
"""A task every worker can rebuild: ``item.upper()``."""


def _same_results(a: SearchResult, b: SearchResult) -> bool:
    return [(r.layout, r.status, r.stats, r.error, r.rank) for r in a.rows] == [
        (r.layout, r.status, r.stats, r.error, r.rank) for r in b.rows]


def test_inline_and_local_run_every_item_once() -> None:
    items = [f"item{i}" for i in range(12)]
    for executor in (InlineExecutor(), LocalExecutor(2)):
        with executor:
            got = dict(executor.run(UPPER, items))
            again = dict(executor.run(UPPER, items[:3]))  # the workers are reused
        assert got == {i: s.upper() for i, s in enumerate(items)}
        assert again == {0: "ITEM0", 1: "ITEM1", 2: "ITEM2"}


def test_worker_cpu_is_reported_per_process() -> None:
    """The benchmark's CPU seconds: none for items run in the calling process, one figure
    per live worker process for local workers, summing to the total."""
    with InlineExecutor() as inline:
        dict(inline.run(UPPER, ["a"]))
        assert inline.worker_cpu_each() == [] and inline.worker_cpu_s() == 0
    with LocalExecutor(2) as local:
        dict(local.run(UPPER, [f"item{i}" for i in range(8)]))
        each = local.worker_cpu_each()
        if each is None:  # no /proc here
            pytest.skip("no /proc to read CPU times from")
        assert len(each) == 2 and all(t >= 0 for t in each)
        assert local.worker_cpu_s() == pytest.approx(sum(each), abs=0.1)  # idle workers


def test_stream_feeds_items_from_the_outcomes_seen() -> None:
    """``stream`` asks ``feed`` whenever a worker is free; the feed may wait (``None``) for
    outcomes and derive new items from them: every item runs once, whatever runs it."""
    for executor in (InlineExecutor(), LocalExecutor(2)):
        seen: list[str] = []
        queue = ["a", "b"]

        def feed(queue: list[str] = queue) -> str | None:
            return queue.pop(0) if queue else None

        with executor:
            for item, outcome in executor.stream(UPPER, feed):
                seen.append(outcome)
                if len(item) < 3:  # every outcome spawns two longer items
                    queue += [item + "x", item + "y"]
        assert sorted(seen) == sorted(s.upper() for s in
                                      ("a", "b", "ax", "ay", "bx", "by", "axx", "axy", "ayx",
                                       "ayy", "bxx", "bxy", "byx", "byy"))


class _Recording(LocalExecutor):
    """Local workers, recording the kind of every item handed out."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.kinds: list[str] = []

    def stream(self, task, feed):  # type: ignore[no-untyped-def]
        def recorded():  # type: ignore[no-untyped-def]
            item = feed()
            if item is not None:
                inner = item[1] if isinstance(item, tuple) else item
                inner = getattr(inner, "item", inner)  # a TimingRelay's wrapping (Relayed)
                self.kinds.append(type(inner).__name__)
            return item

        return super().stream(task, recorded)


@pytest.mark.parametrize("workers", [2, 3])
def test_screening_judging_and_speculation_on_workers_give_identical_results(
        workers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small chunks, so that screening, judging and speculative simulations all spread over
    the workers: the rows (statuses, bounds, figures, ranks) are those of one process, and
    only results the serial order wants are stored."""
    import sim.search.execution
    import sim.search.sweep

    monkeypatch.setattr(sim.search.execution, "SCREEN_CHUNK_MIN", 4)
    monkeypatch.setattr(sim.search.sweep, "JUDGE_CHUNK", 2)
    inline = search(SMALL, pins=PINS_SMALL, top=3)
    store = ResultStore()
    with _Recording(workers) as executor:
        spread = search(SMALL, pins=PINS_SMALL, top=3, executor=executor, store=store)
    assert {"ScreenChunk", "JudgeChunk", "SimulateOne"} <= set(executor.kinds)
    assert executor.kinds.count("ScreenChunk") >= 2 * workers
    assert _same_results(spread, inline)
    assert [(r.memory_bound_gib, r.tokens_bound) for r in spread.rows] == [
        (r.memory_bound_gib, r.tokens_bound) for r in inline.rows]
    assert spread.simulated == inline.simulated == store.count()
    assert inline.speculated == inline.discarded == 0  # one process never speculates


def _die_on(marker: str) -> object:
    """A worker function that kills its own process on ``"die"`` and, once, on ``"once"``
    (the marker file records that it died already)."""

    def fn(item: str) -> str:
        if item == "die" or (item == "once" and not os.path.exists(marker)):
            if item == "once":
                Path(marker).touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return item.upper()

    return fn


def test_a_lost_worker_is_retried_once_then_reported(tmp_path: Path) -> None:
    task = Task(_die_on, (str(tmp_path / "died-once"),))
    with LocalExecutor(2) as executor:
        got = dict(executor.run(task, ["a", "once", "b", "die", "c"]))
    assert got[0] == "A" and got[1] == "ONCE" and got[2] == "B" and got[4] == "C"
    assert isinstance(got[3], WorkerFailure) and "died" in got[3].message


def test_results_are_identical_in_process_and_in_local_workers() -> None:
    with LocalExecutor(2) as executor:
        local = search(SMALL, pins=PINS_SMALL, top=3, executor=executor)
    assert local.simulated > 0
    assert _same_results(local, _small(True))


@pytest.mark.parametrize("ahead", [0, 1, 4])
def test_one_and_two_workers_write_the_same_bytes(ahead: int) -> None:
    """What ``sim search`` writes (the CSV of every row, the summary without its timings)
    is byte for byte the same on one worker and on two, however many items the pool
    queues beyond its workers."""
    from sim.search.results import rows_csv

    def output(result: SearchResult) -> tuple[str, str]:
        summary = {k: v for k, v in result.summary().items()
                   if k not in ("elapsed_s", "screen_s", "layouts_per_s", "speculated",
                                "discarded")}
        return rows_csv(result.rows), json.dumps(summary, sort_keys=True)

    one = search(SMALL, pins=PINS_SMALL, top=3)
    with LocalExecutor(2, ahead=ahead) as executor:
        two = search(SMALL, pins=PINS_SMALL, top=3, executor=executor)
    assert two.simulated == one.simulated > 0
    assert output(two) == output(one)


def _search_on_two_workers(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """``sim search`` of the small experiment on two local workers, as a subprocess with
    its output piped; and its results database."""
    exp = _write(tmp_path, SMALL)
    db = tmp_path / "r.sqlite"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim", "search", str(exp), "--db", str(db), "--json",
         "--workers", "2", "--exhaustive", "--fix", KILL_PINS],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_sigint)
    return proc, db


def test_ctrl_c_stops_local_workers_and_keeps_results(tmp_path: Path) -> None:
    proc, db = _search_on_two_workers(tmp_path)
    err = _interrupt(proc, db, 3, signal.SIGINT)
    assert proc.returncode == 130 and err.strip() == "error: interrupted"
    assert len(_db_keys(db)) >= 3


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc: a forkserver's workers are its
    children, the forkserver the search's)."""
    parent_of = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent_of[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parent_of.items() if parent in frontier} - found
        found |= frontier
    return found


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_sigkill_of_a_search_leaves_no_worker_behind(tmp_path: Path) -> None:
    """Issue 21: after SIGKILL of ``sim search`` its worker processes kept running their
    items (~230 MB); each worker now exits within WATCH_PARENT_S of its parent."""
    proc, db = _search_on_two_workers(tmp_path)
    deadline = time.monotonic() + 60
    while len(_db_keys(db)) < 2:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    helpers = _descendants(proc.pid)
    assert len(helpers) >= 2  # the workers (and a forkserver)
    proc.kill()
    proc.wait(timeout=10)  # (its pipes stay open while a worker holds them)
    deadline = time.monotonic() + 10
    while alive := {p for p in helpers if _running(p)}:
        assert time.monotonic() < deadline, f"still running after the search was killed: {alive}"
        time.sleep(0.1)
    proc.stdout.close()
    proc.stderr.close()


def test_make_executor_choices_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(make_executor("local", 1), InlineExecutor)
    assert isinstance(make_executor("local", 3), LocalExecutor)
    for args, needle in ((("spark",), "--executor='spark'"), (("local", 0), "--workers=0"),
                         (("local", 2, "auto"), "only used with --executor ray")):
        with pytest.raises(ConfigError, match=needle):
            make_executor(*args)
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(ConfigError, match="pip install"):
        make_executor("ray", 2)


# ----------------------------------------------------------------------------- Ray


@pytest.fixture(scope="module")
def ray_runtime():  # type: ignore[no-untyped-def]
    """A real local Ray runtime with two CPUs (not a mock)."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install '.[ray]')")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    yield ray
    ray.shutdown()


def test_ray_runs_tasks_on_actors(ray_runtime) -> None:  # type: ignore[no-untyped-def]
    with RayExecutor(workers=2) as executor:
        got = dict(executor.run(UPPER, ["a", "b", "c"]))
    assert got == {0: "A", 1: "B", 2: "C"}
    assert ray_runtime.is_initialized()  # a runtime it did not start is left running


def test_results_are_identical_on_ray(ray_runtime) -> None:  # type: ignore[no-untyped-def]
    with RayExecutor(workers=2) as executor:
        on_ray = search(SMALL, pins=PINS_SMALL, top=3, executor=executor)
    assert on_ray.simulated > 0
    assert _same_results(on_ray, _small(True))


def test_cli_search_on_ray(ray_runtime, tmp_path: Path,  # type: ignore[no-untyped-def]
                           capsys: pytest.CaptureFixture) -> None:
    from sim.cli import main

    exp = _write(tmp_path, SMALL)
    assert main(["search", str(exp), "--executor", "ray", "--workers", "2", "--json",
                 "--top", "1", "--fix", "tp=1,pp=2,mbs=1,recompute=none,zero=1"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["best"]["parallel"]["pp"] == 2 and summary["simulated"] >= 1
