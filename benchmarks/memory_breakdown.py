"""Benchmark: a run's predicted peak memory, term by term (issue 19, false OOM verdicts).

``python benchmarks/memory_breakdown.py SOURCE.csv [RUN ...]`` prints, for each row of a
corpus source (``sim/data/validation/*.csv``; only the named runs if any are given; for
Hagemann et al.'s sweep, ``hagemann2023_sweep.csv``, the runs are row numbers) and each
pipeline rank, what the memory model charges at that rank's peak: the model state (weights,
gradients, optimizer state, :meth:`ModelState.static_bytes`), the stashed activations of the
micro-batches in flight (per local model chunk: how many, and the bytes one keeps), the
working memory of the op that starts there (split into the unreduced gradients of a ZeRO-2
that reduces every micro-batch, ZeRO-3's gathered units, the all-gather CP's K and V, and
the rest: a layer's backward, the loss's buffers), the allocator's overhead on the dynamic
part and the reserved memory, against the GPU's capacity. ``--fragmentation-scan`` prints the
sweep's OOM verdicts under other allocator fragmentations instead (docs/memory-gaps.md);
``--allocator-split-scan`` under separate overheads on the stash and on the working memory,
and under a constant plus a fraction (whether the sweep's labels allow an overhead that spares
the stashed activations; docs/memory-gaps.md, "Where the allocator overhead falls").

It walks each rank's program order as the engine allocates (:func:`workloads.memory.in_flight`),
as the layout search's bounds do; :func:`breakdown` agrees with ``sim run``'s
``peak_memory_per_stage_gib`` (``tests/test_memory_breakdown.py``). Not a timed test: it
prints a table.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GiB = 2**30


@dataclass(frozen=True)
class RankMemory:
    """What the memory model charges one pipeline rank at its peak, in bytes."""

    rank: int
    static: float
    """Model state: weights, gradients, optimizer state of the rank's chunks."""
    in_flight: tuple[tuple[int, float, float], ...]
    """Per local chunk at the peak: (stage, micro-batches in flight, bytes one stashes)."""
    op: str
    """The op that starts at the peak, e.g. ``1B0`` (stage 1, backward)."""
    unreduced_grads: float
    """Of the op's working memory: gradients held whole until their reduce-scatter."""
    zero3_gathered: float
    """Of the op's working memory: ZeRO-3's gathered parameters and unit gradients."""
    cp_kv: float
    """Of the op's working memory: the all-gather CP's gathered K and V."""
    other_working: float
    """The rest of the op's working memory: a layer's backward, the loss's buffers."""
    fragmentation: float
    reserved: float
    capacity: float

    @property
    def stash(self) -> float:
        return sum(n * b for _, n, b in self.in_flight)

    @property
    def working(self) -> float:
        return self.unreduced_grads + self.zero3_gathered + self.cp_kv + self.other_working

    @property
    def dynamic(self) -> float:
        return self.stash + self.working

    @property
    def allocator(self) -> float:
        return self.dynamic * self.fragmentation

    @property
    def peak(self) -> float:
        return self.static + self.dynamic + self.allocator + self.reserved


def rank_points(exp):
    """Per pipeline rank: (its stages, the :func:`workloads.memory.in_flight` rows, the bytes
    one micro-batch stashes per local stage, each row's op slot, the working memory per slot).
    Every moment an op starts on the rank, for :func:`breakdown` (the peak's terms) and
    :func:`split_points` (all moments, stash and working memory apart)."""
    from workloads import memory
    from workloads.schedules import Op

    costs, sched = exp.costs, exp.schedule
    for r, ops in enumerate(sched.rank_ops):
        stages = tuple(s for s, owner in enumerate(sched.stage_rank) if owner == r)
        rows = memory.in_flight(ops, stages, sched.split_backward, costs.w_retained_fraction)
        act = np.array([costs.activation_bytes_per_mb(s) for s in stages])
        slots = rows[:, -1].astype(int)
        work = {k: costs.transient_bytes(Op(k // 3, "FBW"[k % 3], 0))
                for k in np.unique(slots).tolist()}
        yield stages, rows, act, slots, work


def split_points(exp) -> list[tuple[float, np.ndarray, np.ndarray]]:
    """Per pipeline rank: (static bytes, stash bytes, working bytes) at every moment an op
    starts; ``static + stash + working`` is :func:`breakdown`'s dynamic memory before the
    allocator's overhead, its maximum the peak's."""
    out = []
    for stages, rows, act, slots, work in rank_points(exp):
        out.append((float(exp.costs.static_bytes(stages)), rows[:, :-1] @ act,
                    np.array([work[k] for k in slots.tolist()], dtype=float)))
    return out


def breakdown(exp) -> list[RankMemory]:
    """Each pipeline rank's peak, term by term, for a built experiment
    (:class:`sim.experiment.Experiment`) with the shipped device profile of its GPU."""
    from sim import reserved
    from sim.calibration import default_profile
    from sim.gpu_profiles import generation_of
    from workloads.frameworks import fragmentation
    from workloads.schedules import Op

    costs = exp.costs
    profile = default_profile(exp.cluster.gpu.name)
    frag = fragmentation(exp.framework, profile.fragmentation)
    resv = (reserved.per_stage(exp, generation_of) if profile.reserved_from_run
            else (profile.reserved_bytes,) * exp.placement.degree("pp"))
    out = []
    for r, (stages, rows, act, slots, work) in enumerate(rank_points(exp)):
        dynamic = rows[:, :-1] @ act + np.array([work[k] for k in slots.tolist()])
        i = int(np.argmax(dynamic))
        k = int(slots[i])
        op = Op(k // 3, "FBW"[k % 3], 0)
        unreduced, z3, cp = (costs.unreduced_grad_bytes(op), costs.zero3_working_bytes(op),
                             costs.cp_gathered_bytes(op))
        out.append(RankMemory(
            r, costs.static_bytes(stages),
            tuple((s, int(n), float(a)) for s, n, a in zip(stages, rows[i, :-1], act,
                                                             strict=True)),
            f"{op.stage}{op.kind}", unreduced, z3, cp, work[k] - unreduced - z3 - cp, frag,
            resv[r], exp.cluster.gpu.hbm_capacity_bytes))
    return out


def table(run: str, ranks: list[RankMemory]) -> str:
    """One run's breakdown as text, GiB, one line a rank."""
    head = (f"{run}\n  rank  static   stash (chunks x mbs, GiB/mb)          op    grads  z3   "
            f"cp   other  alloc  resv   peak / capacity")
    lines = [head]
    for m in ranks:
        held = [(n, b) for _, n, b in m.in_flight if n]
        sizes = sorted({round(b / GiB, 3) for _, b in held})
        count = sum(n for n, _ in held)
        stash = f"{m.stash / GiB:6.2f} ({count} x {'/'.join(map(str, sizes)) or '-'})"
        lines.append(
            f"  {m.rank:4d}  {m.static / GiB:6.2f}  {stash:36s}  {m.op:5s} "
            f"{m.unreduced_grads / GiB:5.2f} {m.zero3_gathered / GiB:4.2f} {m.cp_kv / GiB:4.2f} "
            f"{m.other_working / GiB:5.2f}  {m.allocator / GiB:5.2f}  {m.reserved / GiB:4.2f}"
            f"   {m.peak / GiB:6.2f} / {m.capacity / GiB:.2f}")
    return "\n".join(lines)


def step_moment(exp, copy_bytes: float) -> list[tuple[int, float, float]]:
    """Per pipeline rank: (rank, the activation peak of :func:`breakdown`, the peak at the
    optimizer step), bytes. At the step the stashes and working memory are gone and the
    optimizer holds ``copy_bytes`` a parameter of its shard (every parameter of the rank's
    stages without ZeRO) beside the static state, with the allocator's overhead on it and the
    reserved memory: Megatron-LM's fp32 copies of fp16 gradients (``main_param.grad =
    main_grad.float()``), allocated in the step and freed by the next ``zero_grad`` before the
    forward (docs/memory-gaps.md, "The optimizer's gradient copies"). The memory model itself
    has no such moment: this says whether leaving it out can hide a peak."""
    costs, sched = exp.costs, exp.schedule
    out = []
    for m in breakdown(exp):
        stages = tuple(s for s, owner in enumerate(sched.stage_rank) if owner == m.rank)
        n = sum(costs.stage_params(s) for s in stages)
        if costs.zero_stage >= 1:
            n /= costs.dp * costs.cp
        step = m.static + copy_bytes * n * (1 + m.fragmentation) + m.reserved
        out.append((m.rank, m.peak, step))
    return out


def fragmentation_scan(workers: int = 2) -> str:
    """Hagemann et al.'s sweep under each allocator fragmentation from 0.10 to 0.26: OOM
    accuracy, the runs that ran flagged out of memory, the runs that did not fit predicted to
    fit; the shipped A100 profile otherwise (as ``sim validate``), reserved memory (each run's,
    :mod:`sim.reserved`) and capacity as shipped. ``benchmarks/calibrate.py`` fits the
    fragmentation on the same counts."""
    from sim.calibration import A100_HAGEMANN
    from sim.validate import HAGEMANN_SWEEP, load_rows, predict
    from topologies.hardware import GPUS
    from topologies.presets import SERVERS
    from workloads.memory import device_bytes, oom

    capacity = GPUS[SERVERS["dgx-a100-80g"].gpu].hbm_capacity_bytes
    preds = predict(load_rows(HAGEMANN_SWEEP), A100_HAGEMANN, workers)
    lines = ["frag  OOM accuracy  ran but flagged (rows)         did not fit, predicted to fit"]
    for frag in [x / 100 for x in range(10, 27)]:
        flagged = [oom(max(device_bytes(st, dy, frag, resv)
                           for st, dy, resv in p.memory_parts), capacity) for p in preds]
        acc = sum(f == (p.row.status == "oom") for f, p in zip(flagged, preds, strict=True))
        false = [p.row.index for f, p in zip(flagged, preds, strict=True)
                 if f and p.row.status == "ok"]
        missed = sum(not f and p.row.status == "oom" for f, p in zip(flagged, preds, strict=True))
        lines.append(f"{frag:4.2f}  {acc / len(preds):12.2%}  {len(false):2d} "
                     f"{str(false):27s}  {missed:3d}")
    return "\n".join(lines)


SPLIT_GRID = ((0.0, 0.24), (0.10, 0.24), (0.14, 0.24), (0.20, 0.24), (0.24, 0.0),
              (0.24, 0.24), (0.24, 0.5), (0.24, 1.0), (0.0, 1.0), (0.0, 2.0), (0.14, 1.0))
"""(Overhead on the stash, overhead on the working memory) pairs ``--allocator-split-scan``
prints; (0.24, 0.24) is the shipped model."""
CONSTANT_GRID = ((0.0, 0.24), (1.0, 0.20), (2.0, 0.14), (2.0, 0.20), (3.0, 0.10), (3.0, 0.16),
                 (4.0, 0.14), (5.0, 0.14), (6.0, 0.12))
"""(Constant overhead in GiB, fraction of the dynamic memory) pairs it prints."""


def split_verdicts(points, statuses, stash_frac: float, work_frac: float,
                   constant_gib: float, reserved, capacity: float):
    """(OOM accuracy, rows that ran and are flagged, rows that failed and pass) of the runs
    ``points`` (:func:`split_points` of each) with ``stash_frac`` of the stash, ``work_frac``
    of the working memory and ``constant_gib`` GiB as the allocator's overhead; ``reserved``
    the bytes of every GPU, or per run its pipeline ranks' (:mod:`sim.reserved`)."""
    flagged = []
    for i, ranks in enumerate(points):
        resv = ([reserved] * len(ranks) if isinstance(reserved, int | float)
                else reserved[i])
        peak = max(float(np.max(st + s * (1 + stash_frac) + w * (1 + work_frac))) + r
                   for (st, s, w), r in zip(ranks, resv, strict=True))
        flagged.append(peak + constant_gib * GiB > capacity)
    acc = sum(f == (st == "oom") for f, st in zip(flagged, statuses, strict=True))
    false = [i for i, (f, st) in enumerate(zip(flagged, statuses, strict=True))
             if f and st == "ok"]
    missed = sum(not f and st == "oom" for f, st in zip(flagged, statuses, strict=True))
    return acc / len(points), false, missed


def allocator_split_scan() -> str:
    """Hagemann et al.'s sweep with the allocator's overhead split: a fraction on the stashed
    activations apart from one on the working memory (an allocator that reuses the stash's
    same-sized blocks without waste would charge the first little), and a constant in GiB
    beside one fraction of the dynamic memory. Reserved memory (each run's, :mod:`sim.reserved`)
    and capacity as shipped; row numbers of the sweep (846 and 851 are the pair it
    contradicts, sim.validate.contradicted)."""
    from sim import reserved as resv
    from sim.experiment import build_experiment
    from sim.gpu_profiles import generation_of
    from sim.validate import HAGEMANN_SWEEP, load_rows
    from topologies.hardware import GPUS
    from topologies.presets import SERVERS

    capacity = GPUS[SERVERS["dgx-a100-80g"].gpu].hbm_capacity_bytes
    rows = [r for r in load_rows(HAGEMANN_SWEEP) if r.status in ("ok", "oom")]  # as predict
    exps = [build_experiment(row.experiment()) for row in rows]
    points = [split_points(exp) for exp in exps]
    reserved = [resv.per_stage(exp, generation_of) for exp in exps]
    statuses = [row.status for row in rows]
    index = [row.index for row in rows]
    lines = ["stash  working  const  OOM accuracy  ran but flagged (rows)         "
             "did not fit, predicted to fit"]
    grid = [(s, w, 0.0) for s, w in SPLIT_GRID] + [(f, f, c) for c, f in CONSTANT_GRID]
    for s, w, c in grid:
        acc, false, missed = split_verdicts(points, statuses, s, w, c, reserved, capacity)
        shown = [index[i] for i in false]
        listed = str(shown[:6])[:-1] + (", ...]" if len(shown) > 6 else "]")
        lines.append(f"{s:5.2f}  {w:7.2f}  {c:5.1f}  {acc:12.2%}  {len(false):2d} "
                     f"{listed:27s}  {missed:3d}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", help="a corpus CSV, e.g. "
                        "sim/data/validation/dubey2024_llama3_405b.csv")
    parser.add_argument("runs", nargs="*", help="only these runs (the run column)")
    parser.add_argument("--fragmentation-scan", action="store_true",
                        help="instead: the sweep's OOM verdicts under fragmentations 0.10-0.26 "
                        "(about a minute on 2 cores)")
    parser.add_argument("--allocator-split-scan", action="store_true",
                        help="instead: the sweep's OOM verdicts with separate overheads on the "
                        "stash and the working memory, and a constant beside a fraction")
    parser.add_argument("--step-copy", type=float, metavar="BYTES",
                        help="instead of the table: each run's largest activation peak and "
                        "its peak at the optimizer step with BYTES a parameter of the shard "
                        "held there (4: Megatron-LM's fp32 copies of fp16 gradients)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.fragmentation_scan:
        print(fragmentation_scan())
        return
    if args.allocator_split_scan:
        print(allocator_split_scan())
        return
    if args.source is None:
        parser.error("a source CSV, or --fragmentation-scan")
    from sim.corpus import is_corpus_file, load_source
    from sim.experiment import build_experiment
    from sim.validate import load_rows

    if is_corpus_file(Path(args.source)):
        runs = [(row.run, row.experiment()) for row in load_source(args.source).rows]
    else:  # the sweep: its rows by number
        runs = [(str(row.index), row.experiment()) for row in load_rows(args.source)]
    for run, data in runs:
        if args.runs and run not in args.runs:
            continue
        exp = build_experiment(data)
        if args.step_copy is not None:
            ranks = step_moment(exp, args.step_copy)
            act, step = max(p for _, p, _ in ranks), max(t for _, _, t in ranks)
            print(f"{run:40s} activation peak {act / GiB:6.2f}  optimizer step "
                  f"{step / GiB:6.2f} / {exp.cluster.gpu.hbm_capacity_bytes / GiB:.2f} GiB")
            continue
        print(table(run, breakdown(exp)))


if __name__ == "__main__":
    main()
