"""The parent of a 2-worker ``sim search`` alone, for exact instruction counts of its serial
part: the workers' answers replayed from a capture, so no screening, judging or simulation
runs, only what the parent's main thread does (the pool's threads aside).

    PYTHONPATH=$PWD python benchmarks/search_replay.py capture /tmp/cap.pkl
    PYTHONPATH=$PWD valgrind --tool=callgrind --dump-before=os_getppid \\
        --callgrind-out-file=/tmp/rp/cg python benchmarks/search_replay.py replay /tmp/cap.pkl \\
        > /tmp/rp/log
    python benchmarks/search_replay.py phases /tmp/rp/cg /tmp/rp/log

``capture`` runs the default-space search of ``search-gpt3-175b-1024.yaml`` on two local
workers and keeps every layout's screening verdict, the judged verdicts and the simulation
results. ``replay`` runs :func:`sim.search.sweep.search` with an executor that answers
from the capture (two workers, four items in flight, answers in order; the items pickled
and the answers unpickled as a pool would), and ends each phase with ``os.getppid()``, on
which callgrind dumps its counts; the work of the stand-in workers is a phase of its own
(``WORKER``), as is loading the capture (``HARNESS``). ``phases`` sums the dumps by phase.
A capture made with one tree replays another's code (``--root`` is the working directory's
``PYTHONPATH``): the search's output digest printed by ``replay`` must match. Family
chunks are answered with no terms (screening chunks then carry none); a family's terms are
a few hundred bytes.
"""

from __future__ import annotations

import collections
import glob
import hashlib
import json
import os
import pickle
import re
import sys
from collections import deque
from dataclasses import replace
from pathlib import Path

FILE = "workloads/examples/search-gpt3-175b-1024.yaml"
LABELS: list[str] = []


def mark(label: str) -> None:
    """End the phase named ``label`` (callgrind dumps before ``os.getppid``)."""
    LABELS.append(label)
    os.getppid()


def capture(out: str) -> None:
    import sim.search.sweep as sw
    from sim.config import read_yaml
    from sim.executors import LocalExecutor
    from sim.search.execution import _compact

    got = {}
    collect = sw.collect_rows

    def keep(candidates, results, judged, stopped=frozenset()):  # type: ignore[no-untyped-def]
        got["args"] = ([_compact(c) for c in candidates], results, judged, stopped)
        return collect(candidates, results, judged, stopped)

    sw.collect_rows = keep
    with LocalExecutor(2) as ex:
        sw.search(read_yaml(FILE), base_dir=Path(FILE).parent, executor=ex)
    with open(out, "wb") as fh:
        pickle.dump(got["args"], fh)


def replay(path: str) -> None:
    import sim.search.execution as X
    import sim.search.sweep as SW
    from sim.config import read_yaml
    from sim.executors import Executor, is_indexed
    from sim.search.evaluation import Evaluation

    mark("startup+imports")
    with open(path, "rb") as fh:
        compact, results, judged, _stopped = pickle.load(fh)
    mark("HARNESS load capture")
    turn = [0]

    def worker_side(item):  # type: ignore[no-untyped-def]
        inner = item.item if isinstance(item, X.Relayed) else item
        if isinstance(inner, tuple):
            inner = inner[1]
        if isinstance(inner, X.FamilyChunk):
            ans = [None] * len(inner.layouts)
        elif isinstance(inner, X.ScreenChunk):
            ans = [compact[i] for i in inner.indices]
        elif isinstance(inner, X.JudgeChunk):
            ans = []
            for c in inner.candidates:
                j = judged.get(c.layout.key, c)
                ans.append(replace(j, status="ok") if j.status == "pruned" else j)
        else:
            key = inner.layout.key
            ans = results.get(key) or Evaluation(key, "error", error="not captured")
        if isinstance(item, X.Relayed):
            ans = X.Relayed(ans, (), item.upto, 1 + turn[0] % 2)
            turn[0] += 1
        return pickle.dumps(ans, 5)

    phase = ["screening set-up (before the first item)"]
    current = ["?"]

    class Replay(Executor):
        name = "replay"
        workers = 2

        def stream(self, task, feed):  # type: ignore[no-untyped-def]
            indexed = is_indexed(task)
            queue: deque = deque()
            while True:
                while len(queue) < 4:
                    item = feed()
                    if phase[0] is not None:
                        mark(phase[0])
                        phase[0] = None
                    if item is None:
                        break
                    pickle.dumps(item, 5)  # as the pool pickles it
                    queue.append(item)
                if not queue:
                    return
                item = queue.popleft()
                mark(current[0])
                blob = worker_side(item[1] if indexed else item)
                mark("WORKER side (excluded)")
                yield item, pickle.loads(blob)  # as the pool unpickles the answer

    def around(fn, before, during, after):  # type: ignore[no-untyped-def]
        def wrapped(*a, **k):  # type: ignore[no-untyped-def]
            mark(before)
            current[0] = during
            out = fn(*a, **k)
            mark(during)
            current[0] = after
            return out
        return wrapped

    SW.screen_all = around(SW.screen_all, "search: context, enumeration",
                           "screening (concurrent)", "screened -> sweep")
    run = around(SW._Sweep.run, "screened -> sweep", "sweep (concurrent)", "after the sweep")

    def first_feed(self, ex, task):  # type: ignore[no-untyped-def]
        phase[0] = "sweep: first feed"
        return run(self, ex, task)

    SW._Sweep.run = first_feed
    SW.collect_rows = around(SW.collect_rows, "after the sweep", "rows",
                             "after rows: counts, result")
    result = SW.search(read_yaml(FILE), base_dir=Path(FILE).parent, executor=Replay())
    mark("after rows: counts, result")
    summary = result.summary()
    summary["db"] = None
    json.dumps(summary, indent=2)
    mark("summary + JSON")
    for k in ("elapsed_s", "screen_s", "layouts_per_s", "speculated", "discarded"):
        summary.pop(k)
    digest = hashlib.sha1(json.dumps(summary).encode()).hexdigest()[:12]
    print(len(result.rows), result.simulated, summary["best"]["key"], digest)
    print("LABELS", json.dumps(LABELS))


def phases(prefix: str, log: str) -> None:
    with open(log) as fh:
        labels = json.loads(fh.read().split("LABELS ", 1)[1].splitlines()[0])
    parts = [p for p in glob.glob(prefix + ".*") if re.search(r"\.\d+$", p)]
    parts.sort(key=lambda p: int(p.rsplit(".", 1)[1]))
    sums: dict[str, int] = collections.OrderedDict()
    for label, part in zip(labels, parts, strict=True):
        with open(part) as fh:
            n = next(int(line.split()[1]) for line in fh if line.startswith("summary:"))
        sums[label] = sums.get(label, 0) + n
    for label, n in sums.items():
        print(f"{n / 1e6:10.1f} M  {label}")
    own = sum(n for label, n in sums.items() if not label.startswith(("HARNESS", "WORKER")))
    print(f"{own / 1e6:10.1f} M  the parent in all (harness and worker side aside)")


if __name__ == "__main__":
    cmd, *args = sys.argv[1:] or ["-h"]
    if cmd not in ("capture", "replay", "phases"):
        sys.exit(__doc__)
    {"capture": capture, "replay": replay, "phases": phases}[cmd](*args)
