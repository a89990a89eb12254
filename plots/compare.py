"""The ``sim compare`` figure: schedules' timelines stacked on one time axis, plus bars.

Left: one Gantt panel per schedule (compute stream of one GPU per pipeline
rank, bars coloured by kind as everywhere, :mod:`plots.style`), all on a shared time
axis so lengths compare at a glance. Right: bars of the step time (with the
steady-state period of back-to-back steps as a black tick where it differs)
and of the peak activation memory (largest rank; dots for every rank).

Inputs are plain: a :class:`~sim.timeline.Timeline` per schedule and the row
mappings of :meth:`sim.compare.CompareRow.as_dict`. Rendering follows
:mod:`plots.style`: same input, same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from plots import style
from sim.timeline import COMPUTE_KINDS, COMPUTE_STREAM, Timeline

__all__ = ["plot_compare"]

_ROW_IN = 0.2
_PANEL_PAD_IN = 0.3


def plot_compare(
    rows: Sequence[Mapping[str, Any]],
    timelines: Sequence[Timeline],
    path: str | Path,
    gpus: Sequence[Sequence[int]] | None = None,
    title: str = "",
) -> Figure:
    """Save the comparison figure (PNG, SVG or PDF by suffix).

    ``rows[i]`` (keys ``schedule``, ``step_time_s``, ``bubble_fraction``, optional
    ``isolated_step_s`` and ``isolated_bubble_fraction``, ``peak_activation_gib``,
    ``peak_activation_gib_per_rank``) describes ``timelines[i]`` (one isolated step);
    ``gpus[i]`` lists the GPUs drawn for it, one row each (default: every GPU with
    compute spans). Returns the figure drawn.
    Raises ``ValueError`` for mismatched lengths, no rows, or an unknown suffix.
    """
    path = Path(path)
    fmt = style.image_format(path)
    if not rows:
        raise ValueError("plot_compare needs at least one row")
    if len(rows) != len(timelines) or (gpus is not None and len(gpus) != len(rows)):
        raise ValueError(f"{len(rows)} rows, {len(timelines)} timelines and "
                         f"{'no' if gpus is None else len(gpus)} GPU lists do not match")
    chosen = [list(g) for g in gpus] if gpus is not None else [
        sorted({s.gpu for s in t.spans if s.stream == COMPUTE_STREAM}) for t in timelines]
    heights = [max(len(g), 1) * _ROW_IN + _PANEL_PAD_IN for g in chosen]
    fig_h = max(4.2, sum(heights) * 1.45 + 1.3)
    end_ms = max(t.end_s for t in timelines) * 1e3 or 1.0
    with style.figure(13.0, fig_h) as fig:
        outer = fig.add_gridspec(1, 2, width_ratios=(3.2, 1.0), wspace=0.22, left=0.09,
                                 right=0.98, top=1 - 0.55 / fig_h, bottom=0.75 / fig_h)
        left = outer[0].subgridspec(len(rows), 1, height_ratios=heights, hspace=0.45)
        kinds: set[str] = set()
        axes: list[Axes] = []
        for i, (row, timeline, sel) in enumerate(zip(rows, timelines, chosen, strict=True)):
            ax = fig.add_subplot(left[i], sharex=axes[0] if axes else None)
            axes.append(ax)
            kinds |= _draw_gantt(ax, timeline, sel)
            ax.set_title(_panel_title(row), fontsize=8, loc="left", pad=2)
            ax.tick_params(axis="x", labelbottom=i == len(rows) - 1, labelsize=7)
        axes[0].set_xlim(0.0, end_ms * 1.01)
        axes[-1].set_xlabel("time (ms)", fontsize=8)
        right = outer[1].subgridspec(2, 1, hspace=0.55)
        _draw_step_bars(fig.add_subplot(right[0]), rows)
        _draw_memory_bars(fig.add_subplot(right[1]), rows)
        order = [k for k in COMPUTE_KINDS if k in kinds] + sorted(kinds - set(COMPUTE_KINDS))
        handles = [Patch(facecolor=style.color(k), label=style.label(k)) for k in order]
        if handles:
            fig.legend(handles=handles, loc="lower left", ncol=len(handles), fontsize=7,
                       frameon=False, bbox_to_anchor=(0.09, 0.0))
        if title:
            fig.suptitle(title, fontsize=10, x=0.01, y=1 - 0.12 / fig_h, ha="left", va="top")
        style.save(fig, path, fmt)
    return fig


def _panel_title(row: Mapping[str, Any]) -> str:
    text = (f"{row['schedule']}: step {row['step_time_s'] * 1e3:.2f} ms, "
            f"bubble {row['bubble_fraction']:.1%}")
    isolated = row.get("isolated_step_s")
    if isolated is not None and abs(isolated - row["step_time_s"]) > 1e-12:
        text += (f" (steady); drawn: one isolated step {isolated * 1e3:.2f} ms, "
                 f"bubble {row['isolated_bubble_fraction']:.1%}")
    return text


def _draw_gantt(ax: Axes, timeline: Timeline, gpus: Sequence[int]) -> set[str]:
    """Compute-stream bars of ``gpus`` (row i = gpus[i]); returns the kinds drawn."""
    row_of = {g: i for i, g in enumerate(gpus)}
    by_kind: dict[str, list[list[tuple[float, float]]]] = {}
    for span in timeline.spans:
        if span.stream != COMPUTE_STREAM or span.gpu not in row_of:
            continue
        y = row_of[span.gpu]
        x0, x1 = span.start_s * 1e3, span.end_s * 1e3
        by_kind.setdefault(span.kind, []).append(
            [(x0, y - 0.4), (x1, y - 0.4), (x1, y + 0.4), (x0, y + 0.4)])
    for z, kind in enumerate(sorted(by_kind, key=_kind_key)):
        ax.add_collection(PolyCollection(by_kind[kind], facecolors=style.color(kind),
            edgecolors="white", linewidths=0.3, zorder=2 + z * 0.01))
    ax.set_ylim(len(gpus) - 0.5, -0.5)
    ax.set_yticks(range(len(gpus)))
    ax.set_yticklabels([f"rank {i}" for i in range(len(gpus))], fontsize=6)
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return set(by_kind)


def _kind_key(kind: str) -> tuple[int, str]:
    return (COMPUTE_KINDS.index(kind), kind) if kind in COMPUTE_KINDS else (99, kind)


def _bar_axes(ax: Axes, rows: Sequence[Mapping[str, Any]], ylabel: str) -> list[int]:
    xs = list(range(len(rows)))
    ax.set_xticks(xs)
    ax.set_xticklabels([str(r["schedule"]) for r in rows], rotation=35, ha="right", fontsize=7)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return xs


def _draw_step_bars(ax: Axes, rows: Sequence[Mapping[str, Any]]) -> None:
    xs = _bar_axes(ax, rows, "ms")
    steps = [r["step_time_s"] * 1e3 for r in rows]
    ax.bar(xs, steps, color=style.NEUTRAL, width=0.65, zorder=2)
    tops = list(steps)
    for x, r in zip(xs, rows, strict=True):
        isolated = r.get("isolated_step_s")
        if isolated is not None and abs(isolated - r["step_time_s"]) > 1e-12:
            ax.hlines(isolated * 1e3, x - 0.38, x + 0.38, color="black", linewidth=1.6, zorder=3)
            tops.append(isolated * 1e3)
    ax.set_title("step time (black: one isolated step)", fontsize=8, loc="left")
    ax.set_ylim(0, max(tops) * 1.12 if max(tops) > 0 else 1.0)


def _draw_memory_bars(ax: Axes, rows: Sequence[Mapping[str, Any]]) -> None:
    xs = _bar_axes(ax, rows, "GiB")
    peaks = [float(r["peak_activation_gib"]) for r in rows]
    ax.bar(xs, peaks, color=style.NEUTRAL, width=0.65, zorder=2)
    for x, r in zip(xs, rows, strict=True):
        per_rank = list(r.get("peak_activation_gib_per_rank", ()))
        ax.scatter([x] * len(per_rank), per_rank, s=6, color="black", zorder=3)
    ax.set_title("peak activation memory (dots: ranks)", fontsize=8, loc="left")
    ax.set_ylim(0, max(peaks) * 1.12 if max(peaks) > 0 else 1.0)
