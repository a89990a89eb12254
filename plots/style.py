"""One look for every figure: a colour and a legend label per concept, one figure style.

Concepts are what a reader compares across figures: the compute kinds of a
pipeline (``F``, ``B``, ``W``, ``opt``), each communication kind (``tp``,
``cp``, ``ep``, ``pp``, ``dp``; the timeline's bars and the idle breakdown's
"waiting for" causes are the same concept), the other idle causes (``bubble``,
``straggler``, ``failure``: greys, as they are not traffic) and the pipeline
schedules. Each has exactly one colour (:data:`COLORS`) and one legend label
(:data:`LABELS`), so blue means forward in every figure.

Every figure is a private :class:`~matplotlib.figure.Figure` on the Agg canvas
(:func:`new_figure`: no pyplot, so no global backend switch and no figure
registry) saved by :func:`save`: fixed ``svg.hashsalt``, no dates or software
versions in the metadata, so the same input gives the same bytes; and
``bbox_inches="tight"``, so tick labels, titles and legends placed outside the
axes are inside the saved image rather than clipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.legend import Legend

__all__ = [
    "COLORS",
    "DPI",
    "LABELS",
    "NEUTRAL",
    "OTHER",
    "REFERENCE",
    "SAVE_OPTIONS",
    "SERIES",
    "color",
    "figure",
    "image_format",
    "label",
    "legend_outside",
    "save",
    "series_color",
]

COLORS: dict[str, str] = {
    # compute kinds
    "F": "#4c72b0",
    "B": "#55a868",
    "W": "#8172b3",
    "opt": "#937860",
    "E": "#bcbd22",
    "G": "#9edae5",
    # communication kinds (bars of the timeline, idle causes of the breakdown)
    "tp": "#dd8452",
    "cp": "#64b5cd",
    "ep": "#ccb974",
    "pp": "#da8bc3",
    "dp": "#c44e52",
    # idle causes that are not traffic
    "bubble": "#c7c7c7",
    "straggler": "#6e6e6e",
    "failure": "#000000",
    # pipeline schedules (sim search's figure)
    "gpipe": "#7f7f7f",
    "1f1b": "#1f77b4",
    "interleaved": "#ff7f0e",
    "zb-h1": "#2ca02c",
    "zb-h2": "#d62728",
    "zb-v": "#9467bd",
    "dualpipe-v": "#8c564b",
    "seq1f1b": "#e377c2",
    "encoder-first": "#aec7e8",
    "optimus": "#ffbb78",
}
"""The one colour of each concept, in every figure."""

LABELS: dict[str, str] = {
    "F": "forward (F)",
    "B": "backward (B)",
    "W": "weight grad (W)",
    "opt": "optimizer",
    "E": "encoder forward (E)",
    "G": "encoder backward (G)",
    "tp": "TP comm",
    "cp": "CP comm",
    "ep": "EP comm",
    "pp": "PP send/recv",
    "dp": "DP comm",
    "bubble": "pipeline bubble",
    "straggler": "straggler",
    "failure": "failure",
}
"""The one legend label of each concept (schedules are labelled by their name)."""

OTHER = "#17becf"
"""Colour of a concept without its own (an unknown span kind or schedule)."""
NEUTRAL = "#aab4c0"
"""Bars that stand for no concept (e.g. step time per schedule)."""
REFERENCE = "#333333"
"""Reference lines and fronts: capacity, link bandwidth, Pareto front, diagonal."""
SERIES: tuple[str, ...] = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860",
                           "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd")
"""Colours of series that are not concepts (GPUs, algorithms, models), in order."""

DPI = 110
"""Resolution of every figure."""
SAVE_OPTIONS: dict[str, dict[str, dict[str, None]]] = {
    "png": {"metadata": {"Software": None}},
    "svg": {"metadata": {"Date": None, "Creator": None}},
    "pdf": {"metadata": {"CreationDate": None, "ModDate": None, "Creator": None,
                         "Producer": None}},
}
"""Metadata left out of saved files, per format, so that same input gives the same bytes."""
_RC = {"svg.hashsalt": "llm-cluster-sim", "svg.fonttype": "path", "pdf.compression": 6}
"""matplotlib settings for deterministic SVG and PDF output."""
_PAD_IN = 0.08


def color(concept: str) -> str:
    """The colour of ``concept`` (:data:`OTHER` for one without its own)."""
    return COLORS.get(concept, OTHER)


def label(concept: str) -> str:
    """The legend label of ``concept`` (the concept itself for one without its own)."""
    return LABELS.get(concept, concept)


def series_color(n: int) -> str:
    """The colour of the ``n``-th series that is not a concept."""
    return SERIES[n % len(SERIES)]


def image_format(path: Path, formats: tuple[str, ...] = tuple(SAVE_OPTIONS)) -> str:
    """``png``, ``svg`` or ``pdf`` (those in ``formats``) from ``path``'s suffix;
    ``ValueError`` for anything else."""
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in formats:
        raise ValueError(f"cannot save a plot as {path.name!r}: the suffix must be one of "
                         f"{', '.join('.' + f for f in formats)}")
    return fmt


@contextmanager
def figure(width_in: float, height_in: float) -> Iterator[Figure]:
    """A new Agg figure of the given size, drawn and saved under the deterministic rc
    settings (use as ``with figure(w, h) as fig: ...; save(fig, path)``)."""
    with rc_context(_RC):
        fig = Figure(figsize=(width_in, height_in), dpi=DPI)
        FigureCanvasAgg(fig)
        yield fig


def legend_outside(ax: Axes, **kwargs) -> Legend | None:
    """The legend of ``ax``'s labelled artists to the right of its axes, where it cannot
    cover data; ``None`` when nothing is labelled."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    options = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "fontsize": 7,
               "frameon": False, "borderaxespad": 0.0}
    return ax.legend(handles, labels, **(options | kwargs))


def save(fig: Figure, path: Path, fmt: str) -> None:
    """Save ``fig`` to ``path`` as ``fmt``: deterministic bytes, everything drawn inside
    the image (``bbox_inches="tight"``); parent directories are created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format=fmt, bbox_inches="tight", pad_inches=_PAD_IN,
                **SAVE_OPTIONS[fmt])
