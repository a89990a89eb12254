"""Where two workers of ``sim search`` lose against one, in figures that do not depend on
the machine's load: CPU seconds per worker and per kind of work item, the cost of every
simulated layout on one worker and on two, the cache hits of each worker, the parent's
serial CPU, the bytes pickled.

    python benchmarks/search_split.py [--root DIR] [--workers 1,2] [--file EXPERIMENT]
                                      [--json OUT]

Runs the search of ``workloads/examples/search-gpt3-175b-1024.yaml`` (default space) once
per worker count, each in a fresh process forked from this one (as ``benchmarks/search.py``
does: a search leaves its caches warm), with the code of ``--root`` (default: this checkout;
a ``git archive`` export of another commit measures that commit the same way). For each
run it records, inside each worker process (and in the calling process for one worker,
which runs items inline):

- every work item: its kind, CPU seconds (``time.process_time``), for a simulation the
  layout's key;
- per worker, cumulative: hits and misses of the lowering's and the engine's structure
  memos (every :class:`base.equalmemo.EqualMemo`, named by the module global that holds it,
  and :func:`sim.colshape.shape_of`'s kept shapes), schedules built by judging
  (:func:`sim.search.plan.build_plan`), collectives timed
  (:meth:`sim.commtime.CollectiveTimer._timed`), bytes pickled for the pool's queues;
- the parent: CPU before the first item is handed out, between screening and the sweep,
  after the last result, and in all (so its concurrent part), and the bytes it pickled.

And prints, for two workers against one: the CPU per kind of item (summed over the workers,
against one worker's), the simulations' extra CPU layout by layout, the cache hits, and the
estimate of the idle 2-core wall time, ``serial parent CPU + max over workers of (its CPU +
its share of the parent's concurrent CPU)``, with the speed-up it gives against the
one-worker CPU. Not a timed test.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from search_timeline import phase_marks  # benchmarks/, this script's folder

ROOT = Path(__file__).resolve().parent.parent


def _instrument(log: Path, profile: str | None = None) -> tuple[dict[str, Any], list]:
    """Patch the search's modules to record what the module docstring lists; returns the
    counters of this process (forked workers inherit the patches and fresh copies)."""
    import pickle
    from multiprocessing import reduction

    import base.equalmemo as equalmemo
    import sim.colshape as colshape
    import sim.commtime as commtime
    import sim.executors as executors
    import sim.search.execution as execution
    import sim.search.plan as plan
    import sim.search.sweep as sweep

    counts: dict[str, Any] = {"pid": os.getpid(), "memo": defaultdict(lambda: [0, 0]),
                              "plans": 0, "timed": 0, "pickled": 0, "pickles": 0, "schedules": 0,
                              "costs": []}
    names: dict[int, str] = {}

    def memo_name(memo: Any) -> str:
        name = names.get(id(memo))
        if name is None:
            for mod_name, mod in list(sys.modules.items()):
                for k, v in list(getattr(mod, "__dict__", {}).items()):
                    if v is memo:
                        name = f"{mod_name.rsplit('.', 1)[-1]}.{k}"
                        break
                if name:
                    break
            names[id(memo)] = name = name or f"memo@{id(memo):x}"
        return name

    get = equalmemo.EqualMemo.get

    def counted_get(self, args, make):  # type: ignore[no-untyped-def]
        made = []

        def mk():  # type: ignore[no-untyped-def]
            made.append(1)
            return make()
        out = get(self, args, mk)
        counts["memo"][memo_name(self)][1 if made else 0] += 1
        return out
    equalmemo.EqualMemo.get = counted_get

    shape_of = colshape.shape_of

    def counted_shape(columns):  # type: ignore[no-untyped-def]
        before = list(colshape._kept)
        known = colshape._of.get(columns) is not None
        out = shape_of(columns)
        if not known:
            counts["memo"]["colshape.shape_of"][0 if any(out is s for s in before) else 1] += 1
        return out
    colshape.shape_of = counted_shape
    for mod in list(sys.modules.values()):  # modules that imported the name
        if getattr(mod, "shape_of", None) is shape_of and mod is not colshape:
            mod.shape_of = counted_shape

    build = plan.build_plan

    def counted_build(*a, **k):  # type: ignore[no-untyped-def]
        counts["plans"] += 1
        c0 = time.process_time()
        out = build(*a, **k)
        counts["costs"].append(["plan", repr(a[:4]), time.process_time() - c0])
        return out
    plan.build_plan = counted_build
    schedule = plan.build_schedule

    def counted_schedule(*a, **k):  # type: ignore[no-untyped-def]
        counts["schedules"] += 1  # build_plan's and those of plans relayed without theirs
        return schedule(*a, **k)
    plan.build_schedule = counted_schedule
    for mod in list(sys.modules.values()):
        if getattr(mod, "build_plan", None) is build and mod is not plan:
            mod.build_plan = counted_build

    timed = commtime.CollectiveTimer._timed

    def counted_timed(self, op, groups, nbytes):  # type: ignore[no-untyped-def]
        counts["timed"] += 1
        c0 = time.process_time()
        out = timed(self, op, groups, nbytes)
        counts["costs"].append(["timing", repr((op, groups, nbytes)), time.process_time() - c0])
        return out
    commtime.CollectiveTimer._timed = counted_timed

    dumps = reduction.ForkingPickler.dumps

    def counted_dumps(obj, protocol=None):  # type: ignore[no-untyped-def]
        out = dumps(obj, protocol)
        counts["pickled"] += len(out)
        counts["pickles"] += 1
        return out
    reduction.ForkingPickler.dumps = classmethod(  # type: ignore[method-assign]
        lambda cls, obj, protocol=None: counted_dumps(obj, protocol))
    del pickle

    call = execution.SearchWorker.__call__

    def logged(self, item):  # type: ignore[no-untyped-def]
        if os.getpid() != counts["pid"]:  # a forked worker: its own counters
            counts["pid"] = os.getpid()
            counts["memo"].clear()
            counts["costs"] = []
            for k in ("plans", "timed", "pickled", "pickles", "schedules"):
                counts[k] = 0
        c0 = time.process_time()
        if profile and type(item).__name__ != "Relayed":
            prof = counts.get("profiler")
            if prof is None or counts.get("profiler_pid") != os.getpid():
                prof = counts["profiler"] = cProfile.Profile()
                counts["profiler_pid"] = os.getpid()
            prof.enable()
            try:
                out = call(self, item)
            finally:
                prof.disable()
                prof.dump_stats(f"{profile}.{os.getpid()}")
        else:
            out = call(self, item)
        cpu = time.process_time() - c0
        kind = type(item).__name__
        inner = item.item if kind == "Relayed" else item
        line = {"pid": os.getpid(), "kind": kind if kind != "Relayed" else "relay",
                "inner": type(inner).__name__, "cpu": cpu,
                "n": len(getattr(inner, "indices", ()) or getattr(inner, "candidates", ())
                         or getattr(inner, "layouts", ())),
                "key": inner.layout.key if kind == "SimulateOne" else None,
                "memo": {k: list(v) for k, v in counts["memo"].items()},
                "plans": counts["plans"], "timed": counts["timed"],
                "schedules": counts["schedules"],
                "pickled": counts["pickled"], "pickles": counts["pickles"],
                "costs": counts["costs"]}
        counts["costs"] = []
        with open(log, "a") as f:
            f.write(json.dumps(line) + "\n")
        return out
    execution.SearchWorker.__call__ = logged

    marks, mark = phase_marks(executors, sweep)
    counts["mark"] = mark
    return counts, marks


def _child(send: Any, root: str, file: str, workers: int, profile: str | None) -> None:
    sys.path.insert(0, root)
    log = Path(tempfile.mkdtemp()) / "items"
    counts, marks = _instrument(log, profile and f"{profile}/w{workers}")
    import sim.executors as executors
    import sim.search.sweep as sweep
    from sim.config import read_yaml

    data = read_yaml(os.path.join(root, file))
    counts["mark"]("start")
    with executors.make_executor("local", workers) as executor:
        result = sweep.search(data, top=10, executor=executor)
        each = executor.worker_cpu_each() or []
        routed = (getattr(executor, "routed", None), getattr(executor, "stolen", None))
    counts["mark"]("end")
    items = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    at = {m[0]: m for m in marks}
    parent = at["end"][3] - at["start"][3]
    if workers > 1:
        head = at["first item out"][3] - at["start"][3]
        gap = at["sweep"][3] - at["screened"][3]
        tail = at["end"][3] - at["swept"][3]
    else:
        head = gap = tail = 0.0
    send.send({"workers": workers, "items": items, "each": each, "parent": parent,
               "serial": head + gap + tail, "head": head, "gap": gap, "tail": tail,
               "parent_pickled": counts["pickled"], "parent_pickles": counts["pickles"],
               "parent_memo": {k: list(v) for k, v in counts["memo"].items()},
               "simulated": result.simulated, "evaluated": result.evaluated,
               "best": result.best.layout.label() if result.best else "none",
               "load": os.getloadavg()[0], "routed": routed})
    send.close()


def run(root: str, file: str, workers: int, profile: str | None = None) -> dict[str, Any]:
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(send, root, file, workers, profile))
    child.start()
    send.close()
    out = recv.recv()
    child.join()
    return out


def summarize(run_: dict[str, Any]) -> dict[str, Any]:
    """Per worker (pid): CPU by inner kind, relay overhead, last counters; sims by key."""
    per: dict[int, dict[str, Any]] = {}
    sims: dict[str, float] = {}
    inner_cpu: dict[int, float] = defaultdict(float)
    for x in run_["items"]:
        w = per.setdefault(x["pid"], {"kinds": defaultdict(lambda: [0, 0, 0.0]), "last": x,
                                      "relay": 0.0})
        w["last"] = x
        if x["kind"] == "relay":
            w["relay"] += x["cpu"] - inner_cpu.pop(x["pid"], 0.0)
            continue
        k = w["kinds"][x["kind"]]
        k[0] += 1
        k[1] += x["n"]
        k[2] += x["cpu"]
        inner_cpu[x["pid"]] = x["cpu"]
        if x["key"]:
            sims[x["key"]] = x["cpu"]
    return {"per": per, "sims": sims}


def report(runs: list[dict[str, Any]]) -> None:
    one = next((r for r in runs if r["workers"] == 1), None)
    for r in runs:
        s = summarize(r)
        print(f"--- {r['workers']} worker(s): {r['evaluated']:,} layouts, {r['simulated']} "
              f"simulated, best {r['best']}; load at end {r['load']:.1f}")
        print(f"  parent CPU {r['parent']:.2f} s (serial {r['serial']:.2f}: before the first "
              f"item {r['head']:.2f}, screening -> sweep {r['gap']:.2f}, after the sweep "
              f"{r['tail']:.2f}); pickled {r['parent_pickled'] / 1e6:.2f} MB in "
              f"{r['parent_pickles']} messages")
        totals: dict[str, list] = defaultdict(lambda: [0, 0, 0.0])
        memo_tot: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        worker_cpu = {}
        for pid, w in sorted(s["per"].items()):
            cpu = sum(k[2] for k in w["kinds"].values()) + w["relay"]
            worker_cpu[pid] = cpu
            last = w["last"]
            print(f"  worker {pid}: items CPU {cpu:.2f} s (relay {w['relay']:.2f}); "
                  + ", ".join(f"{k} {v[0]}x/{v[1]} {v[2]:.2f} s"
                              for k, v in sorted(w["kinds"].items()))
                  + f"; plans {last['plans']} (schedules built again for relayed plans "
                  f"{last.get('schedules', last['plans']) - last['plans']}), collectives "
                  f"timed {last['timed']}, pickled "
                  f"{last['pickled'] / 1e6:.2f} MB")
            print("    memo hit/miss: " + ", ".join(
                f"{k} {v[0]}/{v[1]}" for k, v in sorted(last["memo"].items())))
            for k, v in w["kinds"].items():
                t = totals[k]
                t[0] += v[0]
                t[1] += v[1]
                t[2] += v[2]
            for k, v in last["memo"].items():
                memo_tot[k][0] += v[0]
                memo_tot[k][1] += v[1]
        if (r.get("routed") or [None])[0] is not None:
            print(f"  items sent to their owner {r['routed'][0]}, taken by another worker "
                  f"{r['routed'][1]}")
        if r["each"]:
            print("  workers' process CPU (getrusage/proc): "
                  + " + ".join(f"{c:.2f}" for c in r["each"]) + f" = {sum(r['each']):.2f} s")
        if r["workers"] > 1:
            busiest = max(r["each"]) if r["each"] else max(worker_cpu.values())
            concurrent = r["parent"] - r["serial"]
            est = r["serial"] + busiest + concurrent / r["workers"]
            print(f"  estimate of the idle {r['workers']}-core wall: serial {r['serial']:.2f} + "
                  f"busiest worker {busiest:.2f} + parent's concurrent {concurrent:.2f} / "
                  f"{r['workers']} = {est:.2f} s")
            if one:
                print(f"  speed-up estimate: one worker's CPU {one['parent']:.2f} / {est:.2f}"
                      f" = {one['parent'] / est:.2f}  (the old estimate, one / (parent + "
                      f"busiest): {one['parent'] / (r['parent'] + busiest):.2f})")
        if one and r is not one:
            s1 = summarize(one)
            k1 = next(iter(s1["per"].values()))["kinds"] if s1["per"] else {}
            print("  CPU by kind, all workers against one worker:")
            for k in sorted(set(totals) | set(k1)):
                a, b = totals.get(k, [0, 0, 0.0]), k1.get(k, [0, 0, 0.0])
                print(f"    {k:12} {a[2]:7.2f} s ({a[0]} items) against {b[2]:7.2f} s "
                      f"({b[0]} items): {a[2] - b[2]:+.2f}")
            m1 = next(iter(s1["per"].values()))["last"]["memo"] if s1["per"] else {}
            print("  memo hits/misses, all workers against one worker:")
            for k in sorted(set(memo_tot) | set(m1)):
                a, b = memo_tot.get(k, [0, 0]), m1.get(k, [0, 0])
                print(f"    {k:34} {a[0]:6}/{a[1]:<6} against {b[0]:6}/{b[1]:<6}")
            by_worker: dict[str, dict[int, float]] = defaultdict(dict)
            kinds_of: dict[str, str] = {}
            for x in r["items"]:
                for kind, key, cpu in x.get("costs", ()):
                    by_worker[key][x["pid"]] = by_worker[key].get(x["pid"], 0.0) + cpu
                    kinds_of[key] = kind
            one_costs = Counter()
            for x in one["items"]:
                for kind, _key, cpu in x.get("costs", ()):
                    one_costs[kind] += cpu
            for kind in ("plan", "timing"):
                keys = [k for k in by_worker if kinds_of[k] == kind]
                twice = [k for k in keys if len(by_worker[k]) > 1]
                dup = sum(sum(v.values()) - max(v.values()) for k in twice
                          for v in [by_worker[k]])
                made = sum(sum(by_worker[k].values()) for k in keys)
                print(f"  {kind}s: {len(keys)} distinct, {len(twice)} made in both workers, "
                      f"their second making {dup:.2f} CPU s; all {kind}s {made:.2f} s"
                      f" against {one_costs[kind]:.2f} s on one worker")
            both = sorted(set(s["sims"]) & set(s1["sims"]))
            diff = sorted(((s["sims"][k] - s1["sims"][k], k) for k in both), reverse=True)
            extra = sum(d for d, _ in diff)
            mine = sum(s["sims"][k] for k in both)
            print(f"  simulations of the same {len(both)} layouts: {mine:.2f}"
                  f" s against {sum(s1['sims'][k] for k in both):.2f} s ({extra:+.2f});"
                  f" largest extra: " + ", ".join(f"{k} {d:+.3f}" for d, k in diff[:5]))
            only = set(s["sims"]) ^ set(s1["sims"])
            if only:
                print(f"  layouts simulated in only one of the runs: {len(only)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(ROOT))
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--file", default="workloads/examples/search-gpt3-175b-1024.yaml")
    ap.add_argument("--json", help="write the raw records here")
    ap.add_argument("--profile", metavar="DIR",
                    help="also cProfile every work item, per process: DIR/wN.PID (N workers); "
                         "compare the call counts of w1.* and w2.* with pstats (exact "
                         "whatever the load, unlike cProfile's times)")
    args = ap.parse_args()
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    runs = [run(os.path.abspath(args.root), args.file, int(w), args.profile)
            for w in args.workers.split(",")]
    if args.json:
        Path(args.json).write_text(json.dumps(runs))
    report(runs)


if __name__ == "__main__":
    main()
