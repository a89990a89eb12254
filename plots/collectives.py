"""Bus bandwidth against message size, one line per algorithm (nccl-tests' busbw curve).

Input rows are dicts with ``size_bytes``, ``busbw_GBps`` and ``algo`` (or
``series``, which wins: e.g. ``auto`` whose chosen algorithm changes with the
size), as ``sim collective`` produces them. Sizes go on a log2 axis, busbw in
GB/s (1 GB = 1e9 B) on a linear one; an optional dashed line marks a
reference bandwidth such as the per-direction link rate.

Rendering uses a private :class:`~matplotlib.figure.Figure` on the Agg canvas
(no pyplot); output is deterministic (fixed ``svg.hashsalt``, no dates or
software versions in the metadata), like :mod:`plots.timeline`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib import rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator

__all__ = ["plot_busbw"]

_SAVE_OPTIONS: dict[str, dict[str, dict[str, None]]] = {
    "png": {"metadata": {"Software": None}},
    "svg": {"metadata": {"Date": None, "Creator": None}},
}
_RC = {"svg.hashsalt": "llm-cluster-sim", "svg.fonttype": "path"}
_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3",
           "#8c8c8c")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _size_label(nbytes: float) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.3g}{unit}"
    return f"{nbytes:.0f}"


def plot_busbw(rows: Sequence[Mapping], path: str | Path, *, title: str = "",
               reference_GBps: float | None = None, reference_label: str = "link bandwidth",
               ) -> None:
    """Save busbw against size for each algorithm in ``rows`` to ``path`` (.png or .svg)."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in _SAVE_OPTIONS:
        raise ValueError(f"cannot save a busbw plot as {path.name!r}: the suffix must be .png "
                         "or .svg")
    series: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        series.setdefault(str(r.get("series") or r["algo"]), []).append(
            (float(r["size_bytes"]), float(r["busbw_GBps"])))
    with rc_context(_RC):
        fig = Figure(figsize=(8.0, 4.8), dpi=110)
        FigureCanvasAgg(fig)
        ax = fig.add_axes((0.1, 0.14, 0.86, 0.76))
        ax.set_xscale("log", base=2)
        for i, (name, points) in enumerate(series.items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], label=name,
                    color=_COLORS[i % len(_COLORS)], marker=_MARKERS[i % len(_MARKERS)],
                    markersize=3.5, linewidth=1.4)
        if reference_GBps is not None:
            ax.axhline(reference_GBps, color="#444444", linestyle="--", linewidth=1.0,
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
        if series or reference_GBps is not None:
            ax.legend(loc="upper left", fontsize=8, frameon=False)
        if title:
            ax.set_title(title, fontsize=10)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format=fmt, **_SAVE_OPTIONS[fmt])
