"""The OOM verdict's resolution band (sim.oomband, sim/data/oom_band.toml; issue 19)."""

from __future__ import annotations

import pytest

from sim import oomband
from sim.cli.validate import band_lines


def test_shipped_rule_measures_the_corpus():
    assert oomband.RULE.measure == "corpus_peak_memory_mape"
    assert oomband.RULE.half_width is None
    assert "peak_memory_gib" in oomband.RULE.source


@pytest.mark.parametrize(("text", "message"), [
    ("", "no [band] table"),
    ("[band]\nmeasure_source = 'x'\n", "exactly one of measure and half_width"),
    ("[band]\nmeasure = 'corpus_peak_memory_mape'\nhalf_width = 0.05\n",
     "exactly one of measure and half_width"),
    ("[band]\nmeasure = 'eyeballed'\nmeasure_source = 'x'\n", "measure='eyeballed'"),
    ("[band]\nhalf_width = 1.5\nhalf_width_source = 'x'\n", "half_width=1.5"),
    ("[band]\nhalf_width = true\nhalf_width_source = 'x'\n", "half_width=True"),
    ("[band]\nhalf_width = 0.05\n", "no half_width_source"),
    ("[band]\nmeasure = 'corpus_peak_memory_mape'\nmeasure_source = ' '\n",
     "no measure_source"),
    ("[band]\nhalf_width = 0.05\nhalf_width_source = 'x'\nmargin = 2\n", "unknown key 'margin'"),
])
def test_bad_rules_are_named(text, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        oomband.load_rule(text)


def test_fixed_half_width_ignores_the_corpus():
    rule = oomband.load_rule("[band]\nhalf_width = 0.05\nhalf_width_source = 'a paper'\n")
    assert oomband.half_width(rule, [(50.0, 100.0)]) == (0.05, 0)


def test_measured_half_width_is_the_mean_absolute_peak_error():
    # errors -10%, +5%, 0%: mean absolute 5%
    pairs = [(90.0, 100.0), (42.0, 40.0), (70.0, 70.0)]
    band, n = oomband.half_width(oomband.RULE, pairs)
    assert n == 3
    assert band == pytest.approx(0.05)
    assert oomband.half_width(oomband.RULE, []) == (None, 0)


@pytest.mark.parametrize(("peak", "verdict"), [
    (79.3 * 1.2, "oom"), (79.3 * 1.051, "oom"), (79.3 * 1.0499, "uncertain"), (81.1, "uncertain"),
    (79.3, "uncertain"), (79.3 * 0.9501, "uncertain"), (79.3 * 0.949, "fits"), (40.0, "fits")])
def test_verdict_against_the_band(peak, verdict):
    assert oomband.verdict(peak, 79.3, 0.05) == verdict


def test_no_verdict_without_a_band_or_capacity():
    assert oomband.verdict(90.0, 79.3, None) is None
    assert oomband.verdict(90.0, None, 0.05) is None
    assert oomband.margin(81.1, 79.3) == pytest.approx(81.1 / 79.3 - 1)


def _runs():
    cap = 80.0
    return [
        oomband.Run(True, True, 82.0, cap),              # ran, flagged, within (+2.5%)
        oomband.Run(True, True, 96.0, cap),              # ran, flagged, beyond (+20%)
        oomband.Run(True, True, 83.0, cap, counted=False),  # a contradicted twin: not counted
        oomband.Run(False, True, 81.0, cap),             # out of memory, flagged, within
        oomband.Run(False, False, 78.0, cap),            # out of memory, passed, within
        oomband.Run(True, False, 60.0, cap),             # ran, fits, beyond
        oomband.Run(False, True, 100.0, cap),            # out of memory, flagged, beyond
    ]


def test_figures_count_within_and_beyond():
    f = oomband.figures(_runs(), 0.05)
    assert f["runs_within_band"] == 4
    assert f["recorded_oom_within_band"] == 2
    assert f["false_oom_within_band"] == 1
    assert f["false_oom_beyond_band"] == 1
    # beyond: the 96 GiB run that ran (wrong), the 60 GiB one (right), the 100 GiB OOM (right)
    assert f["oom_accuracy_beyond_band"] == pytest.approx(2 / 3)


def test_figures_without_a_band_are_none():
    assert set(oomband.figures(_runs(), None).values()) == {None}


def test_a_wider_band_only_moves_runs_into_it():
    narrow, wide = oomband.figures(_runs(), 0.02), oomband.figures(_runs(), 0.25)
    assert narrow["runs_within_band"] < wide["runs_within_band"] == 7
    assert wide["false_oom_beyond_band"] == 0
    assert wide["oom_accuracy_beyond_band"] is None


def test_band_lines_name_each_source_with_false_oom():
    band = {"measure": "corpus_peak_memory_mape", "half_width": 0.0668, "published_peaks": 10}
    sources = [{"name": "a", "false_oom": 2, "false_oom_within_band": 2,
                "false_oom_beyond_band": 0},
               {"name": "b", "false_oom": 0, "false_oom_within_band": 0,
                "false_oom_beyond_band": 0}]
    text = "\n".join(band_lines(band, sources))
    assert "6.7% of the capacity (the memory model's error on 10 published peaks)" in text
    assert "a: of 2 false OOM, 2 within it, 0 beyond" in text
    assert "b:" not in text
    assert band_lines({"half_width": None}, sources) == []


def test_the_library_gives_every_source_its_band_figures_without_the_cli():
    """sim.validate.source_entries (what ``sim validate`` prints): the sweep's entry and each
    corpus source's carry the band's figures, each corpus row its margin and verdict, and
    ``oom_band`` the half-width measured on the published peaks."""
    from types import SimpleNamespace

    from sim.corpus import CorpusPrediction
    from sim.validate import Prediction, Row, source_entries

    def sweep_row(i: int, status: str) -> Row:
        return Row(i, "llama-13b", 2048, 64, 1, 1, 64, 1, "none", "flash2", False, False,
                   status, 10.0 if status == "ok" else None)

    preds = [Prediction(sweep_row(0, "ok"), 11.0, 81.0, True, (), 80.0),
             Prediction(sweep_row(1, "oom"), 9.0, 90.0, True, (), 80.0)]

    def corpus_row(run: str, published: float | None) -> SimpleNamespace:
        return SimpleNamespace(source="a", run=run, status="ok", step_time_s=2.0,
                               peak_memory_gib=published, disputed="", timed=True)

    cpreds = [CorpusPrediction(corpus_row("r1", 50.0), 2.2, 55.0, False, capacity_gib=60.0),
              CorpusPrediction(corpus_row("r2", None), 1.8, 70.0, True, capacity_gib=60.0)]
    source = SimpleNamespace(name="a", framework="f", gpu="H100",
                             rows=tuple(p.row for p in cpreds))
    entries, band = source_entries("sweep", preds, [source], cpreds, {})
    assert band["half_width"] == pytest.approx(0.1) and band["published_peaks"] == 1
    assert [e["name"] for e in entries] == ["sweep", "a"]
    assert entries[0]["false_oom_within_band"] == 1  # 81 of 80: within 10%
    assert entries[1]["false_oom_beyond_band"] == 1  # 70 of 60: beyond
    assert [r["oom_verdict"] for r in entries[1]["rows"]] == ["uncertain", "oom"]
    assert entries[1]["rows"][0]["memory_margin"] == pytest.approx(55 / 60 - 1)
    assert entries[0]["loso_mape"] is None and entries[1]["loso_scales"] is None
