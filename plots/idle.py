"""Idle time by cause: one stacked bar per GPU (the ``idle_breakdown`` of ``stats.json``).

Reads only the stats mapping (:func:`sim.idle.summarize`): per GPU, compute-stream
idle seconds by cause (pipeline bubble, waiting for TP, CP, EP, PP or DP
communication, waiting for a straggler, lost to failures). Rendering follows
:mod:`plots.memory`: a private Figure on the Agg canvas, fixed metadata, so same
input gives the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from matplotlib import rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from plots.memory import RC_PARAMS, SAVE_OPTIONS, image_format
from sim.timeline import IDLE_CAUSES

__all__ = ["plot_idle"]

_COLORS = {"bubble": "#8c8c8c", "tp": "#4c72b0", "cp": "#64b5cd", "ep": "#8172b3",
           "pp": "#55a868", "dp": "#dd8452", "straggler": "#c44e52", "failure": "#000000"}
_MAX_BARS = 128
"""Above this many GPUs, only the first ones are drawn (the title says so)."""


def plot_idle(breakdown: Mapping, path: str | Path, title: str = "") -> None:
    """Save stacked bars (ms) of ``breakdown["per_gpu_s"]`` to ``path`` (PNG, SVG or PDF)."""
    path = Path(path)
    fmt = image_format(path)
    rows = list(breakdown["per_gpu_s"].items())
    note = ""
    if len(rows) > _MAX_BARS:
        note = f" (first {_MAX_BARS} of {len(rows)} GPUs)"
        rows = rows[:_MAX_BARS]
    with rc_context(RC_PARAMS):
        fig = Figure(figsize=(max(6.0, 0.25 * len(rows) + 2.5), 3.6), dpi=110)
        FigureCanvasAgg(fig)
        ax = fig.add_axes((0.1, 0.18, 0.68, 0.7))
        x = list(range(len(rows)))
        bottom = [0.0] * len(rows)
        for cause in IDLE_CAUSES:
            ms = [row.get(cause, 0.0) * 1e3 for _, row in rows]
            if not any(ms):
                continue
            ax.bar(x, ms, bottom=bottom, color=_COLORS[cause], label=cause, width=0.8)
            bottom = [b + v for b, v in zip(bottom, ms, strict=True)]
        step = max(1, len(rows) // 32)
        ax.set_xticks(x[::step], [g for g, _ in rows][::step], fontsize=7)
        ax.set_xlabel("GPU")
        ax.set_ylabel("idle time (ms)")
        ax.set_title((title or "idle time by cause") + note, fontsize=9)
        if any(bottom):
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        else:
            ax.text(0.5, 0.5, "no idle time", transform=ax.transAxes, ha="center")
        fig.savefig(path, format=fmt, **SAVE_OPTIONS[fmt])
