"""Memory over time: allocated bytes per GPU as step curves, one panel per timeline.

Reads only :class:`~sim.timeline.Timeline` memory samples (a per-GPU step
function of allocated bytes: static weights and optimizer state plus the
activations stashed by in-flight micro-batches). One panel per timeline on a
shared time axis makes schedules comparable: 1F1B's staircase, ZB-H2's double
height, Seq1F1B's finer steps. Rendering follows :mod:`plots.style`: same input gives the
same bytes; each panel's legend sits right of it, off the curves.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from plots import style
from sim.timeline import Timeline

__all__ = ["draw_memory", "plot_memory"]

GiB = 2**30
_SAME_INSTANT_S = 1e-12
"""Samples closer than this are one instant (event times carry float rounding)."""


def _label(timeline: Timeline, gpu: int) -> str:
    if gpu < len(timeline.gpu_names) and timeline.gpu_names[gpu]:
        return timeline.gpu_names[gpu]
    return f"GPU {gpu}"


def draw_memory(ax: Axes, timeline: Timeline, gpus: Sequence[int] | None = None,
                end_s: float | None = None) -> None:
    """Draw the memory step curves (GiB over ms) of ``gpus`` (default: all with samples).

    Samples at the same instant (a backward frees, the next forward allocates)
    are drawn as the state after that instant. Each curve is held flat to
    ``end_s`` (default: the timeline's end).
    """
    by_gpu: dict[int, list[tuple[float, float]]] = {}
    for sample in timeline.memory:
        points = by_gpu.setdefault(sample.gpu, [])
        if points and abs(points[-1][0] - sample.time_s) <= _SAME_INSTANT_S:
            points[-1] = (sample.time_s, sample.bytes)  # the state after that instant
        else:
            points.append((sample.time_s, sample.bytes))
    chosen = sorted(by_gpu) if gpus is None else [g for g in gpus if g in by_gpu]
    end = timeline.end_s if end_s is None else end_s
    for n, gpu in enumerate(chosen):
        points = by_gpu[gpu]
        xs = [t * 1e3 for t, _ in points] + [max(end, points[-1][0]) * 1e3]
        ys = [b / GiB for _, b in points] + [points[-1][1] / GiB]
        ax.step(xs, ys, where="post", color=style.series_color(n), linewidth=1.2,
                label=_label(timeline, gpu))
    ax.set_ylabel("GiB", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.set_ylim(bottom=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def plot_memory(
    panels: Sequence[tuple[str, Timeline]],
    path: str | Path,
    gpus: Sequence[Sequence[int] | None] | None = None,
    title: str = "",
) -> Figure:
    """Save memory-over-time curves, one panel per ``(name, timeline)``, shared time axis.

    ``gpus[i]`` selects the GPUs of panel ``i`` (default: every GPU with samples).
    PNG, SVG or PDF by suffix; returns the figure drawn. Raises ``ValueError`` for
    another suffix or no panels.
    """
    path = Path(path)
    fmt = style.image_format(path)
    if not panels:
        raise ValueError("plot_memory needs at least one (name, timeline) panel")
    chosen = list(gpus) if gpus is not None else [None] * len(panels)
    if len(chosen) != len(panels):
        raise ValueError(f"gpus has {len(chosen)} entries for {len(panels)} panels")
    end = max(t.end_s for _, t in panels)
    height = 0.9 + 1.6 * len(panels)
    with style.figure(10.0, height) as fig:
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
        for ax, (name, timeline), sel in zip(axes, panels, chosen, strict=True):
            draw_memory(ax, timeline, sel, end)
            ax.set_title(name, fontsize=9, loc="left")
            style.legend_outside(ax, fontsize=6)
        axes[-1].set_xlabel("time (ms)")
        axes[-1].set_xlim(0.0, max(end * 1e3, 1e-9) * 1.01)
        if title:
            fig.suptitle(title, fontsize=10, x=0.01, ha="left")
        fig.tight_layout()
        style.save(fig, path, fmt)
    return fig
