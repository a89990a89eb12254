"""The result store: simulation results in SQLite, kept as they arrive, and the claims of
the searches that share it."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
import uuid
from pathlib import Path

from base.errors import ConfigError
from sim.search.evaluation import Evaluation


class ResultStore:
    """Simulation results in SQLite, keyed by (experiment fingerprint, layout key).

    Every :meth:`put` is its own transaction, so a sweep killed at any moment
    keeps every result it reported. Searches sharing one file claim a layout before
    simulating it (:meth:`claim`), so that two searches of the same experiment split
    the work instead of repeating it; a claim ends with its result, with
    :meth:`release`, or with its process. ``path=None`` (or ``":memory:"``) keeps the
    results in memory.
    """

    SCHEMA = """
        CREATE TABLE IF NOT EXISTS results (
            experiment TEXT NOT NULL,
            layout TEXT NOT NULL,
            status TEXT NOT NULL,
            stats TEXT,
            error TEXT NOT NULL DEFAULT '',
            elapsed_s REAL NOT NULL DEFAULT 0,
            PRIMARY KEY (experiment, layout)
        )"""

    COLUMNS = ("experiment", "layout", "status", "stats", "error", "elapsed_s")
    """The columns of :data:`SCHEMA`, in order."""

    CLAIMS = """
        CREATE TABLE IF NOT EXISTS claims (
            experiment TEXT NOT NULL,
            layout TEXT NOT NULL,
            host TEXT NOT NULL,
            pid INTEGER NOT NULL,
            owner TEXT NOT NULL,
            claimed_at REAL NOT NULL,
            PRIMARY KEY (experiment, layout)
        )"""
    """Layouts a search is simulating now: another search on the same file waits for
    their results instead of simulating them too (:meth:`claim`)."""

    CLAIM_TTL_S = 3600.0
    """How long a claim of a search on another host counts as live (its process cannot be
    checked from here); a claim of this host's counts as long as its process lives."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = ":memory:" if path in (None, ":memory:") else str(path)
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.owner = f"{self.host}:{self.pid}:{uuid.uuid4().hex}"
        """This store's claims' owner (one per open store, so two searches of one process
        are two owners)."""
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = sqlite3.connect(self.path, timeout=30.0)
            if self.path != ":memory:":
                self._conn.execute("PRAGMA journal_mode=WAL")
                self._conn.execute("PRAGMA synchronous=NORMAL")
            with self._conn:
                self._conn.execute(self.SCHEMA)
                self._conn.execute(self.CLAIMS)
            columns = [row[1] for row in self._conn.execute("PRAGMA table_info(results)")]
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"--db {self.path!r}: not a usable SQLite database: {exc}"
                              ) from None
        if columns != list(self.COLUMNS):
            raise ConfigError(f"--db {self.path!r}: its 'results' table has the columns "
                              f"{', '.join(columns)}, not those of sim search "
                              f"({', '.join(self.COLUMNS)}); use another file")

    def _row_result(self, key: str, status: str, stats: str | None, error: str,
                    elapsed: float) -> Evaluation:
        try:
            parsed = json.loads(stats) if stats else None
            if parsed is not None and not isinstance(parsed, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            raise ConfigError(f"--db {self.path!r}: the stored result of layout {key!r} "
                              f"is damaged ({exc}); delete that row or use another file"
                              ) from None
        return Evaluation(key, status, parsed, error, elapsed)

    def load(self, experiment: str) -> dict[str, Evaluation]:
        """Every stored result of ``experiment``, by layout key; ConfigError if the database
        is damaged or a row does not hold a result as :meth:`put` writes it."""
        try:
            rows = self._conn.execute(
                "SELECT layout, status, stats, error, elapsed_s FROM results "
                "WHERE experiment = ?", (experiment,)).fetchall()
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"--db {self.path!r}: cannot be read: {exc}") from None
        return {row[0]: self._row_result(*row) for row in rows}

    def claim(self, experiment: str, key: str) -> Evaluation | bool:
        """Before simulating layout ``key``: its stored result if another search stored it
        meanwhile; else True if this store now holds the claim on it (none was held, or
        the holder is gone), False if another live search holds it (wait for its result:
        ask again later). One transaction, so two searches never both get True."""
        try:
            with self._conn:
                self._conn.execute("BEGIN IMMEDIATE")
                row = self._conn.execute(
                    "SELECT layout, status, stats, error, elapsed_s FROM results "
                    "WHERE experiment = ? AND layout = ?", (experiment, key)).fetchone()
                if row is not None:
                    return self._row_result(*row)
                held = self._conn.execute(
                    "SELECT host, pid, owner, claimed_at FROM claims "
                    "WHERE experiment = ? AND layout = ?", (experiment, key)).fetchone()
                if held is not None and held[2] != self.owner and self._live(*held):
                    return False
                self._conn.execute("INSERT OR REPLACE INTO claims VALUES (?, ?, ?, ?, ?, ?)",
                                   (experiment, key, self.host, self.pid, self.owner,
                                    time.time()))
                return True
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"--db {self.path!r}: cannot be written: {exc}") from None

    def _live(self, host: str, pid: int, owner: str, claimed_at: float) -> bool:
        """Whether the search that made a claim may still deliver its result."""
        if host != self.host:
            return time.time() - claimed_at < self.CLAIM_TTL_S
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process of that id
            return True
        return True

    def release(self, experiment: str | None = None, key: str | None = None) -> None:
        """Drop this store's claim on layout ``key`` (a result it will not store), or with
        no key every claim it holds (a search that ends or stops)."""
        with self._conn:
            if key is None:
                self._conn.execute("DELETE FROM claims WHERE owner = ?", (self.owner,))
            else:
                self._conn.execute("DELETE FROM claims WHERE experiment = ? AND layout = ? "
                                   "AND owner = ?", (experiment, key, self.owner))

    def put(self, experiment: str, ev: Evaluation) -> None:
        """Store one result in its own transaction (replacing an older one), releasing the
        claim on its layout."""
        with self._conn:
            self._conn.execute(
                "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?)",
                (experiment, ev.key, ev.status,
                 None if ev.stats is None else json.dumps(ev.stats, sort_keys=True),
                 ev.error, ev.elapsed_s))
            self._conn.execute("DELETE FROM claims WHERE experiment = ? AND layout = ?",
                               (experiment, ev.key))

    def count(self, experiment: str | None = None) -> int:
        """Results stored (of ``experiment``, or of all)."""
        if experiment is None:
            return self._conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        return self._conn.execute("SELECT COUNT(*) FROM results WHERE experiment = ?",
                                  (experiment,)).fetchone()[0]

    def close(self) -> None:
        """Release this store's claims and close the database connection."""
        try:
            self.release()
        except sqlite3.Error:
            pass  # a damaged or vanished file: nothing left to release
        self._conn.close()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
