"""Pipeline schedules as pure data: the order of ops on each pipeline rank.

A schedule is order, not time. Bubbles are written nowhere: they emerge when
the engine runs the ops with real durations and the dependencies of
:func:`op_deps`. Every op has one text form, ``"<stage><kind><micro-batch>"``
(``"1F3"`` = stage 1, forward, micro-batch 3), used in reprs, error messages,
golden files and custom schedule files.

Sources: GPipe (Huang et al. 2019); 1F1B / PipeDream-Flush (Narayanan et al.
2021, SC'21, sec. 2.2); Zero Bubble's split backward B/W (Qi et al. 2024).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from sim.errors import ScheduleError

FORWARD = "F"
BACKWARD = "B"
WEIGHT_GRAD = "W"
KINDS = (FORWARD, BACKWARD, WEIGHT_GRAD)

_OP_RE = re.compile(r"^(\d+)([FBW])(\d+)$")


@dataclass(frozen=True, order=True, slots=True)
class Op:
    """One pipeline op: stage ``stage`` runs ``kind`` for micro-batch ``mb``."""

    stage: int
    """Model stage (chunk) index, 0 = first layers; with vpp > 1 there are pp * vpp stages."""
    kind: str
    """``F`` forward, ``B`` backward (input-gradient only if the schedule splits it), ``W``."""
    mb: int
    """Micro-batch index within the step, from 0."""

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.mb}"

    def __repr__(self) -> str:
        return f"Op({self})"

    @classmethod
    def parse(cls, text: str) -> Op:
        """Parse the canonical text form, e.g. ``Op.parse("1F3")``."""
        match = _OP_RE.match(text.strip())
        if not match:
            raise ScheduleError(
                f"op {text!r} is not of the form <stage><F|B|W><micro-batch>, e.g. '1F3'"
            )
        return cls(int(match[1]), match[2], int(match[3]))


@dataclass(frozen=True)
class Schedule:
    """Per-rank ordered ops of one training step of a pipeline."""

    name: str
    """Schedule name as used in the experiment file, e.g. ``1f1b``."""
    num_microbatches: int
    """m, micro-batches per step per pipeline."""
    stage_rank: tuple[int, ...]
    """stage_rank[s] = pipeline rank that owns stage s; len = number of stages."""
    rank_ops: tuple[tuple[Op, ...], ...]
    """rank_ops[r] = the ops rank r runs, in program order."""
    split_backward: bool = False
    """True when B is only the input gradient and W ops carry the weight gradient."""
    notes: str = field(default="", compare=False)
    """Free text: source and assumptions of the builder."""

    @property
    def num_ranks(self) -> int:
        return len(self.rank_ops)

    @property
    def num_stages(self) -> int:
        return len(self.stage_rank)

    @property
    def chunks_per_rank(self) -> int:
        return self.num_stages // self.num_ranks

    def grid(self) -> str:
        """The op grid as text, one line per rank: readable in a diff."""
        return "\n".join(
            f"rank {r}: " + " ".join(str(op) for op in ops) for r, ops in enumerate(self.rank_ops)
        )

    def __str__(self) -> str:
        head = f"Schedule {self.name} (p={self.num_ranks}, m={self.num_microbatches})"
        return f"{head}\n{self.grid()}"


def op_deps(op: Op, num_stages: int, split_backward: bool) -> tuple[Op, ...]:
    """The ops ``op`` must wait for besides program order on its rank (DESIGN.md rule).

    F(s, m) after F(s-1, m); B(s, m) after B(s+1, m) and after F(s, m) (its
    stashed activations); W(s, m) after B(s, m).
    """
    s, m = op.stage, op.mb
    if op.kind == FORWARD:
        return (Op(s - 1, FORWARD, m),) if s > 0 else ()
    if op.kind == BACKWARD:
        deps = [Op(s, FORWARD, m)]
        if s < num_stages - 1:
            deps.append(Op(s + 1, BACKWARD, m))
        return tuple(deps)
    if not split_backward:
        raise ScheduleError(f"op {op} is a W but the schedule does not split the backward")
    return (Op(s, BACKWARD, m),)


def required_ops(num_stages: int, num_microbatches: int, split_backward: bool) -> list[Op]:
    kinds = KINDS if split_backward else (FORWARD, BACKWARD)
    return [
        Op(s, k, mb) for s in range(num_stages) for mb in range(num_microbatches) for k in kinds
    ]


def validate(schedule: Schedule) -> None:
    """Check a schedule before it runs; raise :class:`ScheduleError` with the op grid if bad.

    Checks: each (stage, micro-batch) has exactly one F and one B (and one W if
    split), every op sits on the rank that owns its stage, and a symbolic run
    with unit durations completes (no deadlock).
    """
    p = schedule.num_ranks
    if p < 1 or schedule.num_microbatches < 1:
        raise ScheduleError(f"schedule {schedule.name}: needs p >= 1 and m >= 1")
    for s, r in enumerate(schedule.stage_rank):
        if not 0 <= r < p:
            raise ScheduleError(f"stage {s} is owned by rank {r}, outside 0..{p - 1}")
    seen: dict[Op, int] = {}
    for r, ops in enumerate(schedule.rank_ops):
        for op in ops:
            if op.kind not in KINDS or not 0 <= op.stage < schedule.num_stages:
                raise ScheduleError(f"rank {r}: op {op} has no such stage or kind")
            if op in seen:
                raise ScheduleError(f"op {op} appears twice (ranks {seen[op]} and {r})")
            if schedule.stage_rank[op.stage] != r:
                raise ScheduleError(
                    f"op {op} is on rank {r} but stage {op.stage} lives on rank "
                    f"{schedule.stage_rank[op.stage]}"
                )
            seen[op] = r
    need = required_ops(schedule.num_stages, schedule.num_microbatches, schedule.split_backward)
    need_set = set(need)
    missing = [op for op in need if op not in seen]
    extra = [op for op in seen if op not in need_set]
    if missing or extra:
        parts = []
        if missing:
            parts.append("missing " + " ".join(map(str, missing[:8])))
        if extra:
            parts.append("unexpected " + " ".join(map(str, extra[:8])))
        raise ScheduleError(f"schedule {schedule.name}: " + "; ".join(parts))
    list_schedule(schedule, lambda op: 1.0)


def list_schedule(
    schedule: Schedule, duration: Callable[[Op], float]
) -> dict[Op, tuple[float, float]]:
    """Symbolic list-schedule run: each op starts when its rank is free and its producers are done.

    This is the exact oracle for pipeline timing without communication
    (REFERENCES.md, "one slow stage in 1F1B"). Returns ``{op: (start, end)}``.
    Raises :class:`ScheduleError` naming the blocked ops if the schedule deadlocks.
    """
    done: dict[Op, tuple[float, float]] = {}
    pos = [0] * schedule.num_ranks
    free_at = [0.0] * schedule.num_ranks
    remaining = sum(len(ops) for ops in schedule.rank_ops)
    while remaining:
        progressed = False
        for r, ops in enumerate(schedule.rank_ops):
            while pos[r] < len(ops):
                op = ops[pos[r]]
                deps = op_deps(op, schedule.num_stages, schedule.split_backward)
                if any(d not in done for d in deps):
                    break
                start = max([free_at[r], *(done[d][1] for d in deps)])
                end = start + duration(op)
                done[op] = (start, end)
                free_at[r] = end
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ScheduleError(_deadlock_message(schedule, pos, done))
    return done


def _deadlock_message(schedule: Schedule, pos: Sequence[int], done: dict) -> str:
    lines = [f"schedule {schedule.name} deadlocks; ops marked * wait forever:"]
    for r, ops in enumerate(schedule.rank_ops):
        cells = []
        for i, op in enumerate(ops):
            if i == pos[r]:
                waits = [
                    str(d)
                    for d in op_deps(op, schedule.num_stages, schedule.split_backward)
                    if d not in done
                ]
                cells.append(f"*{op}(waits {','.join(waits)})")
            else:
                cells.append(str(op))
        lines.append(f"  rank {r}: " + " ".join(cells))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- builders


def _check_pm(name: str, p: int, m: int) -> None:
    if p < 1:
        raise ScheduleError(f"schedule {name}: pipeline size p={p} must be >= 1")
    if m < 1:
        raise ScheduleError(f"schedule {name}: micro-batches m={m} must be >= 1")


def _plain_stage_rank(p: int) -> tuple[int, ...]:
    return tuple(range(p))


def gpipe(p: int, m: int) -> Schedule:
    """GPipe (Huang et al. 2019): all forwards, then all backwards in reverse order.

    Step time (m + p - 1)(F + B) with uniform stages; holds m micro-batches of activations.
    """
    _check_pm("gpipe", p, m)
    ranks = tuple(
        tuple(Op(r, FORWARD, i) for i in range(m))
        + tuple(Op(r, BACKWARD, i) for i in reversed(range(m)))
        for r in range(p)
    )
    return Schedule("gpipe", m, _plain_stage_rank(p), ranks, notes="Huang et al. 2019")


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B / PipeDream-Flush (Narayanan et al. 2021, SC'21, fig. 4 top).

    Rank r warms up with min(p - r - 1, m) forwards, alternates one forward and
    one backward, then drains the backwards. At most p - r micro-batches are in
    flight on rank r. Step time (m + p - 1)(F + B) with uniform stages.
    """
    _check_pm("1f1b", p, m)
    ranks = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        ops: list[Op] = [Op(r, FORWARD, i) for i in range(warmup)]
        for i in range(m - warmup):
            ops.append(Op(r, FORWARD, warmup + i))
            ops.append(Op(r, BACKWARD, i))
        ops.extend(Op(r, BACKWARD, i) for i in range(m - warmup, m))
        ranks.append(tuple(ops))
    return Schedule("1f1b", m, _plain_stage_rank(p), tuple(ranks), notes="Narayanan et al. 2021")


def from_text(
    text: str, num_microbatches: int | None = None, name: str = "custom", vpp: int | None = None
) -> Schedule:
    """Parse a custom schedule: one line per pipeline rank of ops in canonical text form.

    Blank lines and ``#`` comments are ignored; an optional ``rank N:`` prefix is
    allowed. Stage ownership is taken from where the ops sit; a schedule with W
    ops splits the backward.
    """
    rows: list[tuple[Op, ...]] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.lower().startswith("rank") and ":" in line:
            line = line.split(":", 1)[1]
        rows.append(tuple(Op.parse(tok) for tok in line.split()))
    if not rows:
        raise ScheduleError("custom schedule has no ops")
    owner: dict[int, int] = {}
    for r, ops in enumerate(rows):
        for op in ops:
            if owner.setdefault(op.stage, r) != r:
                raise ScheduleError(
                    f"op {op} is on rank {r} but stage {op.stage} also has ops on rank "
                    f"{owner[op.stage]}"
                )
    num_stages = max(owner) + 1
    missing = [s for s in range(num_stages) if s not in owner]
    if missing:
        raise ScheduleError(f"custom schedule has no ops for stage(s) {missing}")
    m = max(op.mb for ops in rows for op in ops) + 1
    if num_microbatches is not None and m != num_microbatches:
        raise ScheduleError(
            f"custom schedule has {m} micro-batches but the experiment needs {num_microbatches}"
        )
    split = any(op.kind == WEIGHT_GRAD for ops in rows for op in ops)
    sched = Schedule(name, m, tuple(owner[s] for s in range(num_stages)), tuple(rows), split)
    validate(sched)
    return sched


def count_in_flight(ops: Iterable[Op]) -> int:
    """Most micro-batches whose forward ran and whose backward has not, in program order."""
    live = peak = 0
    for op in ops:
        if op.kind == FORWARD:
            live += 1
            peak = max(peak, live)
        elif op.kind == BACKWARD:
            live -= 1
    return peak


BUILDERS: dict[str, Callable[[int, int], Schedule]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
}
"""Schedule builders by experiment-file name: ``builder(p, m) -> Schedule``."""
