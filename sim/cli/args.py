"""Argument types shared by the sub-commands: a bad value is one ``error:`` line that
names the option and the value (argparse adds the option's name)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

MAX_WORKERS = 256
"""More worker processes than this is a typo, not a machine (each costs ~60 MB)."""


def int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in ``[low, high]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"between {low} and {high}"
            raise argparse.ArgumentTypeError(f"{text!r}: must be an integer {bound}")
        return value

    parse.__name__ = "integer"
    return parse


worker_count = int_at_least(1, MAX_WORKERS)
"""``--workers``: 1 to :data:`MAX_WORKERS` processes."""
