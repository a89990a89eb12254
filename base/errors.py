"""The one exception hierarchy of the project.

Every error a user can cause derives from :class:`SimError`; the CLI turns any
of them into exit status 2 and a single ``error: ...`` line. Each subclass also
derives from the closest builtin so that callers may catch ``ValueError``.
"""

from __future__ import annotations


class SimError(Exception):
    """Base class of every error the simulator raises on purpose."""


class ConfigError(SimError, ValueError):
    """An experiment or cluster description is invalid; the message names key and value."""


class ScheduleError(SimError, ValueError):
    """A pipeline schedule is malformed or would deadlock."""


class TopologyError(SimError, ValueError):
    """A cluster graph is malformed, or two GPUs cannot reach each other."""


class DeadlockError(SimError, RuntimeError):
    """The engine stalled: some streams wait on events that can never fire."""
