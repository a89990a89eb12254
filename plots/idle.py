"""Idle time by cause: one stacked bar per GPU (the ``idle_breakdown`` of ``stats.json``).

Reads only the stats mapping (:func:`sim.idle.summarize`): per GPU, compute-stream
idle seconds by cause (pipeline bubble, waiting for TP, CP, EP, PP or DP
communication, waiting for a straggler, lost to failures). Causes take the
colours and labels of :mod:`plots.style` (waiting for TP is TP's colour in the
timeline too); the legend sits right of the axes, in the order of the stack.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from matplotlib.figure import Figure

from plots import style
from sim.timeline import IDLE_CAUSES

__all__ = ["plot_idle"]

_MAX_BARS = 128
"""Above this many GPUs, the first and the last half of this many are drawn (the last
pipeline stage, usually the bottleneck, stays in view) and the title names the others."""


def plot_idle(breakdown: Mapping, path: str | Path, title: str = "") -> Figure:
    """Save stacked bars (ms) of ``breakdown["per_gpu_s"]`` to ``path`` (PNG, SVG or PDF);
    returns the figure drawn."""
    path = Path(path)
    fmt = style.image_format(path)
    rows = list(breakdown["per_gpu_s"].items())
    note, cut = "", None
    if len(rows) > _MAX_BARS:
        head = _MAX_BARS // 2
        tail = len(rows) - (_MAX_BARS - head)
        note = (f" ({_MAX_BARS} of {len(rows)} GPUs: {rows[head][0]} to {rows[tail - 1][0]} "
                "left out)")
        rows, cut = rows[:head] + rows[tail:], head - 0.5
    with style.figure(min(16.0, max(6.0, 0.25 * len(rows) + 2.5)), 3.6) as fig:
        ax = fig.add_axes((0.1, 0.18, 0.68, 0.7))
        x = list(range(len(rows)))
        bottom = [0.0] * len(rows)
        for cause in IDLE_CAUSES:
            ms = [row.get(cause, 0.0) * 1e3 for _, row in rows]
            if not any(ms):
                continue
            ax.bar(x, ms, bottom=bottom, color=style.color(cause), label=style.label(cause),
                   width=0.8)
            bottom = [b + v for b, v in zip(bottom, ms, strict=True)]
        step = max(1, len(rows) // 32)
        ax.set_xticks(x[::step], [g for g, _ in rows][::step], fontsize=7)
        if cut is not None:  # where GPUs were left out
            ax.axvline(cut, color=style.REFERENCE, linestyle=":", linewidth=1.0)
        ax.set_xlabel("GPU")
        ax.set_ylabel("idle time (ms)")
        ax.set_title((title or "idle time by cause") + note, fontsize=9)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        if not style.legend_outside(ax, fontsize=8, reverse=True):  # as stacked
            ax.text(0.5, 0.5, "no idle time", transform=ax.transAxes, ha="center")
        style.save(fig, path, fmt)
    return fig
