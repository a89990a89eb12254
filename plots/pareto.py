"""The ``sim search`` figure: throughput against peak memory of every simulated layout.

One dot per simulated layout (x: peak memory of the fullest GPU, GiB; y:
throughput, tokens/s), coloured by pipeline schedule (:mod:`plots.style`); layouts that ran out of
memory when simulated are crosses. The Pareto front (no other feasible layout
is both faster and smaller) is a step line, the GPU's capacity a dashed
vertical line, and the best layout a star with its label.

Inputs are plain mappings (:meth:`sim.search.Row.as_dict`: ``status``,
``schedule``, ``peak_memory_gib``, ``tokens_per_s``, ``key``). The legend sits
right of the axes, off the dots; the same rows give the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from plots import style

__all__ = ["pareto_front", "plot_pareto"]

_SIMULATED = ("ok", "oom")
_BEST_COLOR = "#ffd92f"


def pareto_front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (memory, throughput) points no other point beats on both, by increasing memory."""
    front: list[tuple[float, float]] = []
    for mem, tput in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or tput > front[-1][1]:
            front.append((mem, tput))
    return front


def _draw(ax: Axes, rows: Sequence[Mapping[str, Any]], best_key: str | None,
          capacity_gib: float | None) -> None:
    simulated = [r for r in rows if r.get("status") in _SIMULATED
                 and r.get("tokens_per_s") is not None and r.get("peak_memory_gib") is not None]
    known = list(style.COLORS)
    schedules = sorted({r["schedule"] for r in simulated},
                       key=lambda s: (s not in known, known.index(s) if s in known else 0, s))
    for sched in schedules:
        color = style.color(sched)
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
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color=style.REFERENCE,
                linewidth=1.0, label="Pareto front")
    if capacity_gib is not None:
        ax.axvline(capacity_gib, color=style.REFERENCE, linestyle="--", linewidth=1.0,
                   label=f"capacity {capacity_gib:.0f} GiB")
    best = next((r for r in simulated if r.get("key") == best_key), None)
    if best is not None:
        ax.scatter([best["peak_memory_gib"]], [best["tokens_per_s"]], s=220, marker="*",
                   color=_BEST_COLOR, edgecolors="#000000", linewidths=0.8, zorder=5,
                   label="best")
        ax.annotate(_short(best), (best["peak_memory_gib"], best["tokens_per_s"]),
                    xytext=(-10, -16), textcoords="offset points", fontsize=8, ha="right")
    ax.set_xlabel("peak memory of the fullest GPU (GiB)")
    ax.set_ylabel("throughput (tokens/s)")
    ax.grid(True, linewidth=0.4, alpha=0.5)
    if simulated:
        style.legend_outside(ax)
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
                best_key: str | None = None, capacity_gib: float | None = None) -> Figure:
    """Save the throughput-memory figure of a search (PNG, SVG or PDF by suffix).

    ``rows``: every layout of the search (only ``ok`` and ``oom`` rows are drawn);
    ``best_key``: the layout key to mark as best; ``capacity_gib``: the GPU's
    memory (drawn as a vertical line; default: taken from the rows' stats when
    present, else none). Returns the figure drawn. Raises ``ValueError`` for an
    unknown suffix.
    """
    path = Path(path)
    fmt = style.image_format(path)
    if capacity_gib is None:
        capacity_gib = next((r["memory_capacity_gib"] for r in rows
                             if r.get("memory_capacity_gib") is not None), None)
    with style.figure(9.5, 5.5) as fig:
        ax = fig.add_subplot()
        _draw(ax, rows, best_key, capacity_gib)
        if title:
            ax.set_title(title, fontsize=10)
        fig.tight_layout()
        style.save(fig, path, fmt)
    return fig
