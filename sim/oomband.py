"""How close to the capacity the out-of-memory verdict can tell (issue 19). Pure.

The verdict (``oom`` in ``sim run``'s stats, :func:`workloads.memory.oom`) is hard: a peak one
byte over the capacity is out of memory. The memory model behind it is not that exact: where
a source publishes a peak, the prediction misses it by several per cent. ``sim validate`` keeps
every hard verdict and count as it is (``false_oom``, ``oom_accuracy``) and reports, beside
them, which runs lie within the model's resolution of the capacity: a predicted peak within a
relative half-width ``b`` of the GPU's capacity, above or below, is ``uncertain``; beyond it,
``oom`` or ``fits``. The rule is data (``sim/data/oom_band.toml``): either a fixed half-width
with its source, or a measure taken on the corpus in the same run (today the memory model's
mean absolute error against the corpus's published peaks). docs/memory-gaps.md, "How close
to the capacity the verdict can tell", has the numbers.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.resources import files

MEASURES = ("corpus_peak_memory_mape",)
"""Measures a rule may name: ``corpus_peak_memory_mape``, the mean of |predicted / published
- 1| over every corpus run with a published peak (``peak_memory_gib``) that was simulated."""

VERDICTS = ("fits", "uncertain", "oom")


@dataclass(frozen=True)
class BandRule:
    """How the band's half-width is set: by a corpus :attr:`measure` or a fixed
    :attr:`half_width` (exactly one), and where it comes from."""

    measure: str | None
    half_width: float | None
    source: str


def load_rule(text: str) -> BandRule:
    """The rule of an ``oom_band.toml`` text (ValueError naming the bad key and value)."""
    table = tomllib.loads(text).get("band")
    if not isinstance(table, dict):
        raise ValueError("oom_band.toml: no [band] table")
    unknown = sorted(set(table) - {"measure", "measure_source", "half_width",
                                   "half_width_source"})
    if unknown:
        raise ValueError(f"oom_band.toml [band]: unknown key {unknown[0]!r} (measure, "
                         "measure_source, half_width, half_width_source)")
    measure, width = table.get("measure"), table.get("half_width")
    if (measure is None) == (width is None):
        raise ValueError("oom_band.toml [band]: give exactly one of measure and half_width")
    if measure is not None:
        if measure not in MEASURES:
            raise ValueError(f"oom_band.toml [band]: measure={measure!r} (one of "
                             f"{', '.join(MEASURES)})")
        key = "measure_source"
    else:
        if (isinstance(width, bool) or not isinstance(width, int | float)
                or not 0 <= width < 1 or math.isnan(width)):
            raise ValueError(f"oom_band.toml [band]: half_width={width!r} (a fraction in "
                             "[0, 1))")
        key = "half_width_source"
        width = float(width)
    source = table.get(key)
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"oom_band.toml [band]: no {key}")
    return BandRule(measure, width, source)


RULE = load_rule(files("sim").joinpath("data", "oom_band.toml").read_text(encoding="utf-8"))
"""The shipped rule (``sim/data/oom_band.toml``)."""


def peak_memory_mape(pairs: Iterable[tuple[float, float]]) -> tuple[float | None, int]:
    """(Mean of |predicted / published - 1|, how many) over (predicted, published) peak pairs;
    None without any."""
    errors = [abs(pred / pub - 1) for pred, pub in pairs]
    return (sum(errors) / len(errors) if errors else None), len(errors)


def half_width(rule: BandRule, published_peaks: Sequence[tuple[float, float]]
               ) -> tuple[float | None, int]:
    """The band's half-width under ``rule`` and how many published peaks measured it (0 for a
    fixed one): its ``half_width``, or the corpus measure over ``published_peaks`` (pairs
    (predicted, published) of the corpus runs simulated); None where the measure has no
    data (a corpus without published peaks)."""
    if rule.half_width is not None:
        return rule.half_width, 0
    return peak_memory_mape(published_peaks)


def margin(peak_gib: float, capacity_gib: float) -> float:
    """How far a predicted peak lies from the capacity, relative: peak / capacity - 1
    (positive: over)."""
    return peak_gib / capacity_gib - 1


def verdict(peak_gib: float | None, capacity_gib: float | None, band: float | None
            ) -> str | None:
    """``oom`` beyond the band above the capacity, ``fits`` beyond it below, ``uncertain``
    within it (its edges included); None without a peak, a capacity or a band."""
    if peak_gib is None or capacity_gib is None or band is None:
        return None
    m = margin(peak_gib, capacity_gib)
    return "oom" if m > band else "fits" if m < -band else "uncertain"


@dataclass(frozen=True)
class Run:
    """What the band needs of one simulated run: whether its source says it ran, the hard
    verdict, the predicted peak and the capacity, and whether it counts in ``false_oom``."""

    ran: bool
    oom: bool
    peak_gib: float
    capacity_gib: float | None
    counted: bool = True


def figures(runs: Sequence[Run], band: float | None) -> dict:
    """A source's band figures: ``runs_within_band`` (runs whose verdict is ``uncertain``),
    ``false_oom_within_band`` (of the runs counted in ``false_oom``, those within the band),
    ``false_oom_beyond_band`` (the rest of ``false_oom``: flagged although the capacity lies
    beyond the model's resolution), ``oom_accuracy_beyond_band`` (the hard verdict's accuracy
    over the runs beyond the band; None where there are none) and ``recorded_oom_within_band``
    (of the runs within the band, those the source records out of memory). All None without
    a band."""
    keys = ("runs_within_band", "false_oom_within_band", "false_oom_beyond_band",
            "oom_accuracy_beyond_band", "recorded_oom_within_band")
    if band is None:
        return dict.fromkeys(keys)
    kinds = [verdict(r.peak_gib, r.capacity_gib, band) for r in runs]
    within = [r for r, k in zip(runs, kinds, strict=True) if k == "uncertain"]
    beyond = [r for r, k in zip(runs, kinds, strict=True) if k in ("oom", "fits")]
    false = [(r, k) for r, k in zip(runs, kinds, strict=True) if r.ran and r.oom and r.counted]
    return {
        "runs_within_band": len(within),
        "false_oom_within_band": sum(k == "uncertain" for _, k in false),
        "false_oom_beyond_band": sum(k != "uncertain" for _, k in false),
        "oom_accuracy_beyond_band": (sum(r.oom == (not r.ran) for r in beyond) / len(beyond)
                                     if beyond else None),
        "recorded_oom_within_band": sum(not r.ran for r in within),
    }
