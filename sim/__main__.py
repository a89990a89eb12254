"""``python -m sim`` is the ``sim`` command."""

from sim.cli import command

raise SystemExit(command())
