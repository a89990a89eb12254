"""Memory over time: allocated bytes per GPU as step curves, one panel per timeline.

Reads only :class:`~sim.timeline.Timeline` memory samples (a per-GPU step
function of allocated bytes: static weights and optimizer state plus the
activations stashed by in-flight micro-batches). One panel per timeline on a
shared time axis makes schedules comparable: 1F1B's staircase, ZB-H2's double
height, Seq1F1B's finer steps. Rendering follows :mod:`plots.timeline`: a
private Figure on the Agg canvas, fixed metadata, so same input gives the
same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from sim.timeline import Timeline

__all__ = ["RC_PARAMS", "SAVE_OPTIONS", "draw_memory", "image_format", "plot_memory"]

GiB = 2**30
SAVE_OPTIONS: dict[str, dict[str, dict[str, None]]] = {
    "png": {"metadata": {"Software": None}},
    "svg": {"metadata": {"Date": None, "Creator": None}},
    "pdf": {"metadata": {"CreationDate": None, "ModDate": None, "Creator": None, "Producer": None}},
}
"""Metadata left out of saved files, per format, so that same input gives the same bytes."""
RC_PARAMS = {"svg.hashsalt": "llm-cluster-sim", "svg.fonttype": "path", "pdf.compression": 6}
"""matplotlib settings for deterministic SVG and PDF output (as :mod:`plots.timeline`)."""
_SAME_INSTANT_S = 1e-12
"""Samples closer than this are one instant (event times carry float rounding)."""
_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3",
           "#8c8c8c", "#ccb974", "#64b5cd")


def image_format(path: Path) -> str:
    """``png``, ``svg`` or ``pdf`` from ``path``'s suffix; ``ValueError`` for anything else."""
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in SAVE_OPTIONS:
        raise ValueError(f"cannot save a plot as {path.name!r}: the suffix must be one of "
                         f"{', '.join('.' + f for f in SAVE_OPTIONS)}")
    return fmt


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
        ax.step(xs, ys, where="post", color=_COLORS[n % len(_COLORS)], linewidth=1.2,
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
) -> None:
    """Save memory-over-time curves, one panel per ``(name, timeline)``, shared time axis.

    ``gpus[i]`` selects the GPUs of panel ``i`` (default: every GPU with samples).
    PNG, SVG or PDF by suffix; raises ``ValueError`` for another suffix or no panels.
    """
    path = Path(path)
    fmt = image_format(path)
    if not panels:
        raise ValueError("plot_memory needs at least one (name, timeline) panel")
    chosen = list(gpus) if gpus is not None else [None] * len(panels)
    if len(chosen) != len(panels):
        raise ValueError(f"gpus has {len(chosen)} entries for {len(panels)} panels")
    end = max(t.end_s for _, t in panels)
    height = 0.9 + 1.6 * len(panels)
    with rc_context(RC_PARAMS):
        fig = Figure(figsize=(10.0, height), dpi=110)
        FigureCanvasAgg(fig)
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
        for ax, (name, timeline), sel in zip(axes, panels, chosen, strict=True):
            draw_memory(ax, timeline, sel, end)
            ax.set_title(name, fontsize=9, loc="left")
            ax.legend(fontsize=6, loc="upper right", frameon=False, ncol=2)
        axes[-1].set_xlabel("time (ms)")
        axes[-1].set_xlim(0.0, max(end * 1e3, 1e-9) * 1.01)
        if title:
            fig.suptitle(title, fontsize=10, x=0.01, ha="left")
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format=fmt, **SAVE_OPTIONS[fmt])
