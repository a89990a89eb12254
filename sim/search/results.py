"""A finished search: its rows, ranked, the ``sim search --json`` summary and the CSV."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any

from sim.search.evaluation import Evaluation
from sim.search.layouts import DIMS, Layout, file_key, value_text
from sim.search.screening import Candidate


@dataclass(frozen=True)
class Row:
    """One layout of a finished search: how it was judged and, if simulated, its figures."""

    layout: Layout
    status: str
    """``ok``, ``oom``, ``error``, ``invalid`` (refused when built), ``memory`` (rejected by
    the memory bound) or ``pruned`` (its throughput bound is below the K-th best)."""
    stats: dict[str, Any] | None = None
    error: str = ""
    memory_bound_gib: float | None = None
    tokens_bound: float | None = None
    rank: int | None = None
    """1 = best feasible layout; None for layouts that are not feasible."""
    elapsed_s: float = 0.0
    """Wall time of its simulation (0 if not simulated by this run or the stored one)."""

    def figure(self, key: str) -> Any:
        return None if self.stats is None else self.stats.get(key)

    def as_dict(self) -> dict[str, Any]:
        """Flat mapping for the CSV and the plot."""
        out: dict[str, Any] = {"rank": self.rank, "status": self.status, "key": self.layout.key}
        out.update({d: getattr(self.layout, d) for d in DIMS})
        if self.layout.placement is not None:
            out["placement"] = self.layout.placement
        for k in CSV_FIGURES:
            out[k] = self.figure(k)
        out["memory_bound_gib"] = self.memory_bound_gib
        out["tokens_per_s_bound"] = self.tokens_bound
        out["error"] = self.error
        return out


CSV_FIGURES = ("step_time_s", "tokens_per_s", "mfu", "tflops_per_gpu", "peak_memory_gib",
               "memory_capacity_gib", "bubble_fraction", "num_microbatches")
"""Figures of ``sim run --json`` copied into the CSV and the ``top`` list."""


@dataclass
class SearchResult:
    """Everything a search found: rows (ranked feasible first) and counts."""

    experiment: str
    num_gpus: int
    global_batch_size: int
    rows: list[Row]
    elapsed_s: float
    enumerated: int
    """Layouts that divide correctly (before screening)."""
    unsupported: dict[str, str]
    pins: dict[str, tuple[Any, ...]]
    resumed: int = 0
    """Results taken from the store instead of simulated: stored before the search began,
    or by another search sharing the store while this one ran."""
    simulated: int = 0
    """Layouts simulated by this run."""
    counts: dict[str, int] = field(default_factory=dict)
    """Rows per status."""
    screen_s: float = 0.0
    """Wall time of building the context, enumerating and screening (on the executor)."""
    speculated: int = 0
    """Simulations started ahead of the serial order by an idle worker."""
    discarded: int = 0
    """Of those, results the serial order did not want (wasted work, never stored)."""
    wasted_judged: int = 0
    """Candidates judged ahead of the frontier past the point where the sweep stopped."""

    @property
    def feasible(self) -> list[Row]:
        """The ranked rows (simulated, fit), best first."""
        return [r for r in self.rows if r.rank is not None]

    @property
    def best(self) -> Row | None:
        """The best feasible row, or None."""
        feasible = self.feasible
        return feasible[0] if feasible else None

    @property
    def evaluated(self) -> int:
        """Valid layouts judged: by the memory bound, the throughput bound or a simulation."""
        return sum(n for s, n in self.counts.items() if s != "invalid")

    def top(self, k: int) -> list[Row]:
        return self.feasible[:k]

    def summary(self, top: int = 10) -> dict[str, Any]:
        """The ``sim search --json`` object."""
        feasible = self.feasible  # once: a scan of every row
        best = feasible[0] if feasible else None
        return {
            "experiment": self.experiment,
            "num_gpus": self.num_gpus,
            "global_batch_size": self.global_batch_size,
            "enumerated": self.enumerated,
            "evaluated": self.evaluated,
            "simulated": self.simulated,
            "resumed": self.resumed,
            "feasible": len(feasible),
            "counts": dict(sorted(self.counts.items())),
            "elapsed_s": self.elapsed_s,
            "screen_s": self.screen_s,
            "speculated": self.speculated,
            "discarded": self.discarded,
            "layouts_per_s": self.evaluated / self.elapsed_s if self.elapsed_s > 0 else None,
            "pins": {file_key(d): list(v) for d, v in sorted(self.pins.items())},
            "unsupported": dict(sorted(self.unsupported.items())),
            "best": None if best is None else _best_json(best),
            "top": [{"rank": r.rank, "key": r.layout.key, **{k: r.figure(k) for k in CSV_FIGURES}}
                    for r in feasible[:top]],
        }


def _best_json(row: Row) -> dict[str, Any]:
    return {"key": row.layout.key, **row.layout.settings(), "stats": row.stats}


def rows_csv(rows: Sequence[Row]) -> str:
    """All rows as CSV text (header first; empty cells for missing figures)."""
    buf = io.StringIO()
    header = ["rank", "status", "key", *DIMS, *CSV_FIGURES, "memory_bound_gib",
              "tokens_per_s_bound", "error"]
    writer = csv.DictWriter(buf, header, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        d = row.as_dict()
        writer.writerow({k: "" if d[k] is None else (value_text(d[k]) if isinstance(d[k], bool)
                                                      else d[k]) for k in header})
    return buf.getvalue()


_STATUS_ORDER = {"oom": 0, "error": 1, "pruned": 2, "memory": 3, "invalid": 4}
"""Where the rows that are not feasible come, by status (others last)."""
_ROW_KEY = attrgetter("layout.key")


def _rank_rows(rows: list[Row]) -> list[Row]:
    """Feasible rows by throughput (then less memory, then key), numbered; the rest after,
    by status (:data:`_STATUS_ORDER`), then key."""
    def throughput(r: Row) -> float:
        return r.figure("tokens_per_s") or 0.0

    feasible = sorted((r for r in rows if r.status == "ok"),
                      key=lambda r: (-throughput(r), r.figure("peak_memory_gib"), r.layout.key))
    # the rest: one list per status in that order, each sorted by key (stable, as a sort
    # by (status, key) is; ~90,000 rows in a search's serial tail, so no key tuples)
    by_status: dict[int, list[Row]] = {}
    for r in rows:
        if r.status != "ok":
            by_status.setdefault(_STATUS_ORDER.get(r.status, 9), []).append(r)
    rest: list[Row] = []
    for _, group in sorted(by_status.items()):
        group.sort(key=_ROW_KEY)
        rest += group
    return [replace(r, rank=i + 1) for i, r in enumerate(feasible)] + rest


def collect_rows(candidates: Sequence[Candidate], results: Mapping[str, Evaluation],
                  judged: Mapping[str, Candidate], pruned: AbstractSet[str] = frozenset()
                  ) -> list[Row]:
    """One row per candidate, with its simulation result or its verdict, ranked. ``pruned``:
    keys of candidates pruned with their screening verdict (status ``pruned``)."""
    rows = []
    append = rows.append
    new = object.__new__
    # the few judged or simulated layouts looked up by key; the others (most of ~90,000:
    # a serial part of every search) take their screening verdict
    special = judged.keys() | results.keys()
    for c in candidates:
        lay = c.layout
        key = lay.key
        row = new(Row)  # Row(...) field for field, without the frozen dataclass's __init__
        d = row.__dict__
        d["layout"] = lay
        ev = None
        if key in special:
            c = judged.get(key, c)
            ev = results.get(key)
        if ev is None:
            d["status"] = "pruned" if key in pruned else c.status
            d["stats"] = None
            d["error"] = c.reason
            elapsed = 0.0
        else:
            d["status"], d["stats"], d["error"] = ev.status, ev.stats, ev.error
            elapsed = ev.elapsed_s
        d["memory_bound_gib"] = c.memory_bound_gib
        d["tokens_bound"] = c.tokens_bound
        d["rank"] = None
        d["elapsed_s"] = elapsed
        append(row)
    return _rank_rows(rows)


def collect_rows_reference(candidates: Sequence[Candidate], results: Mapping[str, Evaluation],
                           judged: Mapping[str, Candidate],
                           pruned: AbstractSet[str] = frozenset()) -> list[Row]:
    """:func:`collect_rows` written plainly (the reference its tests compare it with)."""
    rows = []
    for c in candidates:
        key = c.layout.key
        c = judged.get(key, c)
        ev = results.get(key)
        if ev is not None:
            rows.append(Row(c.layout, ev.status, ev.stats, ev.error, c.memory_bound_gib,
                            c.tokens_bound, elapsed_s=ev.elapsed_s))
        else:
            rows.append(Row(c.layout, "pruned" if key in pruned else c.status, None,
                            c.reason, c.memory_bound_gib, c.tokens_bound))
    return _rank_rows(rows)
