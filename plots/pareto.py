"""The ``sim search`` figure: throughput against peak memory of every simulated layout.

One dot per simulated layout (x: peak memory of the fullest GPU, GiB; y:
throughput, tokens/s), coloured by pipeline schedule; layouts that ran out of
memory when simulated are crosses. The Pareto front (no other feasible layout
is both faster and smaller) is a step line, the GPU's capacity a dashed
vertical line, and the best layout a star with its label.

Inputs are plain mappings (:meth:`sim.search.Row.as_dict`: ``status``,
``schedule``, ``peak_memory_gib``, ``tokens_per_s``, ``key``). Rendering follows
:mod:`plots.timeline`: a private Figure on the Agg canvas with fixed metadata,
so the same rows give the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from plots.memory import RC_PARAMS, SAVE_OPTIONS, image_format

__all__ = ["SCHEDULE_COLORS", "pareto_front", "plot_pareto"]

SCHEDULE_COLORS: dict[str, str] = {
    "gpipe": "#8c8c8c",
    "1f1b": "#4c72b0",
    "interleaved": "#dd8452",
    "zb-h1": "#55a868",
    "zb-h2": "#c44e52",
    "zb-v": "#8172b3",
    "dualpipe-v": "#937860",
    "seq1f1b": "#da8bc3",
}
"""Colour of each schedule (others: :data:`_OTHER_COLORS` in name order)."""
_OTHER_COLORS = ("#ccb974", "#64b5cd", "#000000")
_SIMULATED = ("ok", "oom")


def pareto_front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (memory, throughput) points no other point beats on both, by increasing memory."""
    front: list[tuple[float, float]] = []
    for mem, tput in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or tput > front[-1][1]:
            front.append((mem, tput))
    return front


def _color(schedule: str, others: list[str]) -> str:
    if schedule in SCHEDULE_COLORS:
        return SCHEDULE_COLORS[schedule]
    return _OTHER_COLORS[others.index(schedule) % len(_OTHER_COLORS)]


def _draw(ax: Axes, rows: Sequence[Mapping[str, Any]], best_key: str | None,
          capacity_gib: float | None) -> None:
    simulated = [r for r in rows if r.get("status") in _SIMULATED
                 and r.get("tokens_per_s") is not None and r.get("peak_memory_gib") is not None]
    schedules = sorted({r["schedule"] for r in simulated},
                       key=lambda s: (s not in SCHEDULE_COLORS, list(SCHEDULE_COLORS).index(s)
                                      if s in SCHEDULE_COLORS else 0, s))
    others = [s for s in schedules if s not in SCHEDULE_COLORS]
    for sched in schedules:
        color = _color(sched, others)
        for status, marker in (("ok", "o"), ("oom", "x")):
            pts = [(r["peak_memory_gib"], r["tokens_per_s"]) for r in simulated
                   if r["schedule"] == sched and r["status"] == status]
            if pts:
                ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=18, marker=marker,
                           color=color, alpha=0.8, linewidths=1.0,
                           label=sched if status == "ok" else f"{sched} (out of memory)")
    front = pareto_front([(r["peak_memory_gib"], r["tokens_per_s"]) for r in simulated
                          if r["status"] == "ok"])
    if front:
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="#333333",
                linewidth=1.0, label="Pareto front")
    if capacity_gib is not None:
        ax.axvline(capacity_gib, color="#c44e52", linestyle="--", linewidth=1.0,
                   label=f"capacity {capacity_gib:.0f} GiB")
    best = next((r for r in simulated if r.get("key") == best_key), None)
    if best is not None:
        ax.scatter([best["peak_memory_gib"]], [best["tokens_per_s"]], s=220, marker="*",
                   color="#ffd92f", edgecolors="#000000", linewidths=0.8, zorder=5,
                   label="best")
        ax.annotate(_short(best), (best["peak_memory_gib"], best["tokens_per_s"]),
                    xytext=(-10, -16), textcoords="offset points", fontsize=8, ha="right")
    ax.set_xlabel("peak memory of the fullest GPU (GiB)")
    ax.set_ylabel("throughput (tokens/s)")
    ax.grid(True, linewidth=0.4, alpha=0.5)
    if simulated:
        ax.legend(fontsize=7, loc="lower right", ncols=2)
    else:
        ax.text(0.5, 0.5, "no layout was simulated", ha="center", va="center",
                transform=ax.transAxes)


def _short(row: Mapping[str, Any]) -> str:
    parts = [f"tp{row['tp']} pp{row['pp']} dp{row['dp']}", f"mbs{row['micro_batch_size']}"]
    if row.get("vpp", 1) != 1:
        parts.append(f"v{row['vpp']}")
    if row.get("sequence_parallel"):
        parts.append("sp")
    parts += [f"zero{row['zero_stage']}", f"rc:{row['recompute']}", str(row["schedule"])]
    return " ".join(parts)


def plot_pareto(rows: Sequence[Mapping[str, Any]], path: str | Path, title: str = "",
                best_key: str | None = None, capacity_gib: float | None = None) -> None:
    """Save the throughput-memory figure of a search (PNG, SVG or PDF by suffix).

    ``rows``: every layout of the search (only ``ok`` and ``oom`` rows are drawn);
    ``best_key``: the layout key to mark as best; ``capacity_gib``: the GPU's
    memory (drawn as a vertical line; default: taken from the rows' stats when
    present, else none). Raises ``ValueError`` for an unknown suffix.
    """
    path = Path(path)
    fmt = image_format(path)
    if capacity_gib is None:
        capacity_gib = next((r["memory_capacity_gib"] for r in rows
                             if r.get("memory_capacity_gib") is not None), None)
    with rc_context(RC_PARAMS):
        fig = Figure(figsize=(8.0, 5.5), dpi=110)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        _draw(ax, rows, best_key, capacity_gib)
        if title:
            ax.set_title(title, fontsize=10)
        fig.tight_layout()
        fig.savefig(path, format=fmt, **SAVE_OPTIONS[fmt])
