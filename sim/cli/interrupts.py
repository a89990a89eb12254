"""Ctrl-C that always stops a command.

Python raises :class:`KeyboardInterrupt` wherever the main thread happens to be when
SIGINT arrives. Where that is a weakref callback, a ``__del__`` or another finaliser, the
interpreter cannot propagate it: it prints "Exception ignored in: ..." and carries on, so
a search interrupted at that instant ran on to its end (a rare failure of
``tests/test_search.py::test_a_killed_sweep_resumes_without_redoing_or_losing_work``).
:func:`interrupts_not_swallowed` raises such an interrupt again in the code that runs
after the finaliser.

How: the finaliser's error reaches :data:`sys.unraisablehook`, which cannot raise it
itself (anything it raises is dropped too) nor signal it again (the SIGINT handler would
run at once, inside the hook). It installs a one-shot profile function instead, which
raises :class:`KeyboardInterrupt` at the next call or return outside the hook: an error a
profile function raises propagates into the profiled code, and the function is removed.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = ["interrupts_not_swallowed"]


class _Redeliver:
    """A :data:`sys.unraisablehook`: a :class:`KeyboardInterrupt` that could not propagate
    from the main thread is raised again after the hook returns, nothing printed; anything
    else goes to ``previous``."""

    def __init__(self, previous: Callable[[Any], object]) -> None:
        self.previous = previous

    def __call__(self, unraisable: Any) -> None:
        if (isinstance(unraisable.exc_value, KeyboardInterrupt)
                and threading.current_thread() is threading.main_thread()
                and sys.getprofile() is None):  # (a profiler running keeps the old way)
            sys.setprofile(_raise_interrupt)
            return
        self.previous(unraisable)


def _raise_interrupt(frame: FrameType, event: str, arg: object) -> None:
    """The one-shot profile function of :class:`_Redeliver`: silent for the hook's own
    frame (its call to :func:`sys.setprofile` returning, then the hook itself), then removed
    and :class:`KeyboardInterrupt` raised in whatever the main thread runs next."""
    if frame.f_code is _Redeliver.__call__.__code__:
        return
    sys.setprofile(None)
    raise KeyboardInterrupt


@contextmanager
def interrupts_not_swallowed() -> Iterator[None]:
    """Within the block, a Ctrl-C that lands in a finaliser is raised again in the code
    that runs after it, instead of being printed and dropped."""
    previous = sys.unraisablehook
    sys.unraisablehook = _Redeliver(previous)
    try:
        yield
    finally:
        sys.unraisablehook = previous
