"""The figures ``sim run --out`` writes: the simulation's results handed to :mod:`plots`.

This is where simulation and plotting meet; :mod:`sim.api` never imports
:mod:`plots` and :mod:`plots` reads only timelines and stats.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from base.outputs import Outputs, output_dir, outputs

if TYPE_CHECKING:
    from sim.api import Result


def timeline_figure(result: Result, path: str | Path, gpus: list[int] | None = None) -> None:
    """Save the Gantt chart of ``result``'s timeline (PNG or SVG by suffix).

    By default it shows one pipeline: the GPU of TP rank 0, DP rank 0 of every
    pipeline stage (the other replicas run the same program).
    """
    from plots.timeline import plot_timeline  # matplotlib only when plotting

    exp = result.experiment
    pl = exp.placement
    if gpus is None:
        gpus = [pl.gpu(pp=r) for r in range(pl.degree("pp"))]
    replica = " (one pipeline: tp0 dp0)" if len(gpus) < pl.num_gpus else ""
    steps = f", {result.steps} steps back to back" if result.steps > 1 else ""
    title = (f"{exp.name}: {exp.schedule.name}, step {result.stats['step_time_s'] * 1e3:.1f} ms, "
             f"bubble {result.stats['bubble_fraction']:.1%}{replica}{steps}")
    plot_timeline(result.timeline, path, title=title, gpus=gpus)


def idle_figure(result: Result, path: str | Path) -> None:
    """Save the idle-time breakdown as stacked bars per GPU (``stats["idle_breakdown"]``)."""
    from plots.idle import plot_idle  # matplotlib only when plotting

    plot_idle(result.stats["idle_breakdown"], path,
              title=f"{result.experiment.name}: idle time by cause per GPU")


def write_figures(result: Result, out_dir: str | Path, files: Outputs | None = None
                  ) -> dict[str, Path]:
    """Write ``timeline.png`` and ``idle.png`` of ``result`` into ``out_dir`` (under
    temporary names added to ``files``, which the caller commits, if given)."""
    out = output_dir(out_dir)
    paths = {"timeline": out / "timeline.png", "idle": out / "idle.png"}
    with outputs() as own:
        mine = files or own
        timeline_figure(result, mine.temp(paths["timeline"]))
        idle_figure(result, mine.temp(paths["idle"]))
        if files is None:
            own.commit()
    return paths
