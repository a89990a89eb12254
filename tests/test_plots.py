"""Tests of plots.timeline: the Gantt chart of a Timeline."""

from __future__ import annotations

from pathlib import Path

import pytest

from plots import plot_timeline
from plots.timeline import _rows
from sim.timeline import FlowArrow, MemorySample, Span, Timeline

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
    rows, note = _rows(tl, None, 5)
    assert rows == [(0, "compute"), (0, "tp"), (0, "dp"), (0, "send>1")]
    assert note == "showing 4 of 8 rows: first 1 of 2 GPUs"
    rows, note = _rows(tl, None, 2)
    assert rows == [(0, "compute"), (0, "tp")] and "2 of 8 rows" in note
    rows, _ = _rows(tl, [1], 48)
    assert {g for g, _ in rows} == {1}


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
