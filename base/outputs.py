"""Output files that are either the previous complete ones or the new complete ones.

A command checks where it will write before it simulates anything
(:func:`output_dir`, :func:`output_file`), so a bad ``--out`` is one ``error:``
line, not a traceback after minutes of work. It then writes each file under a
temporary name beside its final one and renames them all into place at the end
(:class:`Outputs`): a run killed at any moment leaves no truncated file, and
the file that says a run is complete (``stats.json``) is renamed last.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from base.errors import ConfigError


def check_output_dir(path: str | Path, option: str = "--out") -> Path:
    """Check, creating nothing, that ``path`` is or can become a writable directory;
    ConfigError naming ``option`` if it is a file, lies below a file, or cannot be written."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{option}={str(path)!r}: is an existing file, not a directory")
    existing = p
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise ConfigError(f"{option}={str(path)!r}: cannot create the directory ("
                          f"{str(existing)!r} is a file)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{option}={str(path)!r}: directory {str(existing)!r} is not writable")
    return p


def output_dir(path: str | Path, option: str = "--out") -> Path:
    """Create (if needed) and return the directory ``path``; ConfigError naming ``option``
    if it is a file, cannot be created, or cannot be written."""
    p = check_output_dir(path, option)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{option}={str(path)!r}: cannot create the directory "
                          f"({exc.strerror or exc})") from None
    return p


def output_file(path: str | Path, option: str, suffixes: Sequence[str] = ()) -> Path:
    """Check that the file ``path`` can be written (its directory exists and is writable,
    it is not a directory, its suffix is one of ``suffixes`` if given); ConfigError
    naming ``option`` otherwise. Nothing is created."""
    p = Path(path)
    if suffixes and p.suffix.lower() not in suffixes:
        raise ConfigError(f"{option}={str(path)!r}: the file name must end in "
                          f"{' or '.join(suffixes)}")
    if p.is_dir():
        raise ConfigError(f"{option}={str(path)!r}: is a directory, not a file")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"{option}={str(path)!r}: directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{option}={str(path)!r}: directory {str(parent)!r} is not writable")
    return p


class Outputs:
    """Files written under temporary names, renamed into place by :meth:`commit`.

    ``temp(path)`` gives the name to write ``path`` under: hidden, in the same
    directory (so the rename is atomic), with the same suffix (plotting picks
    the format by suffix). :meth:`commit` renames in the order the files were
    asked for, except those named in ``last``, which go after all others.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[Path, Path]] = []
        self._stale: list[Path] = []

    def temp(self, path: str | Path) -> Path:
        """The temporary name to write ``path`` under."""
        final = Path(path)
        tmp = final.with_name(f".{final.stem}.partial-{os.getpid()}{final.suffix}")
        self._pending.append((tmp, final))
        return tmp

    def remove(self, path: str | Path) -> None:
        """Delete ``path`` (if it exists) on :meth:`commit`, before the files in ``last``
        arrive: an older output that must not lie beside the new ones."""
        self._stale.append(Path(path))

    def commit(self, last: Sequence[str] = ("stats.json",)) -> list[Path]:
        """Rename every temporary file to its final name; returns the final paths."""
        order = sorted(self._pending, key=lambda pair: pair[1].name in last)
        for tmp, final in order:
            if final.name in last:
                for stale in self._stale:
                    stale.unlink(missing_ok=True)
                self._stale = []
            os.replace(tmp, final)
        for stale in self._stale:
            stale.unlink(missing_ok=True)
        self._pending, self._stale = [], []
        return [final for _, final in order]

    def discard(self) -> None:
        """Remove the temporary files written so far (after an error)."""
        for tmp, _ in self._pending:
            tmp.unlink(missing_ok=True)
        self._pending = []


@contextmanager
def outputs() -> Iterator[Outputs]:
    """An :class:`Outputs` whose temporary files are removed if the block fails; the
    caller commits when everything is written."""
    out = Outputs()
    try:
        yield out
    except BaseException:
        out.discard()
        raise
