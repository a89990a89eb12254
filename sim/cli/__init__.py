"""The ``sim`` command: one module per sub-command, this one parses and dispatches.

The command line is the top layer (base <- topologies <- workloads <- sim <- plots
<- sim.cli): it composes simulation (:mod:`sim.api`) and figures (:mod:`plots`,
through :mod:`sim.cli.figures`). Invalid input of any kind exits with status 2 and
one line on stderr starting with ``error:`` that names the offending key and
value; never a traceback.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence
from importlib import metadata

from base.collector import gc_paused
from base.errors import SimError

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


def build_parser() -> argparse.ArgumentParser:
    """The ``sim`` parser with every sub-command registered."""
    parser = Parser(prog="sim", description="Discrete-event simulator for distributed LLM "
                    "training.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``sim`` with ``argv``; returns the exit status (2 for any invalid input)."""
    args = _parsed(argv)
    try:
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
    """The ``sim`` executable (``python -m sim``, the ``sim`` script): :func:`main` on this
    process's command line, then every object left is moved out of the collector's reach
    (``gc.freeze``) before the interpreter exits. Its exit-time collection would otherwise
    walk and free all of them one by one, a fifth of a large run's CPU time (0.36 s of
    Megatron 1T's 1.9 s), where the process's end returns the memory at once; outputs are
    complete (written, closed and renamed) before :func:`main` returns, and the standard
    streams are flushed at exit as before. Not in :func:`main`: a caller that goes on
    (the tests) keeps its collector."""
    code = main()
    gc.freeze()
    return code


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(command())
