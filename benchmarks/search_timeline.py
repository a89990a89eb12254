"""Where a multi-worker ``sim search`` loses against one worker: its serial part and the
workers' idle time, measured directly.

    python benchmarks/search_timeline.py [--root DIR] [--workers 2] [--file EXPERIMENT]

Runs the search of ``workloads/examples/search-gpt3-175b-1024.yaml`` (default space) on
local workers, with the code of ``--root`` (default: this checkout; pass a ``git archive``
export of another commit to measure it the same way), and prints:

- the parent's CPU seconds per phase (main thread and the pool's helper threads): before
  the first work item is handed out (context, enumeration, screening's bookkeeping), while
  the workers screen, between screening and the sweep, during the sweep, and after the
  last result (the rows);
- per worker: its items by kind (count, wall, CPU), when it started its first and ended its
  last, and its idle wall time between items (at a change of phase, within phases, and
  after its last item while the other worker still ran);
- the Amdahl estimate of the wall time on an idle machine with one core per worker: the
  parent's serial CPU (head, the gap between screening and the sweep, tail) plus the
  parallel CPU (the workers' and the parent's concurrent part) spread evenly over the
  workers, and the busiest worker's CPU plus the serial part (the slower of the two).

Wall times on a loaded machine are inflated by the load; CPU seconds much less. Not a
timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def phase_marks(executors, sweep):  # type: ignore[no-untyped-def]
    """Mark the parent's phases of a search: ``(marks, mark)``, ``mark(name)`` appending
    ``(name, wall, main-thread CPU, process CPU)`` to ``marks``, and ``sim.search.sweep``'s
    screening, sweep and rows and the first item handed to a worker marked around (the
    modules are the imported ``sim.executors`` and ``sim.search.sweep`` of the code measured;
    ``benchmarks/search_split.py`` uses it too)."""
    marks: list[tuple[str, float, float, float]] = []

    def mark(name: str) -> None:
        marks.append((name, time.perf_counter(), time.thread_time(), time.process_time()))

    def around(fn, before, after):  # type: ignore[no-untyped-def]
        def wrapped(*a, **k):  # type: ignore[no-untyped-def]
            mark(before)
            out = fn(*a, **k)
            mark(after)
            return out
        return wrapped

    def first_out(fn):  # type: ignore[no-untyped-def]
        def wrapped(self, *a):  # type: ignore[no-untyped-def]
            if not any(m[0] == "first item out" for m in marks):
                mark("first item out")
            return fn(self, *a)
        return wrapped

    executors.LocalExecutor._submit = first_out(executors.LocalExecutor._submit)
    try:  # workers with a queue each (sim.routed, 72aae59), where the measured code has them
        import sim.routed as routed
    except ImportError:
        routed = None
    if routed is not None:
        routed.RoutedExecutor._send = first_out(routed.RoutedExecutor._send)
    sweep.screen_all = around(sweep.screen_all, "screening", "screened")
    sweep._Sweep.run = around(sweep._Sweep.run, "sweep", "swept")
    sweep.collect_rows = around(sweep.collect_rows, "rows", "rows built")
    return marks, mark


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(ROOT))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--file", default="workloads/examples/search-gpt3-175b-1024.yaml")
    args = ap.parse_args()
    sys.path.insert(0, args.root)
    import sim.executors as executors
    import sim.search.execution as execution
    import sim.search.sweep as sweep
    from sim.config import read_yaml

    log = Path(tempfile.mkdtemp()) / "items"
    call = execution.SearchWorker.__call__

    def timed(self, item):  # type: ignore[no-untyped-def]
        inner = getattr(item, "item", item)
        t0, c0 = time.perf_counter(), time.process_time()
        out = call(self, item)
        if os.getpid() != parent_pid and inner is not item:  # a worker's item (a relay's
            # wrapping: the inner call, its answer, is not logged again)
            with open(log, "a") as f:  # one line per item, from the worker process
                f.write(json.dumps([os.getpid(), type(inner).__name__, t0,
                                    time.perf_counter(), time.process_time() - c0]) + "\n")
        return out

    execution.SearchWorker.__call__ = timed
    marks, mark = phase_marks(executors, sweep)
    parent_pid = os.getpid()
    data = read_yaml(os.path.join(args.root, args.file))
    mark("start")
    with executors.make_executor("local", args.workers) as executor:
        result = sweep.search(data, top=10, executor=executor)
        each = executor.worker_cpu_each() or []
    mark("end")
    items = [json.loads(line) for line in log.read_text().splitlines()]
    log.unlink()
    marks.sort(key=lambda m: m[1])
    at = {m[0]: m for m in marks}
    print(f"{Path(args.file).name}, {args.workers} workers, code of {args.root}: "
          f"{result.evaluated:,} layouts, {result.simulated} simulated, best "
          f"{result.best.layout.label() if result.best else 'none'}; load "
          f"{os.getloadavg()[0]:.1f}")
    print("parent, by phase:             wall s   main-thread CPU s   process CPU s")
    for a, b in zip(marks, marks[1:], strict=False):
        print(f"  {a[0]:>14} -> {b[0]:<14} {b[1] - a[1]:7.2f} {b[2] - a[2]:14.2f} "
              f"{b[3] - a[3]:15.2f}")
    parent = at["end"][3] - at["start"][3]
    head = at["first item out"][3] - at["start"][3]
    gap = at["sweep"][3] - at["screened"][3]
    tail = at["end"][3] - at["swept"][3]
    serial = head + gap + tail
    first = min(x[2] for x in items)
    last = max(x[3] for x in items)
    print(f"  parent CPU {parent:.2f} s: serial {serial:.2f} (before the first item "
          f"{head:.2f}, screening -> sweep {gap:.2f}, after the sweep {tail:.2f}), "
          f"concurrent {parent - serial:.2f}; wall before the first item starts "
          f"{first - at['start'][1]:.2f} s, after the last ends {at['end'][1] - last:.2f} s")
    by: dict[int, list] = defaultdict(list)
    for x in items:
        by[x[0]].append(x)
    phase = {"FamilyChunk": 0, "ScreenChunk": 0}
    for pid, xs in sorted(by.items()):
        xs.sort(key=lambda x: x[2])
        kinds: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        for x in xs:
            k = kinds[x[1]]
            k[0] += 1
            k[1] += x[3] - x[2]
            k[2] += x[4]
        change = within = 0.0
        for a, b in zip(xs, xs[1:], strict=False):
            if phase.get(a[1], 1) != phase.get(b[1], 1):
                change += b[2] - a[3]
            else:
                within += b[2] - a[3]
        print(f"  worker {pid}: " + ", ".join(f"{k} {int(v[0])} ({v[1]:.2f} s wall, "
                                               f"{v[2]:.2f} CPU)" for k, v in kinds.items()))
        print(f"    first item at {xs[0][2] - at['start'][1]:.2f} s, idle: screening -> sweep "
              f"{change:.2f} s, within phases {within:.2f} s, after its last item "
              f"{last - xs[-1][3]:.2f} s")
    workers_cpu = sum(each)
    even = serial + (workers_cpu + parent - serial) / args.workers
    busiest = serial + max(each, default=0.0)
    print(f"  workers CPU {' + '.join(f'{c:.2f}' for c in each)} = {workers_cpu:.2f} s")
    print(f"Amdahl estimate of the idle {args.workers}-core wall: serial {serial:.2f} + "
          f"parallel {workers_cpu + parent - serial:.2f} / {args.workers} = {even:.2f} s; "
          f"serial + busiest worker {busiest:.2f} s; the larger: {max(even, busiest):.2f} s")


if __name__ == "__main__":
    main()
