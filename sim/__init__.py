"""HOW it unfolds in time: engine, devices, network, collectives, stats, export, CLI.

Public API::

    from sim import load_experiment, simulate

Names are imported lazily, so that importing ``sim`` does not pull in the engine.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "load_experiment": "sim.api",
    "simulate": "sim.api",
    "Result": "sim.api",
    "Experiment": "sim.experiment",
    "SimError": "base.errors",
    "ConfigError": "base.errors",
    "ScheduleError": "base.errors",
    "TopologyError": "base.errors",
    "DeadlockError": "base.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'sim' has no attribute {name!r}")
