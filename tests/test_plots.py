"""Tests of plots: the Gantt chart of a Timeline, and one style (colours, legends, labels)
for every figure."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from matplotlib.artist import Artist
from matplotlib.collections import Collection
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.transforms import Bbox

from plots import plot_timeline, style
from plots.collectives import plot_busbw
from plots.compare import plot_compare
from plots.idle import plot_idle
from plots.memory import plot_memory
from plots.pareto import plot_pareto
from plots.timeline import _rows
from plots.validation import plot_validation
from sim.timeline import IDLE_CAUSES, FlowArrow, MemorySample, Span, Timeline

MS = 1e-3


def small_timeline() -> Timeline:
    """Two pipeline stages, two micro-batches, with p2p, TP, DP and optimizer spans."""
    spans = [
        Span(0, "compute", "F", "0F0", 0.0, 1 * MS, 0, 0),
        Span(0, "compute", "F", "0F1", 1 * MS, 2 * MS, 0, 1),
        Span(0, "tp", "tp", "allreduce", 0.4 * MS, 0.5 * MS, 0, 0),
        Span(0, "send>1", "pp", "0F0", 1 * MS, 1.2 * MS, 0, 0),
        Span(1, "recv<0", "pp", "0F0", 1 * MS, 1.2 * MS, 1, 0),
        Span(1, "compute", "F", "1F0", 1.2 * MS, 2.2 * MS, 1, 0),
        Span(1, "compute", "B", "1B0", 2.2 * MS, 4.2 * MS, 1, 0),
        Span(1, "compute", "W", "1W0", 4.2 * MS, 5.0 * MS, 1, 0),
        Span(1, "tp", "tp", "allreduce", 1.6 * MS, 1.7 * MS, 1, 0),
        Span(0, "compute", "B", "0B0", 4.3 * MS, 6.3 * MS, 0, 0),
        Span(0, "dp", "dp", "allreduce", 6.3 * MS, 7.0 * MS),
        Span(0, "compute", "opt", "opt", 7.0 * MS, 7.5 * MS),
        Span(1, "compute", "opt", "opt", 7.0 * MS, 7.5 * MS),
        Span(1, "ep", "ep", "all2all", 2.0 * MS, 2.1 * MS),
    ]
    memory = (MemorySample(0, 0.0, 2**30), MemorySample(1, 0.0, 2**30))
    return Timeline(2, tuple(spans), (FlowArrow(3, 4),), memory, ("node0/gpu0", "node0/gpu1"))


def many_spans(num_gpus: int = 8, per_gpu: int = 1250) -> Timeline:
    """About 10k short spans spread over compute and comm streams."""
    spans = []
    for gpu in range(num_gpus):
        for n in range(per_gpu):
            t = n * 0.1 * MS
            if n % 2:
                spans.append(Span(gpu, "tp", "tp", "ar", t, t + 0.05 * MS))
            else:
                kind = "FB"[n // 2 % 2]
                spans.append(Span(gpu, "compute", kind, f"{gpu}{kind}{n}", t, t + 0.1 * MS))
    return Timeline(num_gpus, tuple(spans), (), ())


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_writes_non_empty_deterministic_file(tmp_path: Path, suffix: str) -> None:
    a, b = tmp_path / f"a{suffix}", tmp_path / "sub" / f"b{suffix}"
    plot_timeline(small_timeline(), a, title="small")
    plot_timeline(small_timeline(), b, title="small")
    data = a.read_bytes()
    assert len(data) > 1000
    assert data == b.read_bytes()
    if suffix == ".png":
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
    else:
        assert b"<svg" in data[:2000]
        assert b"1F0" in data or b"<path" in data  # labels are drawn as paths


def test_rows_compute_first_and_truncation() -> None:
    tl = small_timeline()
    rows, note = _rows(tl, None, 48)
    assert rows[0] == (0, "compute") and note == ""
    assert [s for g, s in rows if g == 1] == ["compute", "tp", "ep", "recv<0"]
    rows, note = _rows(tl, None, 5)  # minor streams go before GPUs
    assert rows == [(0, "compute"), (0, "tp"), (1, "compute"), (1, "tp")]
    assert note == "showing 4 of 8 rows: first 2 streams of each GPU"
    rows, note = _rows(tl, None, 2)
    assert rows == [(0, "compute"), (1, "compute")]
    assert note == "showing 2 of 8 rows: compute streams only"
    rows, note = _rows(tl, None, 1)
    assert rows == [(0, "compute")] and "GPUs 1 left out" in note
    rows, _ = _rows(tl, [1], 48)
    assert {g for g, _ in rows} == {1}


def pipeline(stages: int, stride: int = 8) -> Timeline:
    """One pipeline of ``stages`` GPUs (ranks 0, stride, 2*stride...), four streams each."""
    spans = []
    for k in range(stages):
        gpu = k * stride
        spans += [Span(gpu, "compute", "F", f"{k}F0", k * MS, (k + 1) * MS, k, 0),
                  Span(gpu, "tp", "tp", "ar", k * MS, (k + 0.1) * MS),
                  Span(gpu, "dp", "dp", "ar", k * MS, (k + 0.1) * MS)]
        if k + 1 < stages:
            spans.append(Span(gpu, f"send>{gpu + stride}", "pp", "f", (k + 1) * MS,
                              (k + 1.01) * MS))
    return Timeline(stages * stride, tuple(spans), (), ())


def test_rows_at_scale_keep_the_last_stage() -> None:
    """At scale the last pipeline stage (LM head, usually the bottleneck) stays drawn:
    minor streams go first, then GPUs from the middle, and the note names them."""
    tl = pipeline(8)
    stages = [8 * k for k in range(8)]
    rows, note = _rows(tl, stages, 24)
    assert {g for g, _ in rows} == set(stages)  # every GPU, fewer streams
    assert all(s in ("compute", "tp", "dp") for _, s in rows) and len(rows) == 24
    assert "first 3 streams" in note
    rows, note = _rows(tl, stages, 4)
    assert rows == [(0, "compute"), (8, "compute"), (48, "compute"), (56, "compute")]
    assert note == "showing 4 of 31 rows: compute streams only, GPUs 16, 24, 32, 40 left out"
    rows, note = _rows(pipeline(64, 1), None, 6)
    assert [g for g, _ in rows] == [0, 1, 2, 61, 62, 63]
    assert "GPUs 3, 4, ..., 60 left out" in note


def test_options_and_errors(tmp_path: Path) -> None:
    tl = small_timeline()
    plot_timeline(tl, tmp_path / "one.png", gpus=[1], max_rows=2)
    assert (tmp_path / "one.png").stat().st_size > 0
    with pytest.raises(ValueError, match="suffix"):
        plot_timeline(tl, tmp_path / "x.jpeg")
    with pytest.raises(ValueError, match="not ranks"):
        plot_timeline(tl, tmp_path / "x.png", gpus=[7])
    with pytest.raises(ValueError, match="max_rows"):
        plot_timeline(tl, tmp_path / "x.png", max_rows=0)


def test_empty_timeline(tmp_path: Path) -> None:
    plot_timeline(Timeline(2, (), (), ()), tmp_path / "empty.png", title="nothing")
    assert (tmp_path / "empty.png").stat().st_size > 0


def test_ten_thousand_spans(tmp_path: Path) -> None:
    tl = many_spans()
    assert len(tl.spans) == 10_000
    plot_timeline(tl, tmp_path / "big.png", title="10k spans")
    assert (tmp_path / "big.png").stat().st_size > 0


# --- one style for every figure (plots.style) ------------------------------------------


def _every_figure(tmp_path: Path) -> dict[str, Figure]:
    """Each figure the CLI writes, drawn from small inputs."""
    tl = small_timeline()
    compare_row = {"schedule": "1f1b", "step_time_s": 7.5 * MS, "bubble_fraction": 0.2,
                   "steady_period_s": 7.5 * MS, "isolated_step_s": 8.0 * MS,
                   "isolated_bubble_fraction": 0.25, "peak_activation_gib": 1.0,
                   "peak_activation_gib_per_rank": [1.0, 0.5]}
    idle = {"per_gpu_s": {str(g): {cause: (n + 1) * MS for n, cause in enumerate(IDLE_CAUSES)}
                          for g in range(2)}}
    search_rows = [{"status": status, "schedule": sched, "peak_memory_gib": 10.0 + n,
                    "tokens_per_s": 1000.0 - 10 * n, "key": f"k{n}", "tp": 1, "pp": 2, "dp": 1,
                    "micro_batch_size": 1, "zero_stage": 1, "recompute": "none"}
                   for n, (status, sched) in enumerate(
                       [("ok", "1f1b"), ("ok", "zb-h1"), ("oom", "gpipe"), ("ok", "custom")])]
    busbw = [{"algo": algo, "size_bytes": 2**k, "busbw_GBps": float(k * (i + 1))}
             for i, algo in enumerate(("ring", "tree")) for k in range(10, 20)]
    preds = [SimpleNamespace(row=SimpleNamespace(status="ok", model=m, step_time_s=t),
                             step_time_s=t * 1.05, oom=n % 3 == 0)
             for n, (m, t) in enumerate([("llama-13b", 20.0), ("llama-13b", 40.0),
                                         ("llama-30b", 60.0), ("llama-30b", 30.0)])]
    return {
        "timeline": plot_timeline(tl, tmp_path / "timeline.png", title="t"),
        "idle": plot_idle(idle, tmp_path / "idle.png"),
        "compare": plot_compare([compare_row], [tl], tmp_path / "compare.png"),
        "memory": plot_memory([("1f1b", tl)], tmp_path / "memory.png"),
        "pareto": plot_pareto(search_rows, tmp_path / "pareto.png", best_key="k0",
                              capacity_gib=12.5),
        "busbw": plot_busbw(busbw, tmp_path / "busbw.png", reference_GBps=9.0),
        "validation": plot_validation(preds, tmp_path / "validation.png"),
    }


def _legends(fig: Figure) -> list[Legend]:
    return [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]


def _handle_color(handle: Artist) -> str:
    if isinstance(handle, Line2D):
        return to_hex(handle.get_color())
    return to_hex(handle.get_facecolor()[0] if isinstance(handle, Collection)
                  else handle.get_facecolor())


def test_one_colour_per_concept_in_every_figure(tmp_path: Path) -> None:
    """Blue is forward everywhere: a concept's legend entry has its style colour in every
    figure (TP waiting in idle.png is TP's orange of the timeline), and no two concepts
    share a colour."""
    concept_of = {style.label(c): c for c in style.COLORS}
    seen: dict[str, set[str]] = {}
    for name, fig in _every_figure(tmp_path).items():
        for legend in _legends(fig):
            for handle, text in zip(legend.legend_handles, legend.get_texts(), strict=True):
                if text.get_text() in concept_of:
                    seen.setdefault(concept_of[text.get_text()], set()).add(
                        f"{name}:{_handle_color(handle)}")
    assert {"F", "B", "W", "opt", "tp", "pp", "dp", "ep", "bubble", "straggler", "failure",
            "1f1b", "zb-h1"} <= set(seen)
    for concept, where in seen.items():
        assert {w.split(":")[1] for w in where} == {style.color(concept)}, (concept, where)
    assert len(set(style.COLORS.values())) == len(style.COLORS)
    assert "tp" in {c for c, w in seen.items() if any(x.startswith("idle:") for x in w)}


def test_legends_never_cover_the_data(tmp_path: Path) -> None:
    """Every legend lies outside every axes' data area."""
    for name, fig in _every_figure(tmp_path).items():
        renderer = fig.canvas.get_renderer()
        legends = _legends(fig)
        assert legends, name
        for legend in legends:
            box = legend.get_window_extent(renderer)
            for ax in fig.axes:
                area = ax.get_window_extent(renderer)
                overlap = Bbox.intersection(box, area)
                assert overlap is None or overlap.width * overlap.height < 1.0, (name, box, area)


def test_labels_are_inside_the_saved_image(tmp_path: Path) -> None:
    """A long row label widens the saved image instead of being clipped at its edge."""
    tl = small_timeline()
    long = Timeline(2, tl.spans, tl.flows, tl.memory, ("x" * 120, "node0/gpu1"))
    plot_timeline(tl, tmp_path / "short.png")
    plot_timeline(long, tmp_path / "long.png")

    def width(path: Path) -> int:
        return int.from_bytes(path.read_bytes()[16:20], "big")

    assert width(tmp_path / "long.png") > width(tmp_path / "short.png") + 300


def test_idle_at_scale_keeps_the_last_gpus(tmp_path: Path) -> None:
    """Above 128 GPUs the bars of the first and the last GPUs are drawn, the others named."""
    breakdown = {"per_gpu_s": {str(g): {"bubble": MS, "tp": g * 1e-6} for g in range(1024)}}
    fig = plot_idle(breakdown, tmp_path / "idle.png")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[:2] == ["0", "4"] and labels[-2:] == ["1016", "1020"]
    assert "128 of 1024 GPUs: 64 to 959 left out" in ax.get_title()
