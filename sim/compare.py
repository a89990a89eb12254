"""``sim compare``: one experiment under several pipeline schedules, side by side.

The logic behind the command, without printing or plotting: :func:`compare`
runs the experiment once per schedule (:meth:`Experiment.with_changes`) and
returns one :class:`CompareRow` per schedule; :func:`rows_table`,
:func:`rows_csv` and :func:`rows_json` format them (deterministic text).

Chunks per rank (``parallel.vpp``) follow the schedule, so that one experiment
file serves every schedule (:func:`schedule_changes`):

* ``interleaved`` needs ``vpp > 1``: the experiment's ``vpp`` if it is above 1,
  else 2 (Narayanan et al. 2021);
* the V schedules ``zb-v`` and ``dualpipe-v`` need exactly 2 chunks per rank
  (Qi et al. 2024, sec. 6; DeepSeek-AI 2024);
* every other built-in schedule has one chunk per rank (``vpp = 1``);
* a custom schedule file keeps the experiment's ``vpp`` (its stages say it all);
* ``parallel.microbatch_group_size`` is kept under ``interleaved`` and dropped elsewhere.

Steady state (DESIGN.md ``step_time_s``): ZB-H2 and ZB-V drop the step barrier
(the Zero Bubble paper's optimizer post-validation), so their step time in
steady state is the period of back-to-back steps. A row's ``step_time_s`` and
``bubble_fraction`` mean exactly what ``sim run`` reports for the same
experiment (:func:`sim.api.simulate` with its default steps: for these two
schedules several overlapping steps, the middle one measured; on the ideal
cluster with the synthetic model it equals the pure list-schedule
:func:`~workloads.schedules_advanced.steady_state_period`). The timelines drawn
are one isolated step (``simulate(..., steps=1)``), whose time and bubble are
the ``isolated_step_s`` and ``isolated_bubble_fraction`` columns. Other
schedules keep the barrier, so for them both pairs are equal.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from base.errors import ConfigError
from workloads.program import Send
from workloads.registry import (  # (the defaults kept there: `sim compare --help`)
    DEFAULT_SCHEDULES,
    MULTIMODAL_SCHEDULES,
    SCHEDULES,
    overlaps_steps,
)

if TYPE_CHECKING:  # the engine (simpy) is only needed to run, not to format rows
    from sim.api import Result
    from sim.experiment import Experiment

__all__ = [
    "DEFAULT_SCHEDULES",
    "MULTIMODAL_SCHEDULES",
    "CompareRow",
    "compare",
    "compare_row",
    "parse_schedules",
    "rows_csv",
    "rows_json",
    "rows_table",
    "schedule_changes",
]


GiB = 2**30


@dataclass(frozen=True)
class CompareRow:
    """One schedule's results in a comparison."""

    schedule: str
    """Schedule name (or custom file path) as given."""
    vpp: int
    """Chunks per rank it ran with."""
    step_time_s: float
    """The step time ``sim run`` reports: the period of back-to-back steps for schedules
    that overlap steps (ZB-H2, ZB-V), else one step under the step barrier."""
    bubble_fraction: float
    """Compute-stream idle time / (ranks x step time), of the same simulation as
    :attr:`step_time_s` (what ``sim run`` reports)."""
    steady_period_s: float | None
    """Period of back-to-back steps: the engine's for schedules that overlap steps (ZB-H2,
    ZB-V), else the step time; None where it was not computed."""
    isolated_step_s: float
    """One isolated step from an idle pipeline, with the step barrier (the timeline drawn)."""
    isolated_bubble_fraction: float
    """The bubble fraction of that isolated step."""
    peak_activation_gib: tuple[float, ...]
    """Per pipeline rank: peak memory minus the memory held all step (weights, optimizer)."""
    pp_bytes_sent: float
    """Bytes of all pipeline (activation and gradient) messages of one step, all GPUs."""
    relative_speed: float
    """First schedule's step time / this schedule's step time (> 1 = faster)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready mapping, keys in a fixed order."""
        return {
            "schedule": self.schedule,
            "vpp": self.vpp,
            "step_time_s": self.step_time_s,
            "bubble_fraction": self.bubble_fraction,
            "steady_period_s": self.steady_period_s,
            "isolated_step_s": self.isolated_step_s,
            "isolated_bubble_fraction": self.isolated_bubble_fraction,
            "peak_activation_gib": max(self.peak_activation_gib, default=0.0),
            "peak_activation_gib_per_rank": list(self.peak_activation_gib),
            "pp_bytes_sent": self.pp_bytes_sent,
            "relative_speed": self.relative_speed,
        }


def parse_schedules(text: str) -> tuple[str, ...]:
    """``"1f1b,zb-v"`` -> ``("1f1b", "zb-v")``; ConfigError naming ``--schedules`` if bad."""
    names = tuple(part.strip() for part in text.split(","))
    if not names or any(not n for n in names):
        raise ConfigError(f"--schedules={text!r}: give a comma-separated list of schedule names, "
                          "e.g. 1f1b,zb-h1,zb-v")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"--schedules={text!r}: {dupes[0]!r} is listed twice")
    return names


def schedule_changes(exp: Experiment, name: str) -> dict[str, Any]:
    """The ``with_changes`` mapping that runs ``exp`` under schedule ``name`` (module doc rule)."""
    vpp = exp.config.parallel.vpp
    kind = SCHEDULES.get(name)
    if kind is not None and kind.fixed_vpp is not None:
        vpp = kind.fixed_vpp
    elif kind is not None and vpp == 1:
        vpp = kind.default_vpp
    changes: dict[str, Any] = {"schedule": name, "parallel.vpp": vpp}
    grouped = kind is not None and kind.grouped is not None  # interleaved's setting alone
    if exp.config.parallel.microbatch_group_size is not None and not grouped:
        changes["parallel.microbatch_group_size"] = None
    return changes


def compare(
    exp: Experiment,
    schedules: Sequence[str] = DEFAULT_SCHEDULES,
    simulate: Callable[[Experiment], Result] | None = None,
    base_dir: str | Path | None = None,
) -> tuple[list[CompareRow], list[Result]]:
    """Run ``exp`` under each schedule; returns the rows and the simulation results, in order.

    ``simulate`` defaults to :func:`sim.api.simulate` of one isolated step; schedules
    whose steps overlap also run with the default number of steps for their period
    (with a custom ``simulate``, its own step time is taken as the period). A custom
    schedule file
    given by a relative path is looked up in the working directory, then in
    ``base_dir`` (the experiment file's folder, as ``sim run`` does). A
    schedule that does not fit the experiment raises :class:`ConfigError`
    naming it.
    """
    if not schedules:
        raise ConfigError("--schedules: give at least one schedule")
    steady: Callable[[Experiment], Result]
    if simulate is None:
        from sim.api import simulate as steady  # the engine, only when running
        simulate = partial(steady, steps=1)
    else:
        steady = simulate
    variants = []
    for name in schedules:  # build every variant first: a bad name fails before any run
        changes = schedule_changes(exp, name)
        path = Path(name)
        if (name not in SCHEDULES and base_dir is not None and not path.is_absolute()
                and not path.exists() and (Path(base_dir) / path).is_file()):
            changes["schedule"] = str(Path(base_dir) / path)
        try:
            variants.append(exp.with_changes(changes))
        except ConfigError as exc:
            raise ConfigError(f"--schedules: {name}: {exc}") from None
    results = [simulate(variant) for variant in variants]
    rows: list[CompareRow] = []
    for name, variant, result in zip(schedules, variants, results, strict=True):
        steady_stats = (steady(variant).stats if overlaps_steps(variant.schedule.name)
                        else None)
        row = compare_row(name, result, rows[0].step_time_s if rows else None, steady_stats)
        rows.append(row)
    return rows, results


def compare_row(name: str, result: Result, first_step_s: float | None = None,
                steady_stats: dict[str, Any] | None = None) -> CompareRow:
    """One row from the isolated-step ``result`` (the timeline drawn).

    ``steady_stats`` are the stats of the steady-state simulation for schedules whose
    steps overlap (what ``sim run`` reports for them); for the others the isolated step
    is what ``sim run`` reports. ``first_step_s`` is the reference step time of the
    relative speed (None: this row is the reference).
    """
    exp = result.experiment
    isolated = result.stats
    reported = steady_stats if steady_stats is not None else isolated
    step = reported["step_time_s"]
    first = step if first_step_s is None else first_step_s
    return CompareRow(
        schedule=name,
        vpp=exp.schedule.chunks_per_rank,
        step_time_s=step,
        bubble_fraction=reported["bubble_fraction"],
        steady_period_s=step,
        isolated_step_s=isolated["step_time_s"],
        isolated_bubble_fraction=isolated["bubble_fraction"],
        peak_activation_gib=_peak_activation_gib(result),
        pp_bytes_sent=_pp_bytes_sent(result),
        relative_speed=first / step if step > 0 else float("inf"),
    )


def _simulated_gpus(result: Result) -> tuple[int, ...]:
    timeline = result.timeline
    gpus = getattr(timeline, "simulated_gpus", None)
    return tuple(gpus) if gpus is not None else tuple(range(timeline.num_gpus))


def _peak_activation_gib(result: Result) -> tuple[float, ...]:
    placement = result.experiment.placement
    static = result.program.static_bytes
    peaks: dict[int, float] = {}
    for g in _simulated_gpus(result):
        rank = placement.coords(g)["pp"]
        act = result.timeline.peak_memory_bytes(g) - static[g]
        peaks[rank] = max(peaks.get(rank, 0.0), act)
    return tuple(peaks.get(r, 0.0) / GiB for r in range(placement.degree("pp")))


def _pp_bytes_sent(result: Result) -> float:
    sent = sum(ins.nbytes for ins in result.program.instructions
               if isinstance(ins, Send) and ins.kind == "pp")
    simulated = len(_simulated_gpus(result))
    return sent * result.timeline.num_gpus / simulated if simulated else 0.0


# ----------------------------------------------------------------------------- formatting


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1e3:.3f}"


def rows_table(rows: Sequence[CompareRow]) -> str:
    """The human-readable table ``sim compare`` prints (times in ms, memory in GiB)."""
    head = ("schedule", "vpp", "step ms", "bubble", "isolated ms", "peak act. GiB per rank",
            "pp sent MB", "speed")
    body = [
        (r.schedule, str(r.vpp), _ms(r.step_time_s), f"{r.bubble_fraction:.2%}",
         _ms(r.isolated_step_s), " ".join(f"{g:.2f}" for g in r.peak_activation_gib),
         f"{r.pp_bytes_sent / 1e6:.1f}", f"{r.relative_speed:.2f}x")
        for r in rows
    ]
    widths = [max(len(line[i]) for line in (head, *body)) for i in range(len(head))]
    lines = []
    for line in (head, *body):
        cells = [line[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(line[1:], widths[1:],
                                                                           strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def rows_json(rows: Sequence[CompareRow], experiment: str = "") -> str:
    """The JSON text of ``compare.json`` and ``sim compare --json`` (one object)."""
    payload = {"experiment": experiment, "schedules": [r.as_dict() for r in rows]}
    return json.dumps(payload, indent=2) + "\n"


def rows_csv(rows: Sequence[CompareRow]) -> str:
    """The CSV text of ``compare.csv``: one line per schedule, a column per pipeline rank."""
    ranks = max((len(r.peak_activation_gib) for r in rows), default=0)
    fields = ["schedule", "vpp", "step_time_s", "bubble_fraction", "steady_period_s",
              "isolated_step_s", "isolated_bubble_fraction", "peak_activation_gib",
              *(f"peak_activation_gib_rank{i}" for i in range(ranks)),
              "pp_bytes_sent", "relative_speed"]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(fields)
    for r in rows:
        d = r.as_dict()
        per_rank = d["peak_activation_gib_per_rank"] + [None] * (ranks - len(r.peak_activation_gib))
        values = [d[f] for f in fields[:8]] + per_rank + [d[f] for f in fields[-2:]]
        writer.writerow(["" if v is None else repr(v) if isinstance(v, float) else v
                         for v in values])
    return out.getvalue()
