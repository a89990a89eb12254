"""Predicted against measured step time for the validation sweep."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

_COLORS = {"llama-13b": "#4C72B0", "llama-30b": "#55A868", "llama-65b": "#C44E52"}


def plot_validation(preds: Sequence, path: str | Path, report: dict | None = None) -> None:
    """Scatter of predicted vs measured step time of successful runs; runs predicted to run
    out of memory are marked with an x; the diagonal and ±10% bands are drawn."""
    fig = Figure(figsize=(6.4, 5.6), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ok = [p for p in preds if p.row.status == "ok"]
    lo = min(min(p.row.step_time_s, p.step_time_s) for p in ok) * 0.8
    hi = max(max(p.row.step_time_s, p.step_time_s) for p in ok) * 1.2
    ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="0.9",
                    label="±10%")
    for model in sorted({p.row.model for p in ok}):
        fits = [p for p in ok if p.row.model == model and not p.oom]
        ooms = [p for p in ok if p.row.model == model and p.oom]
        color = _COLORS.get(model, "0.4")
        ax.scatter([p.row.step_time_s for p in fits], [p.step_time_s for p in fits], s=12,
                   color=color, label=model, alpha=0.8)
        if ooms:
            ax.scatter([p.row.step_time_s for p in ooms], [p.step_time_s for p in ooms], s=24,
                       marker="x", color=color, label=f"{model}, predicted OOM")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("simulated step time (s)")
    title = "Hagemann et al. 2023 sweep, A100-80GB"
    if report:
        title += (f"\nMAPE {report['step_time_mape'] * 100:.1f}%, "
                  f"OOM accuracy {report['oom_accuracy'] * 100:.1f}%")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Software": None})
