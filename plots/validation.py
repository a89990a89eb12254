"""Predicted against measured step time for the validation sweep.

Log-log axes with plain second ticks; one colour per model (:func:`plots.style.series_color`
in name order); the legend sits right of the axes, off the dots. Rendering follows
:mod:`plots.style`: same predictions, same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

from plots import style

__all__ = ["plot_validation"]


def plot_validation(preds: Sequence, path: str | Path, report: dict | None = None) -> Figure:
    """Scatter of predicted vs measured step time of successful runs; runs predicted to run
    out of memory are marked with an x; the diagonal and ±10% bands are drawn. PNG, SVG or
    PDF by suffix; returns the figure drawn."""
    path = Path(path)
    fmt = style.image_format(path)
    with style.figure(7.6, 5.6) as fig:
        ax = fig.add_subplot(1, 1, 1)
        _draw(ax, preds, report)
        fig.tight_layout()
        style.save(fig, path, fmt)
    return fig


def _draw(ax: Axes, preds: Sequence, report: dict | None) -> None:
    ok = [p for p in preds if p.row.status == "ok"]
    lo = min(min(p.row.step_time_s, p.step_time_s) for p in ok) * 0.8
    hi = max(max(p.row.step_time_s, p.step_time_s) for p in ok) * 1.2
    ax.plot([lo, hi], [lo, hi], color=style.REFERENCE, lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="0.9",
                    label="±10%")
    for n, model in enumerate(sorted({p.row.model for p in ok})):
        fits = [p for p in ok if p.row.model == model and not p.oom]
        ooms = [p for p in ok if p.row.model == model and p.oom]
        color = style.series_color(n)
        ax.scatter([p.row.step_time_s for p in fits], [p.step_time_s for p in fits], s=12,
                   color=color, label=model, alpha=0.8)
        if ooms:
            ax.scatter([p.row.step_time_s for p in ooms], [p.step_time_s for p in ooms], s=24,
                       marker="x", color=color, label=f"{model}, predicted OOM")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    for axis in (ax.xaxis, ax.yaxis):  # 20, 30, 50 s rather than 3 x 10^1
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 3.0, 5.0)))
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("simulated step time (s)")
    title = "Hagemann et al. 2023 sweep, A100-80GB"
    if report:
        title += (f"\nMAPE {report['step_time_mape'] * 100:.1f}%, "
                  f"OOM accuracy {report['oom_accuracy'] * 100:.1f}%")
    ax.set_title(title, fontsize=10)
    style.legend_outside(ax)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
