"""The ``sim`` command: one module per sub-command, this one parses and dispatches.

The command line is the top layer (base <- topologies <- workloads <- sim <- plots
<- sim.cli): it composes simulation (:mod:`sim.api`) and figures (:mod:`plots`,
through :mod:`sim.cli.figures`). Invalid input of any kind exits with status 2 and
one line on stderr starting with ``error:`` that names the offending key and
value; never a traceback.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import sys
import threading
from collections.abc import Sequence
from importlib import metadata

from base.collector import gc_paused
from base.errors import SimError
from sim.cli.interrupts import interrupts_not_swallowed

# the simulator's modules, imported through the sub-commands', make many long-lived objects
# (config models, tables, classes) and little garbage: the collector's scans of them while
# they load were ~0.03-0.05 s of CPU of each `sim` command (Megatron 1T's `sim run`: 150
# collections, one of them full)
with gc_paused():
    from sim.cli import collective, compare, run, search, validate

COMMANDS = (run, compare, collective, search, validate)
"""The sub-command modules, in ``sim --help`` order; each has ``register(subparsers)``."""


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one ``error:`` line and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(2)


def _version() -> str:
    try:
        return metadata.version("llm-cluster-sim")
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return "(not installed)"


class _Version(argparse._VersionAction):
    """``--version``: the installed version, looked up only when asked for (the package
    metadata's search was ~3 ms of every command)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        self.version = f"%(prog)s {_version()}"
        super().__call__(parser, namespace, values, option_string)


def build_parser() -> argparse.ArgumentParser:
    """The ``sim`` parser with every sub-command registered."""
    parser = Parser(prog="sim", description="Discrete-event simulator for distributed LLM "
                    "training.")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.register(sub)
    parser.set_defaults(parsers=sub.choices)
    return parser


def _parsed(argv: Sequence[str] | None) -> argparse.Namespace:
    """``argv`` parsed; an option the sub-command does not take is reported with that
    sub-command's ``--help`` (``sim compare --fidelity``), not the top level's."""
    args, extras = build_parser().parse_known_args(argv)
    if extras:
        args.parsers[args.command].error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def main(argv: Sequence[str] | None = None, *, until_exit: bool = False) -> int:
    """Run ``sim`` with ``argv``; returns the exit status (2 for any invalid input).
    ``until_exit``: the process ends right after (:func:`command`), so a sub-command may
    leave its large objects to that end (``args.until_exit``) instead of freeing them
    one by one as it returns."""
    args = _parsed(argv)
    args.until_exit = until_exit
    try:
        with interrupts_not_swallowed():
            return args.func(args)
    except SimError as exc:
        message = str(exc).splitlines()
        sys.stderr.write(f"error: {' | '.join(line.strip() for line in message if line.strip())}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        return 130
    except BrokenPipeError:  # e.g. `sim run ... | head`: the reader left, nothing to report
        sys.stderr.close()
        return 0


def command() -> int:
    """The ``sim`` executable (``python -m sim``, the ``sim`` script): the allocator set to
    reuse freed memory (:func:`keep_freed_memory`), :func:`main` on this process's command
    line, then every object left is moved out of the collector's reach
    (``gc.freeze``) before the interpreter exits. Its exit-time collection would otherwise
    walk and free all of them one by one, a fifth of a large run's CPU time (0.36 s of
    Megatron 1T's 1.9 s), where the process's end returns the memory at once; outputs are
    complete (written, closed and renamed) before :func:`main` returns. The process then
    ends at once (:func:`exit_at_once`: the exit functions run and the standard streams
    are flushed, as before). Not in :func:`main`: a caller that goes on (the tests) keeps
    its collector."""
    keep_freed_memory()
    code = main(until_exit=True)
    gc.freeze()
    exit_at_once(code)
    return code


M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameters (``malloc.h``)."""
MMAP_THRESHOLD_BYTES = 8 << 20
"""Blocks up to this size come from the heap, not a mapping of their own. Fixed (glibc's
own rises with the largest block freed, up to 32 MiB): GPT-3 175B on 4,096 GPUs at full
fidelity peaked at 1,347 MiB with glibc's own, 1,400 with 32 MiB (more of its large
arrays held in the heap), 1,180 with 8 MiB."""
TRIM_THRESHOLD_BYTES = 128 << 20
"""Free memory at the heap's top that glibc keeps rather than returns to the system."""


def keep_freed_memory() -> bool:
    """Have the C library's allocator (glibc) reuse the memory a run frees instead of
    handing it back to the system and faulting fresh zeroed pages in for the next block:
    numpy's temporaries of a large run (Megatron 1T: 391,424 instructions, arrays of
    ~0.4-3 MB each pass) were each a mapping of their own, unmapped when freed, their
    pages faulted in anew every time (glibc raises its mapping threshold only as far as
    the largest block freed so far). Blocks up to :data:`MMAP_THRESHOLD_BYTES` now come
    from the heap and up to :data:`TRIM_THRESHOLD_BYTES` of free heap stays with the
    process. Only the ``sim`` executable (:func:`command`) sets it: process-wide, for
    the process's one command. False where the C library is not glibc (nothing set)."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
            return False
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, ImportError, OSError, TypeError, ValueError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
                & mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


def exit_at_once(code: int) -> None:
    """End the process with status ``code`` now, without the interpreter's teardown: the
    exit functions run (:mod:`atexit`) and the standard streams are flushed, as at any exit,
    but every module's objects are not then freed one by one (the process's end returns the
    memory at once): ~30 ms of Megatron 1T's ~1 s of CPU (its schedule's 131,072 ops and
    the cluster graph, kept in their caches). Returns instead, and the caller exits as
    usual, where something may still need the interpreter: another thread alive, a
    profiler or tracer that writes its results at the end (``python -m cProfile``,
    coverage, a debugger), ``python -i``, or a standard stream that does not flush (a
    closed pipe: the usual exit reports it, with status 120, as before)."""
    if (threading.active_count() > 1 or sys.getprofile() is not None
            or sys.gettrace() is not None or sys.flags.inspect):
        return
    atexit._run_exitfuncs()  # (what the exit runs first; they are not run again)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):  # a closed pipe or stream (or none)
        return
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(command())
