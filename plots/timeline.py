"""Gantt chart of a :class:`~sim.timeline.Timeline`: one row per (GPU, stream).

Rows come GPU by GPU, each GPU's streams in the trace order of
:func:`sim.timeline.stream_sort_key` (compute first). Bars are coloured by span
kind (forward, backward, weight-grad, optimizer, each communication kind), idle
time is the empty background, and pipeline ops (``F``/``B``/``W``) carry their
canonical name (``1F3``) when the bar is wide enough for it. Time is in ms.

Rendering uses matplotlib's Agg canvas on a private :class:`~matplotlib.figure.Figure`
(no pyplot, so no global backend switch and no figure registry), one
:class:`~matplotlib.collections.PolyCollection` per kind, so 10k spans draw in
about a second. Output is deterministic: fixed ``svg.hashsalt``, no dates or
software versions in the file metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from sim.timeline import COMM_KINDS, COMPUTE_KINDS, COMPUTE_STREAM, Span, Timeline, stream_sort_key

__all__ = ["KIND_COLORS", "KIND_LABELS", "plot_timeline"]

KIND_COLORS: dict[str, str] = {
    "F": "#4c72b0",
    "B": "#55a868",
    "W": "#8172b3",
    "opt": "#937860",
    "tp": "#dd8452",
    "pp": "#da8bc3",
    "dp": "#c44e52",
    "cp": "#8c8c8c",
    "ep": "#ccb974",
}
"""Bar colour per span kind; other kinds get :data:`_OTHER_COLOR`."""

KIND_LABELS: dict[str, str] = {
    "F": "forward (F)",
    "B": "backward (B)",
    "W": "weight grad (W)",
    "opt": "optimizer",
    "tp": "TP comm",
    "pp": "PP send/recv",
    "dp": "DP comm",
    "cp": "CP comm",
    "ep": "EP comm",
}
"""Legend text per span kind."""

_OTHER_COLOR = "#64b5cd"
_LABELLED_KINDS = ("F", "B", "W")
_MAX_LABELS = 1500
_EDGE_MIN_PX = 4.0
_SAVE_OPTIONS: dict[str, dict[str, dict[str, None]]] = {
    "png": {"metadata": {"Software": None}},
    "svg": {"metadata": {"Date": None, "Creator": None}},
    "pdf": {"metadata": {"CreationDate": None, "ModDate": None, "Creator": None, "Producer": None}},
}
_RC = {"svg.hashsalt": "llm-cluster-sim", "svg.fonttype": "path", "pdf.compression": 6}
_FIG_WIDTH_IN = 12.0
_DPI = 110
_ROW_HEIGHT_IN = 0.28
_LABEL_FONT_PT = 6.0


def _gpu_label(timeline: Timeline, gpu: int) -> str:
    if gpu < len(timeline.gpu_names) and timeline.gpu_names[gpu]:
        return timeline.gpu_names[gpu]
    return f"GPU {gpu}"


def _rows(
    timeline: Timeline, gpus: Sequence[int] | None, max_rows: int
) -> tuple[list[tuple[int, str]], str]:
    """The (gpu, stream) rows to draw, and a note when rows were left out."""
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
    all_rows = [
        (gpu, stream)
        for gpu in chosen
        for stream in sorted(streams.get(gpu, ()), key=stream_sort_key)
    ]
    if len(all_rows) <= max_rows:
        return all_rows, ""
    shown_gpus = [g for g in chosen if streams.get(g)]
    rows: list[tuple[int, str]] = []
    for gpu in shown_gpus:
        mine = [row for row in all_rows if row[0] == gpu]
        if rows and len(rows) + len(mine) > max_rows:
            break
        rows.extend(mine[: max_rows - len(rows)])
    kept = len({gpu for gpu, _ in rows})
    note = f"showing {len(rows)} of {len(all_rows)} rows: first {kept} of {len(shown_gpus)} GPUs"
    return rows, note


def _kind_order(kinds: set[str]) -> list[str]:
    known = [k for k in (*COMPUTE_KINDS, *COMM_KINDS) if k in kinds]
    return known + sorted(kinds - set(known))


def plot_timeline(
    timeline: Timeline,
    path: str | Path,
    title: str = "",
    gpus: Sequence[int] | None = None,
    max_rows: int = 48,
) -> None:
    """Draw ``timeline`` as a Gantt chart and save it to ``path`` (PNG, SVG or PDF by suffix).

    ``gpus`` selects and orders the GPUs shown (default: every GPU with spans).
    When there are more (GPU, stream) rows than ``max_rows``, the first GPUs' rows
    are kept and the title says how many were shown. Same input, same bytes.
    Raises ``ValueError`` for an unknown suffix, ``max_rows < 1`` or unknown GPUs.
    """
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in _SAVE_OPTIONS:
        raise ValueError(
            f"cannot save a timeline plot as {path.name!r}: the suffix must be one of "
            f"{', '.join('.' + f for f in _SAVE_OPTIONS)}"
        )
    rows, note = _rows(timeline, gpus, max_rows)
    row_of = {row: n for n, row in enumerate(rows)}
    spans = [s for s in timeline.spans if (s.gpu, s.stream) in row_of]

    height = max(2.2, 1.4 + _ROW_HEIGHT_IN * max(len(rows), 1))
    with rc_context(_RC):
        fig = Figure(figsize=(_FIG_WIDTH_IN, height), dpi=_DPI)
        FigureCanvasAgg(fig)
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
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format=fmt, **_SAVE_OPTIONS[fmt])


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
            Patch(facecolor=KIND_COLORS.get(k, _OTHER_COLOR), label=KIND_LABELS.get(k, k))
            for k in kinds
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
                        facecolors=KIND_COLORS.get(kind, _OTHER_COLOR),
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
