"""The garbage-collector pause that lowering, the engine and the statistics share."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector (restored on exit, also on error).

    A large run allocates hundreds of thousands of long-lived objects
    (instructions, events, span records) and few reference cycles; the
    collector's repeated scans of them cost as much as the simulation itself.
    Used by the engine, the statistics and the idle-time breakdown.

    On exit the objects the pause left in the young generations move to the
    oldest one at once (``gc.freeze()`` then ``gc.unfreeze()``: two list
    splices), so the first collection after it does not scan them all; they
    stay collectable, in full collections. Skipped when something else keeps
    objects frozen, which unfreezing would release.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()
