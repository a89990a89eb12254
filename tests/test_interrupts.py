"""Ctrl-C that lands in a finaliser still stops the command (sim.cli.interrupts)."""

from __future__ import annotations

import signal
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

from sim.cli.interrupts import interrupts_not_swallowed


class _Held:
    pass


def _interrupting(_ref: object) -> None:
    raise KeyboardInterrupt  # what SIGINT's handler does if it fires inside the callback


def _spin() -> None:
    for _ in range(100_000):  # the interpreter checks for pending signals in loops
        pass


def test_an_interrupt_swallowed_by_a_weakref_callback_is_raised_again(capsys) -> None:
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt), interrupts_not_swallowed():
        held = _Held()
        ref = weakref.ref(held, _interrupting)
        del held  # the callback raises; the interpreter can only report it as unraisable
        _spin()
    assert ref() is None
    assert "Exception ignored" not in capsys.readouterr().err


def test_without_the_guard_the_interrupt_is_lost() -> None:
    """The failure the guard is for: the same callback, outside it, is printed and dropped
    (in a child, so that the test run's own unraisable hook is not involved)."""
    code = ("import weakref, sys\n"
            "sys.path[:0] = [{root!r}]\n"
            "from tests.test_interrupts import _Held, _interrupting, _spin\n"
            "{guard}\n"
            "with guard():\n"
            "    try:\n"
            "        held = _Held(); ref = weakref.ref(held, _interrupting); del held; _spin()\n"
            "        print('ran on')\n"
            "    except KeyboardInterrupt:\n"
            "        print('interrupted')\n")
    root = str(Path(__file__).resolve().parents[1])
    runs = {}
    for name, guard in (("bare", "from contextlib import nullcontext as guard"),
                        ("guarded", "from sim.cli.interrupts import interrupts_not_swallowed"
                                    " as guard")):
        done = subprocess.run([sys.executable, "-c", code.format(root=root, guard=guard)],
                              capture_output=True, text=True, timeout=60, cwd=root)
        runs[name] = (done.stdout.strip(), "Exception ignored" in done.stderr)
    assert runs == {"bare": ("ran on", True), "guarded": ("interrupted", False)}


def test_other_unraisable_errors_are_reported_as_before(capsys) -> None:
    def failing(_ref: object) -> None:
        raise ValueError("from a callback")

    seen = []
    previous = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        with interrupts_not_swallowed():
            held = _Held()
            ref = weakref.ref(held, failing)
            del held
        assert sys.unraisablehook == seen.append  # restored on the way out
    finally:
        sys.unraisablehook = previous
    assert ref() is None
    assert [type(u.exc_value) for u in seen] == [ValueError]
