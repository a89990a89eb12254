"""Several training steps as one program: a lowered step repeated back to back. Pure.

:func:`repeat_program` copies a one-step :class:`~workloads.program.Program`
``steps`` times. Step ``k``'s instructions get ids offset by the start of the
step and collective keys ``key + k K``; each keeps its
stream, so program order on every (GPU, stream) runs step ``k`` before step
``k + 1``. On top of that, the first instruction of every stream of a GPU in
step ``k + 1`` waits for all of that GPU's step-``k`` instructions (the last
one of each of its streams): a GPU starts a step once its own part of the
previous one (optimizer, parameter all-gather, last messages) is done.

Between steps, two regimes:

* ``barrier=True`` (every schedule but ZB-H2 and ZB-V): a global barrier, a
  zero-byte, zero-time all-reduce over every simulated GPU after each step,
  standing for Megatron-LM's gradient-norm all-reduce over all ranks before
  the optimizer (Shoeybi et al. 2019; Narayanan et al. 2021): no rank starts
  step ``k + 1`` before every rank has finished step ``k``. Steps are then
  identical, so ``N`` steps take exactly ``N`` times one.
* ``barrier=False`` (:attr:`~workloads.registry.ScheduleKind.steady_period`):
  the Zero Bubble paper's optimizer post-validation (Qi et al. 2024, sec. 4)
  replaces the synchronisation, so consecutive steps overlap across ranks;
  the steady-state period is then shorter than one isolated step
  (:func:`~workloads.schedules_advanced.steady_state_period` is the pure
  list-schedule oracle of the same thing).

Asynchronous data parallelism with bounded staleness (``staleness=S >= 1``, the
stale synchronous parallel model of Ho et al. 2013, NeurIPS, "More effective
distributed ML via a stale synchronous parallel parameter server"): no barrier, and
a GPU's step ``k + 1`` waits for its own step ``k`` but for the DP communication,
and for its DP communication of step ``k - S``; the optimizer of step ``k`` applies
the DP communication of step ``k - S`` (none for ``k < S``) instead of step ``k``'s.
DP communication of step ``k`` needs every member's step ``k``, so no worker runs more
than ``S`` steps ahead of the slowest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from workloads.program import Collective, Compute, Instruction, Program

BARRIER_NAME = "step barrier"
"""Name of the barrier collective between steps."""


DP_KIND = "dp"
"""Kind of the data-parallel communication (gradient collectives, parameter-server pushes
and pulls) that bounded staleness takes off the critical path."""


def is_dp_comm(ins: Instruction) -> bool:
    """Whether ``ins`` is data-parallel communication (not compute)."""
    return not isinstance(ins, Compute) and ins.kind == DP_KIND


def _stream_ends(instrs: Sequence[Instruction], skip_dp: bool = False
                 ) -> tuple[dict[int, list[int]], set[int]]:
    """Per GPU, the last instruction of each of its streams (``skip_dp``: leaving out the
    streams of DP communication); and the ids that start a stream."""
    last: dict[tuple[int, str], int] = {}
    first: set[int] = set()
    dp_streams: set[tuple[int, str]] = set()
    for ins in instrs:
        key = (ins.gpu, ins.stream)
        if key not in last:
            first.add(ins.id)
        last[key] = ins.id
        if is_dp_comm(ins):
            dp_streams.add(key)
    ends: dict[int, list[int]] = {}
    for key, i in sorted(last.items()):
        if not (skip_dp and key in dp_streams):
            ends.setdefault(key[0], []).append(i)
    return ends, first


def _dp_ends(instrs: Sequence[Instruction]) -> dict[int, tuple[int, ...]]:
    """Per GPU, the last instruction of each of its DP communication streams."""
    last: dict[tuple[int, str], int] = {}
    for ins in instrs:
        if is_dp_comm(ins):
            last[(ins.gpu, ins.stream)] = ins.id
    ends: dict[int, tuple[int, ...]] = {}
    for (gpu, _), i in sorted(last.items()):
        ends[gpu] = (*ends.get(gpu, ()), i)
    return ends


def repeat_program(program: Program, steps: int, barrier: bool, staleness: int = 0) -> Program:
    """``steps`` copies of ``program`` run back to back (module docstring for the rules;
    ``staleness`` >= 1: bounded staleness, without a barrier).

    Ids stay dense: step ``k``'s copy of instruction ``i`` has id ``i + start_k``, the
    barrier members of step ``k`` (if any) follow step ``k``'s copy, so the layout is
    ``[step 0][barrier 0][step 1]...[step N-1]`` (no barrier after the last step).
    ``meta`` gets ``steps``, ``step_starts`` (the first id of each step) and
    ``step_instructions`` (instructions per step).
    """
    if steps < 1:
        raise ValueError(f"repeat_program: steps={steps} must be >= 1")
    if staleness and barrier:
        raise ValueError("repeat_program: bounded staleness has no barrier")
    base = program.instructions
    n = len(base)
    if steps == 1:
        meta = dict(program.meta, steps=1, step_starts=(0,), step_instructions=n)
        return replace(program, meta=meta)
    keys = [ins.key for ins in base if isinstance(ins, Collective)]
    key_span = max(keys, default=-1) + 2  # +1: room for the barrier's key
    ends, first = _stream_ends(base, skip_dp=staleness > 0)
    gpus = sorted(ends)
    dp_comm = {ins.id for ins in base if is_dp_comm(ins)} if staleness else set()
    dp_ends = _dp_ends(base) if staleness else {}
    out: list[Instruction] = []
    starts: list[int] = []
    entry: dict[int, tuple[int, ...]] = {}  # per GPU: what its next step's streams wait for
    for k in range(steps):
        offset = len(out)
        starts.append(offset)
        for ins in base:
            deps = tuple(d + offset for d in ins.deps)
            if dp_comm and isinstance(ins, Compute) and ins.kind == "opt":
                deps = _stale_deps(ins.deps, dp_comm, offset, k, staleness, n)
            if ins.id in first and ins.gpu in entry:
                deps = deps + entry[ins.gpu]
            fields = {"id": ins.id + offset, "deps": deps}
            if isinstance(ins, Collective):
                fields["key"] = ins.key + k * key_span
            out.append(ins._replace(**fields))
        if k == steps - 1:
            break
        step_ends = {g: tuple(i + offset for i in ends[g]) for g in gpus}
        if barrier:
            key = (k + 1) * key_span - 1
            group = tuple(gpus)
            entry = {}
            for g in gpus:
                bid = len(out)
                out.append(Collective(bid, g, "dp", BARRIER_NAME, step_ends[g], "all_reduce",
                                      "ring", group, 0.0, key, duration_s=0.0))
                entry[g] = (bid,)
        else:
            entry = step_ends
            if k >= staleness and dp_ends:  # and its own DP communication of step k - S
                back = offset - staleness * n
                entry = {g: e + tuple(i + back for i in dp_ends.get(g, ())) for g, e in
                         step_ends.items()}
    meta = dict(program.meta, steps=steps, step_starts=tuple(starts), step_instructions=n)
    return replace(program, instructions=tuple(out), meta=meta)


def _stale_deps(deps: Sequence[int], dp_comm: set[int], offset: int, k: int, staleness: int,
                n: int) -> tuple[int, ...]:
    """An optimizer's dependencies in step ``k`` under bounded staleness: its DP
    communication from step ``k - staleness`` (steps are ``n`` ids apart, no barrier)."""
    out = []
    for d in deps:
        if d not in dp_comm:
            out.append(d + offset)
        elif k >= staleness:
            out.append(d + offset - staleness * n)
    return tuple(out)


def without_dp(program: Program) -> Program:
    """``program`` without its DP communication: a local step of local SGD (each replica
    updates its own parameters, Stich 2019; Lin et al. 2020). Each removed instruction's
    dependants wait for what it waited for; ids stay dense, in the same order."""
    base = program.instructions
    dropped = {ins.id: ins.deps for ins in base if is_dp_comm(ins)}
    if not dropped:
        return program
    new_id: dict[int, int] = {}
    resolved: dict[int, tuple[int, ...]] = {}

    def through(d: int) -> tuple[int, ...]:
        if d not in dropped:
            return (new_id[d],)
        if d not in resolved:
            resolved[d] = tuple(dict.fromkeys(x for e in dropped[d] for x in through(e)))
        return resolved[d]

    out: list[Instruction] = []
    for ins in base:
        if ins.id in dropped:
            continue
        new_id[ins.id] = len(out)
        deps = tuple(dict.fromkeys(x for d in ins.deps for x in through(d)))
        out.append(ins._replace(id=new_id[ins.id], deps=deps))
    return replace(program, instructions=tuple(out))


def step_of(program: Program) -> list[int]:
    """The step index of every instruction of a :func:`repeat_program` program (barrier
    members count in the step they close)."""
    starts = program.meta.get("step_starts", (0,))
    out = []
    k = 0
    for i in range(len(program.instructions)):
        while k + 1 < len(starts) and i >= starts[k + 1]:
            k += 1
        out.append(k)
    return out


def step_end_times(program: Program, end_s: Sequence[float]) -> tuple[float, ...]:
    """End of each step: the latest end of its own instructions (barriers excluded).

    ``end_s`` is indexed by instruction id (:class:`sim.engine.InstructionTimes`).
    """
    starts = program.meta.get("step_starts", (0,))
    n = program.meta.get("step_instructions", len(program.instructions))
    return tuple(max(end_s[s:s + n], default=0.0) for s in starts)
