"""How many chunk forwards an interleaved 1F1B must run before its first backward (issue 19).

    python benchmarks/interleaved_warmup.py

Llama 3 405B's pipeline (Dubey et al. 2024, sec. 3.3.2: 16 ranks, 8 one-layer chunks a rank,
N = 16) holds on rank 1 as many one-layer stashes as its warm-up runs forwards, plus one.
PyTorch's interleaved 1F1B (torch/distributed/pipelining/schedules.py, the public form of the
paper's figure 6) and Megatron-core warm up with ``(v - 1)N + hops(p - 1 - r)`` forwards,
``hops = 2``: the simulator's :func:`workloads.schedules_advanced.interleaved`. PyTorch's
interleaved zero-bubble schedule uses ``hops = 1``. This script asks what the second hop buys:
it builds the same op order with either warm-up and runs it

- through the project's exact list schedule (:func:`workloads.schedules.list_schedule`, no
  communication): the step time and each rank's peak stashes;
- through a list schedule that delays every message between pipeline ranks by ``latency``
  (a fraction of one chunk's forward), :func:`run_with_latency`, which with ``latency = 0`` is
  the project's list schedule op for op (``tests/test_interleaved_warmup.py``).

It prints, for the paper's two pipeline depths (32 and 16 micro-batches a pipeline) and uniform
chunks (backward twice the forward), the step time in chunk forwards and rank 1's peak. The
result (docs/memory-gaps.md, "Ninth pass"): without latency one hop gives the same step with
14 fewer stashes at 32 micro-batches; with any latency between ranks it is slower, by about the
latency times the number of chunk round trips, and the second hop is the slack that hides the
asynchronous point-to-point sends the paper adopts. Not a timed test.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from workloads.schedules import BACKWARD, FORWARD, Op, Schedule, list_schedule  # noqa: E402
from workloads.schedules_advanced import peak_activation, uniform_duration  # noqa: E402


def interleaved_hops(p: int, m: int, v: int, n: int, hops: int) -> Schedule:
    """Interleaved 1F1B on ``p`` ranks with ``v`` chunks each, ``m`` micro-batches in groups
    of ``n`` (each group through chunk 0, then chunk 1, ...), rank ``r`` warming up with
    ``min((v - 1)n + hops(p - 1 - r), m v)`` forwards, then one forward and one backward,
    then the remaining backwards. ``hops = 2`` is
    :func:`workloads.schedules_advanced.interleaved` (for ``m`` a multiple of ``n``)."""
    order: list[tuple[int, int]] = []  # (micro-batch, chunk) in forward order
    for first in range(0, m, n):
        for chunk in range(v):
            order += [(mb, chunk) for mb in range(first, min(first + n, m))]
    total = m * v
    ranks = []
    for r in range(p):
        warmup = min((v - 1) * n + hops * (p - 1 - r), total)
        fwd = [Op(chunk * p + r, FORWARD, mb) for mb, chunk in order]
        bwd = [Op((v - 1 - chunk) * p + r, BACKWARD, mb) for mb, chunk in order]
        ops = fwd[:warmup]
        for k in range(total - warmup):
            ops += [fwd[warmup + k], bwd[k]]
        ops += bwd[total - warmup:]
        ranks.append(tuple(ops))
    return Schedule(f"interleaved-{hops}hop", m, tuple(s % p for s in range(p * v)),
                    tuple(ranks))


def run_with_latency(schedule: Schedule, forward: float, backward: float,
                     latency: float) -> dict[Op, tuple[float, float]]:
    """``{op: (start, end)}`` with each chunk costing ``forward / v`` or ``backward / v``
    and every producer on another rank done ``latency`` later than it ends (the message's
    time, overlapped with compute: asynchronous sends)."""
    p, stages = schedule.num_ranks, schedule.num_stages
    cost = uniform_duration(schedule, forward, backward)
    done: dict[Op, float] = {}
    at = [0] * p
    free = [0.0] * p
    moved = True
    while moved:
        moved = False
        for r, ops in enumerate(schedule.rank_ops):
            while at[r] < len(ops):
                op = ops[at[r]]
                if op.kind == FORWARD:
                    need = [Op(op.stage - 1, FORWARD, op.mb)] if op.stage else []
                else:
                    need = ([Op(op.stage + 1, BACKWARD, op.mb)] if op.stage < stages - 1
                            else [Op(op.stage, FORWARD, op.mb)])
                if any(d not in done for d in need):
                    break
                start = max([free[r]] + [done[d] + (latency if d.stage % p != r else 0.0)
                                         for d in need])
                done[op] = free[r] = start + cost(op)
                at[r] += 1
                moved = True
    if any(at[r] < len(ops) for r, ops in enumerate(schedule.rank_ops)):
        raise RuntimeError(f"{schedule.name}: deadlock")
    return {op: (end - cost(op), end) for op, end in done.items()}


def step(schedule: Schedule, latency: float) -> float:
    """The step's length in chunk forwards (uniform chunks, backward twice the forward)."""
    v = schedule.chunks_per_rank
    if latency == 0:
        spans = list_schedule(schedule, uniform_duration(schedule, v, 2 * v))
    else:
        spans = run_with_latency(schedule, v, 2 * v, latency)
    return max(end for _, end in spans.values())


def main() -> None:
    p, v, n = 16, 8, 16
    print("Llama 3 405B's pipeline: 16 ranks, 8 one-layer chunks, N = 16; uniform chunks, "
          "backward = 2 forwards;\nstep in chunk forwards; latency between ranks in chunk "
          "forwards")
    print(f"{'micro-batches':>13} {'latency':>8} {'hops':>5} {'step':>9} {'vs 2 hops':>10} "
          f"{'rank 1 stashes':>15}")
    for m in (32, 16):
        for latency in (0.0, 0.05, 0.2):
            base = None
            for hops in (2, 1):
                s = interleaved_hops(p, m, v, n, hops)
                t = step(s, latency)
                base = t if base is None else base
                held = int(peak_activation(s)[1] * v)
                print(f"{m:>13} {latency:>8} {hops:>5} {t:>9.2f} {100 * (t / base - 1):>+9.2f}% "
                      f"{held:>15}")


if __name__ == "__main__":
    main()
