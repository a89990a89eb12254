"""Device calibration as data: one TOML file per GPU generation, each number beside its source.

``ampere.toml`` holds the A100 fit (:mod:`sim.calibration`) and the A100's measured
fractions of peak; ``hopper.toml``, ``blackwell.toml``, ``cdna3.toml`` and ``turing.toml``
the published benchmarks that carry the fit over to their GPUs (:mod:`sim.gpu_profiles`).
A GPU's table is keyed by its preset name in :data:`topologies.hardware.GPUS` (``A100``:
both A100s).
Every number has a source: a ``source`` key in its table, or ``<key>_source`` beside it.
"""

from __future__ import annotations

import re
import tomllib
from functools import cache
from importlib.resources import files
from typing import Any

GENERATIONS = ("ampere", "hopper", "blackwell", "cdna3", "turing")
"""The data files: the A100's first, then the H100's, whose ratios cap the inferred ones of
the files after it (:data:`sim.gpu_profiles.INFERRED_RULE`)."""


def _text(generation: str) -> str:
    return files(__name__).joinpath(f"{generation}.toml").read_text(encoding="utf-8")


def load(generation: str) -> dict[str, Any]:
    """The tables of ``<generation>.toml``, by GPU, in file order."""
    return tomllib.loads(_text(generation))


_HEADER = re.compile(r"^\[\s*([A-Za-z0-9_-]+)", re.MULTILINE)
"""A table header's first key: a bare key (every GPU name here is one) at a line's start."""


@cache
def gpu_names(generation: str) -> tuple[str, ...]:
    """The GPUs of ``<generation>.toml`` (the keys of :func:`load`'s mapping, in file order),
    read off its table headers without parsing the file: an A100 run asks which generation
    its GPU is and whether it has ratios, not for the other generations' numbers (parsing
    their files was ~4 ms of every run). ``tests/test_gpu_profiles.py`` holds them to
    :func:`load` of every bundled file (a header-like line inside a multi-line string would
    break the scan)."""
    return tuple(dict.fromkeys(_HEADER.findall(_text(generation))))


@cache
def tables(generation: str) -> dict[str, Any]:
    """:func:`load` of ``generation``, parsed once per process and shared by the modules that
    read it (:mod:`sim.calibration`, :mod:`sim.gpu_profiles`: they parsed the same files two
    and three times, ~5 ms of each run): read it, never change it (:func:`load` gives a
    copy of one's own)."""
    return load(generation)


def gpu_tables() -> dict[str, dict[str, Any]]:
    """Every GPU's table, generation after generation (the shared tables of :func:`tables`:
    read only)."""
    return {gpu: table for generation in GENERATIONS for gpu, table in tables(generation).items()}


def fraction(matmul: dict[str, Any]) -> float:
    """A ``matmul`` table's achieved fraction of the peak it was measured against."""
    return matmul["achieved_tflops"] / matmul["peak_tflops"]
