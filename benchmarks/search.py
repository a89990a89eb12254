"""Layouts evaluated per second by ``sim search``: GPT-3 175B on 1,024 A100-80GB.

    python benchmarks/search.py [--workers 1,2] [--repeat 3] [--top 10] [--exhaustive-sample 40]
                                [--fix 'cp=1,zero=0|1|2']
    python benchmarks/search.py --hagemann [--data sim/data/validation/hagemann2023_sweep.csv]

Runs the whole search of ``workloads/examples/search-gpt3-175b-1024.yaml``
(every layout of tp, pp, dp, cp, vpp, micro-batch size, SP, ZeRO 0-3,
recomputation and the schedules; global batch 1,536; ``--fix`` narrows it)
from scratch (an in-memory results database) once per repeat and worker count,
each in a fresh process forked from this one (a search run after another in one
process would find its caches warm, and its forked workers with them),
(repeats interleaved: 1, 2, 1, 2, ... workers, so load drifts hit both alike)
and prints one table: layouts enumerated and evaluated (judged by the memory
bound, the throughput bound or a simulation), how many were simulated, wall
time and its screening part, the rate, the CPU seconds of this process and
of the worker processes (from ``/proc``; less noisy than wall time on a
shared machine) and per layout, and the median time of one collapsed
simulation. ``spec/wasted/judged``: simulations started ahead of the serial
order by idle workers, those discarded, and candidates judged past the point
where the sweep stopped.
``--exhaustive-sample N`` also times N simulations alone (no bounds), the
rate a search without pruning would have. Numbers are medians over repeats;
on a shared machine they are noisy. Not a timed test.

``--hagemann``: for each group (model, sequence, GPUs) of Hagemann et al.
2023's measured sweep, ``sim search`` over the group's measured values of tp,
pp, micro-batch size, recomputation and SP (with the attention kernel and
norm of the group's measured best run, 1F1B, ZeRO-1); its pick is the best
ranked layout that was measured. A hit: the pick's measured MFU is within 2%
of the group's measured best (a measured OOM is a miss).
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.config import read_yaml  # noqa: E402
from sim.executors import make_executor  # noqa: E402
from sim.search import (  # noqa: E402
    Evaluator,
    SearchContext,
    enumerate_layouts,
    parse_pins,
    search,
)
from sim.validate import HAGEMANN_SWEEP  # noqa: E402

EXAMPLE = ROOT / "workloads" / "examples" / "search-gpt3-175b-1024.yaml"


def run_fresh(data: dict, workers: int, top: int, fix: list[str] | None = None
              ) -> dict[str, float]:
    """:func:`run_search` in a new process forked from this one, which has run nothing: a
    search leaves its caches warm in its process (the cluster's collective timer, schedules,
    op times), and workers forked from it would inherit them, so a search run after
    another in one process is faster than ``sim search`` is (on Linux; elsewhere, in this
    process)."""
    if "fork" not in multiprocessing.get_all_start_methods() or sys.platform != "linux":
        return run_search(data, workers, top, fix)
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_run_child, args=(send, data, workers, top, fix))
    child.start()
    send.close()
    out = recv.recv()
    child.join()
    return out


def _run_child(send: Any, data: dict, workers: int, top: int, fix: list[str] | None) -> None:
    send.send(run_search(data, workers, top, fix))
    send.close()


def run_search(data: dict, workers: int, top: int, fix: list[str] | None = None
               ) -> dict[str, float]:
    cpu = time.process_time()
    with make_executor("local", workers) as executor:
        result = search(data, top=top, executor=executor, pins=parse_pins(fix or []))
        each = executor.worker_cpu_each() or []
        worker_cpu = sum(each)
    parent_cpu = time.process_time() - cpu
    sims = [r.elapsed_s for r in result.rows if r.elapsed_s > 0]
    return {"parent_cpu_s": parent_cpu, "worker_cpu_s": worker_cpu,
            "busiest_worker_cpu_s": max(each, default=0.0),
            "idlest_worker_cpu_s": min(each, default=0.0),
            "cpu_s": parent_cpu + worker_cpu,
            "enumerated": result.enumerated, "evaluated": result.evaluated,
            "simulated": result.simulated, "elapsed_s": result.elapsed_s,
            "speculated": result.speculated, "discarded": result.discarded,
            "wasted_judged": result.wasted_judged,
            "screen_s": result.screen_s, "rate": result.evaluated / result.elapsed_s,
            "sim_median_s": statistics.median(sims) if sims else float("nan"),
            "best": result.best.layout.label() if result.best else "none",
            "mfu": result.best.figure("mfu") if result.best else float("nan")}


def time_simulations(data: dict, n: int, seed: int = 0) -> list[float]:
    """Seconds of ``n`` collapsed simulations of random layouts (micro-batch <= 4)."""
    ctx = SearchContext.build(data)
    evaluator = Evaluator(ctx.data, ctx.global_batch_size)
    layouts = [lay for lay in enumerate_layouts(ctx) if lay.micro_batch_size <= 4]
    out = []
    for layout in random.Random(seed).sample(layouts, n):
        start = time.perf_counter()
        evaluator(layout)
        out.append(time.perf_counter() - start)
    return out


HIT_WITHIN = 0.02


def hagemann(path: str, top: int = 20) -> int:
    """Print one line per group and the hit count (see the module docstring)."""
    from sim.validate import load_rows

    rows = load_rows(path)
    groups: dict[tuple, list] = {}
    for r in rows:
        if r.status in ("ok", "oom"):
            groups.setdefault(r.group, []).append(r)
    hits = 0
    print("group                     measured best                      pick (measured MFU)"
          "                     hit")
    for key in sorted(groups):
        runs = groups[key]
        best = _best_run(runs)
        if best is None:
            continue
        kernel = [r for r in runs if (r.attention, r.fused_norm) == (best.attention,
                                                                     best.fused_norm)]
        fix = ",".join(f"{k}={'|'.join(sorted({str(v).lower() for v in vals}, key=_num))}"
                       for k, vals in (("tp", {r.tp for r in kernel}),
                                       ("pp", {r.pp for r in kernel}),
                                       ("mbs", {r.micro_batch_size for r in kernel}),
                                       ("recompute", {r.recompute for r in kernel}),
                                       ("sp", {r.sequence_parallel for r in kernel})))
        result = search(best.experiment(), pins=parse_pins([fix + ",schedule=1f1b,zero=1,cp=1"]),
                        top=top)
        measured = {(r.tp, r.pp, r.micro_batch_size, r.recompute, r.sequence_parallel): r
                    for r in kernel}
        pick = next((measured[k] for row in result.feasible
                     if (k := (row.layout.tp, row.layout.pp, row.layout.micro_batch_size,
                               row.layout.recompute, row.layout.sequence_parallel))
                     in measured), None)
        hit = bool(pick and pick.status == "ok" and _mfu(pick, best) >= 1 - HIT_WITHIN)
        hits += hit
        print(f"{key[0]:>9} {key[1]:>5} {key[2]:>4}  {_desc(best):<34} "
              f"{_desc(pick) if pick else 'none':<34} {_ratio(pick, best):>6}  "
              f"{'yes' if hit else 'no'}")
    print(f"{hits} of {len(groups)} groups: the pick's measured MFU is within "
          f"{HIT_WITHIN:.0%} of the measured best")
    return hits


def _best_run(runs: list) -> object | None:
    ok = [r for r in runs if r.status == "ok" and r.step_time_s]
    return min(ok, key=lambda r: r.step_time_s) if ok else None


def _mfu(run: object, best: object) -> float:
    """Measured throughput of ``run`` relative to ``best`` (same model, batch and GPUs)."""
    return best.step_time_s / run.step_time_s  # type: ignore[attr-defined]


def _ratio(run: object | None, best: object) -> str:
    if run is None or run.status != "ok":  # type: ignore[attr-defined]
        return "oom" if run is not None else "-"
    return f"{_mfu(run, best):.3f}"


def _desc(r: object) -> str:
    return (f"tp{r.tp} pp{r.pp} dp{r.dp} mbs{r.micro_batch_size} "  # type: ignore[attr-defined]
            f"{r.recompute}{' sp' if r.sequence_parallel else ''}")  # type: ignore[attr-defined]


def _num(text: str) -> tuple[int, str]:
    return (int(text), "") if text.isdigit() else (0, text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", default=str(EXAMPLE))
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--exhaustive-sample", type=int, default=0, metavar="N")
    ap.add_argument("--fix", action="append", default=[], metavar="KEY=V[|V...],...",
                    help="pin dimensions as sim search --fix does (e.g. 'cp=1,zero=0|1|2')")
    ap.add_argument("--hagemann", action="store_true",
                    help="count the groups of Hagemann et al. 2023 where the pick is a hit")
    ap.add_argument("--data", default=str(HAGEMANN_SWEEP))
    args = ap.parse_args()
    if args.hagemann:
        hagemann(args.data)
        return
    data = read_yaml(args.file)
    head = ("workers", "enumerated", "evaluated", "simulated", "spec/wasted/judged", "wall s",
            "screen s", "layouts/s", "CPU s (parent+workers)", "per worker",
            "CPU ms/layout",
            "sim median s", "best layout", "MFU %")
    rows = []
    rates: dict[int, float] = {}
    cpus: dict[int, float] = {}
    counts = [int(w) for w in args.workers.split(",")]
    # interleaved (1, 2, 1, 2, ...): on a shared machine the load drifts, ratios hold
    by_count: dict[int, list[dict[str, float]]] = {w: [] for w in counts}
    for _ in range(args.repeat):
        for workers in counts:
            by_count[workers].append(run_fresh(data, workers, args.top, args.fix))
    for workers, runs in by_count.items():
        for k, r in enumerate(runs):
            serial = r["parent_cpu_s"] + r["busiest_worker_cpu_s"]
            print(f"run {k + 1}, {workers} worker(s): CPU s {r['cpu_s']:.1f}, parent "
                  f"{r['parent_cpu_s']:.2f} + busiest worker {r['busiest_worker_cpu_s']:.2f} = "
                  f"{serial:.2f}, wall {r['elapsed_s']:.1f} s")
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]
               if isinstance(runs[0][k], int | float)}
        rates[workers] = med["rate"]
        cpus[workers] = med["cpu_s"]
        rows.append((str(workers), f"{med['enumerated']:,.0f}", f"{med['evaluated']:,.0f}",
                     f"{med['simulated']:.0f}",
                     f"{med['speculated']:.0f}/{med['discarded']:.0f}/"
                     f"{med['wasted_judged']:.0f}", f"{med['elapsed_s']:.1f}",
                     f"{med['screen_s']:.1f}", f"{med['rate']:,.0f}",
                     f"{med['cpu_s']:.1f} ({med['parent_cpu_s']:.1f}+{med['worker_cpu_s']:.1f})",
                     f"{med['idlest_worker_cpu_s']:.1f}-{med['busiest_worker_cpu_s']:.1f}"
                     if workers > 1 else "-",
                     f"{1e3 * med['cpu_s'] / med['evaluated']:.2f}",
                     f"{med['sim_median_s']:.2f}", runs[0]["best"],
                     f"{100 * med['mfu']:.1f}"))
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    pinned = f" --fix {','.join(args.fix)}" if args.fix else ""
    print(f"sim search {Path(args.file).name}{pinned}: median of {args.repeat} run(s) per row")
    for r in (head, *rows):
        print("  ".join(c.rjust(w) if i != 12 else c.ljust(w)
                        for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip())
    if len(rates) > 1:
        first = next(iter(rates))
        print("rate ratios: " + ", ".join(f"{w} workers / {first}: {r / rates[first]:.2f}"
                                         for w, r in rates.items() if w != first))
        print("CPU ratios: " + ", ".join(f"{w} workers / {first}: {c / cpus[first]:.2f}"
                                        for w, c in cpus.items() if w != first))
        # the wall time on an idle machine with a core per worker, estimated: the parent's
        # CPU (its serial part and what it takes from the workers) plus the busiest worker's
        est = {w: statistics.median(r["cpu_s"] if w == 1 else
                                    r["parent_cpu_s"] + r["busiest_worker_cpu_s"]
                                    for r in by_count[w]) for w in counts}
        print("speed-up from CPU (1 worker's CPU / parent + busiest worker's): " + ", ".join(
            f"{w} workers / {first}: {est[first] / est[w]:.2f}" for w in counts if w != first))
    if args.exhaustive_sample:
        secs = time_simulations(data, args.exhaustive_sample)
        print(f"{len(secs)} collapsed simulations of random layouts alone: median "
              f"{statistics.median(secs):.2f} s, {len(secs) / sum(secs):.2f} per second "
              f"(the rate without bounds, one process)")


if __name__ == "__main__":
    main()
