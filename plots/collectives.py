"""Bus bandwidth against message size, one line per algorithm (nccl-tests' busbw curve).

Input rows are dicts with ``size_bytes``, ``busbw_GBps`` and ``algo`` (or
``series``, which wins: e.g. ``auto`` whose chosen algorithm changes with the
size), as ``sim collective`` produces them. Sizes go on a log2 axis, busbw in
GB/s (1 GB = 1e9 B) on a linear one; an optional dashed line marks a
reference bandwidth such as the per-direction link rate.

Rendering follows :mod:`plots.style` (same rows, same bytes); the legend sits
right of the axes, off the curves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator

from plots import style

__all__ = ["plot_busbw"]

_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _size_label(nbytes: float) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.3g}{unit}"
    return f"{nbytes:.0f}"


def plot_busbw(rows: Sequence[Mapping], path: str | Path, *, title: str = "",
               reference_GBps: float | None = None, reference_label: str = "link bandwidth",
               ) -> Figure:
    """Save busbw against size for each algorithm in ``rows`` to ``path`` (.png or .svg);
    returns the figure drawn."""
    path = Path(path)
    fmt = style.image_format(path, ("png", "svg"))
    series: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        series.setdefault(str(r.get("series") or r["algo"]), []).append(
            (float(r["size_bytes"]), float(r["busbw_GBps"])))
    with style.figure(8.0, 4.8) as fig:
        ax = fig.add_axes((0.1, 0.14, 0.66, 0.76))
        ax.set_xscale("log", base=2)
        for i, (name, points) in enumerate(series.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], label=name,
                    color=style.series_color(i), marker=_MARKERS[i % len(_MARKERS)],
                    markersize=3.5, linewidth=1.4)
        if reference_GBps is not None:
            ax.axhline(reference_GBps, color=style.REFERENCE, linestyle="--", linewidth=1.0,
                       label=f"{reference_label} ({reference_GBps:g} GB/s)")
        sizes = sorted({p[0] for points in series.values() for p in points})
        if sizes:
            step = max(1, len(sizes) // 10)
            ticks = sizes[::step]
            ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([_size_label(s) for s in ticks])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.grid(True, color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
        style.legend_outside(ax, fontsize=8)
        if title:
            ax.set_title(title, fontsize=10)
        style.save(fig, path, fmt)
    return fig
