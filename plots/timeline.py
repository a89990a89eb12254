"""Gantt chart of a :class:`~sim.timeline.Timeline`: one row per (GPU, stream).

Rows come GPU by GPU, each GPU's streams in the trace order of
:func:`sim.timeline.stream_sort_key` (compute first). Bars are coloured by span
kind in the colours of :mod:`plots.style` (forward, backward, weight-grad,
optimizer, each communication kind), idle
time is the empty background, and pipeline ops (``F``/``B``/``W``) carry their
canonical name (``1F3``) when the bar is wide enough for it. Time is in ms.

Rendering draws one :class:`~matplotlib.collections.PolyCollection` per kind, so
10k spans draw in about a second, on a :func:`plots.style.figure` saved by
:func:`plots.style.save` (same input, same bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from plots import style
from sim.timeline import COMM_KINDS, COMPUTE_KINDS, COMPUTE_STREAM, Span, Timeline, stream_sort_key

__all__ = ["plot_timeline"]

_LABELLED_KINDS = ("F", "B", "W")
_MAX_LABELS = 1500
_EDGE_MIN_PX = 4.0
_FIG_WIDTH_IN = 12.0
_ROW_HEIGHT_IN = 0.28
_LABEL_FONT_PT = 6.0


def _gpu_label(timeline: Timeline, gpu: int) -> str:
    if gpu < len(timeline.gpu_names) and timeline.gpu_names[gpu]:
        return timeline.gpu_names[gpu]
    return f"GPU {gpu}"


def _rows(
    timeline: Timeline, gpus: Sequence[int] | None, max_rows: int
) -> tuple[list[tuple[int, str]], str]:
    """The (gpu, stream) rows to draw, and a note when rows were left out.

    When there are more rows than ``max_rows``, minor streams go first: every GPU
    keeps its first ``k`` streams (compute first, :func:`sim.timeline.stream_sort_key`)
    for the largest ``k`` that fits. Only when the compute streams alone do not fit are
    GPUs left out, from the middle: the first and the last ones are kept (in a
    pipeline, the first stage and the last one, with the LM head, which is usually
    the bottleneck), and the note names the GPUs left out.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows}")
    streams: dict[int, set[str]] = {}
    for span in timeline.spans:
        streams.setdefault(span.gpu, set()).add(span.stream)
    if gpus is None:
        chosen = sorted(streams)
    else:
        bad = [g for g in gpus if not (0 <= g < timeline.num_gpus or g in streams)]
        if bad:
            raise ValueError(
                f"gpus {bad} are not ranks of this timeline (num_gpus = {timeline.num_gpus})"
            )
        chosen = list(dict.fromkeys(gpus))
    ordered = {gpu: sorted(streams.get(gpu, ()), key=stream_sort_key) for gpu in chosen}
    all_rows = [(gpu, stream) for gpu in chosen for stream in ordered[gpu]]
    if len(all_rows) <= max_rows:
        return all_rows, ""
    shown = [g for g in chosen if ordered[g]]
    per_gpu = max((k for k in range(1, max(map(len, ordered.values())) + 1)
                   if sum(min(k, len(ordered[g])) for g in shown) <= max_rows), default=0)
    notes = []
    if per_gpu == 0:
        head = (max_rows + 1) // 2
        left_out = shown[head:len(shown) - (max_rows - head)]
        shown = shown[:head] + shown[len(shown) - (max_rows - head):]
        per_gpu = 1
        notes.append(f"GPUs {_ranks(left_out)} left out")
    rows = [(gpu, stream) for gpu in shown for stream in ordered[gpu][:per_gpu]]
    if any(len(ordered[g]) > per_gpu for g in shown):
        notes.insert(0, "compute streams only" if per_gpu == 1 else
                     f"first {per_gpu} streams of each GPU")
    return rows, f"showing {len(rows)} of {len(all_rows)} rows: {', '.join(notes)}"


def _ranks(gpus: Sequence[int]) -> str:
    """GPU ranks as a short list: runs of five or more with one stride as ``a, b, ..., z``."""
    parts: list[str] = []
    n = 0
    while n < len(gpus):
        stop = n + 1
        if n + 1 < len(gpus):
            stride = gpus[n + 1] - gpus[n]
            while stop < len(gpus) and gpus[stop] - gpus[stop - 1] == stride:
                stop += 1
        if stop - n >= 5:
            parts.append(f"{gpus[n]}, {gpus[n + 1]}, ..., {gpus[stop - 1]}")
            n = stop
        else:
            parts.append(str(gpus[n]))
            n += 1
    return ", ".join(parts)


def _kind_order(kinds: set[str]) -> list[str]:
    known = [k for k in (*COMPUTE_KINDS, *COMM_KINDS) if k in kinds]
    return known + sorted(kinds - set(known))


def plot_timeline(
    timeline: Timeline,
    path: str | Path,
    title: str = "",
    gpus: Sequence[int] | None = None,
    max_rows: int = 48,
) -> Figure:
    """Draw ``timeline`` as a Gantt chart and save it to ``path`` (PNG, SVG or PDF by suffix).

    ``gpus`` selects and orders the GPUs shown (default: every GPU with spans).
    When there are more (GPU, stream) rows than ``max_rows``, minor streams and
    then middle GPUs are left out (see :func:`_rows`) and the title says which.
    Same input, same bytes. Returns the figure drawn. Raises ``ValueError`` for an
    unknown suffix, ``max_rows < 1`` or unknown GPUs.
    """
    path = Path(path)
    fmt = style.image_format(path)
    rows, note = _rows(timeline, gpus, max_rows)
    row_of = {row: n for n, row in enumerate(rows)}
    spans = [s for s in timeline.spans if (s.gpu, s.stream) in row_of]

    height = max(2.2, 1.4 + _ROW_HEIGHT_IN * max(len(rows), 1))
    with style.figure(_FIG_WIDTH_IN, height) as fig:
        bottom_in, top_in = 0.9, 0.45
        ax = fig.add_axes((0.2, bottom_in / height, 0.78, (height - bottom_in - top_in) / height))
        end_ms = max((s.end_s for s in spans), default=0.0) * 1e3
        start_ms = min(0.0, min((s.start_s for s in spans), default=0.0) * 1e3)
        span_ms = (end_ms - start_ms) or 1.0
        ax.set_xlim(start_ms, start_ms + span_ms * 1.01)
        ax.set_ylim(len(rows) - 0.5 if rows else 0.5, -0.5)
        _draw_background(ax, rows)
        ax_width_px = fig.get_figwidth() * fig.dpi * ax.get_position().width
        px_per_ms = ax_width_px / (span_ms * 1.01)
        kinds = _draw_bars(ax, spans, row_of, px_per_ms)
        _draw_labels(ax, spans, row_of, px_per_ms, fig.dpi)
        _decorate(fig, ax, timeline, rows, kinds, title, note, empty=not spans)
        style.save(fig, path, fmt)
    return fig


def _decorate(
    fig: Figure,
    ax: Axes,
    timeline: Timeline,
    rows: list[tuple[int, str]],
    kinds: list[str],
    title: str,
    note: str,
    empty: bool,
) -> None:
    """Row labels, time axis, title (with the truncation note) and the kind legend."""
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{_gpu_label(timeline, g)} · {s}" for g, s in rows], fontsize=7)
    ax.set_xlabel("time (ms)")
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    full_title = f"{title} ({note})" if title and note else title or note
    if full_title:
        ax.set_title(full_title, fontsize=10, loc="left")
    if empty:
        ax.text(0.5, 0.5, "no spans", transform=ax.transAxes, ha="center", va="center")
    if kinds:
        handles = [
            Patch(facecolor=style.color(k), label=style.label(k)) for k in kinds
        ]
        fig.legend(
            handles=handles,
            loc="lower center",
            ncol=min(len(handles), 10),
            fontsize=7,
            frameon=False,
            bbox_to_anchor=(0.59, 0.0),
        )


def _draw_background(ax: Axes, rows: list[tuple[int, str]]) -> None:
    """Faint bands behind every other GPU's rows and thin lines between GPUs."""
    previous = None
    band = False
    for n, (gpu, _) in enumerate(rows):
        if gpu != previous:
            band = not band if previous is not None else False
            if previous is not None:
                ax.axhline(n - 0.5, color="#bbbbbb", linewidth=0.6, zorder=1)
            previous = gpu
        if band:
            ax.axhspan(n - 0.5, n + 0.5, color="#f3f3f3", linewidth=0, zorder=0)


_MIN_BAR_PX = 1.0
"""Narrowest bar drawn, in pixels: sub-pixel spans would vanish."""


def _draw_bars(
    ax: Axes, spans: list[Span], row_of: dict[tuple[int, str], int], px_per_ms: float
) -> list[str]:
    """Bars as PolyCollections per kind; returns the kinds drawn, in legend order.

    Bars at least :data:`_EDGE_MIN_PX` wide get a thin white outline so that
    back-to-back ops stay distinguishable; narrower ones get none, which would
    otherwise wash them out.
    """
    by_kind: dict[str, tuple[list[list[tuple[float, float]]], list[list[tuple[float, float]]]]]
    by_kind = {}
    for span in spans:
        y = row_of[(span.gpu, span.stream)]
        x0, x1 = span.start_s * 1e3, span.end_s * 1e3
        x1 = max(x1, x0 + _MIN_BAR_PX / px_per_ms)  # keep short transfers visible
        wide, narrow = by_kind.setdefault(span.kind, ([], []))
        target = wide if (x1 - x0) * px_per_ms >= _EDGE_MIN_PX else narrow
        target.append([(x0, y - 0.4), (x1, y - 0.4), (x1, y + 0.4), (x0, y + 0.4)])
    kinds = _kind_order(set(by_kind))
    for z, kind in enumerate(kinds):
        for verts, edge in zip(by_kind[kind], (0.3, 0.0), strict=True):
            if verts:
                ax.add_collection(
                    PolyCollection(
                        verts,
                        facecolors=style.color(kind),
                        edgecolors="white" if edge else "none",
                        linewidths=edge,
                        zorder=2 + z * 0.01,
                    )
                )
    return kinds


def _draw_labels(
    ax: Axes,
    spans: list[Span],
    row_of: dict[tuple[int, str], int],
    px_per_ms: float,
    dpi: float,
) -> None:
    """Write pipeline op names inside compute bars that are wide enough (at most _MAX_LABELS)."""
    char_px = _LABEL_FONT_PT * 0.62 * dpi / 72.0
    placed = 0
    for span in spans:
        if span.kind not in _LABELLED_KINDS or span.stream != COMPUTE_STREAM or not span.name:
            continue
        width_px = (span.end_s - span.start_s) * 1e3 * px_per_ms
        if width_px < char_px * len(span.name) + 2:
            continue
        if placed >= _MAX_LABELS:
            break
        placed += 1
        ax.text(
            (span.start_s + span.end_s) * 0.5e3,
            row_of[(span.gpu, span.stream)],
            span.name,
            ha="center",
            va="center",
            fontsize=_LABEL_FONT_PT,
            color="white",
            zorder=3,
            clip_on=True,
        )
