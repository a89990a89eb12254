"""The result store: simulation results in SQLite, kept as they arrive."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from base.errors import ConfigError
from sim.search.evaluation import Evaluation


class ResultStore:
    """Simulation results in SQLite, keyed by (experiment fingerprint, layout key).

    Every :meth:`put` is its own transaction, so a sweep killed at any moment
    keeps every result it reported. ``path=None`` (or ``":memory:"``) keeps the
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

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = ":memory:" if path in (None, ":memory:") else str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = sqlite3.connect(self.path, timeout=30.0)
            if self.path != ":memory:":
                self._conn.execute("PRAGMA journal_mode=WAL")
                self._conn.execute("PRAGMA synchronous=NORMAL")
            with self._conn:
                self._conn.execute(self.SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"--db {self.path!r}: not a usable SQLite database: {exc}"
                              ) from None

    def load(self, experiment: str) -> dict[str, Evaluation]:
        """Every stored result of ``experiment``, by layout key."""
        rows = self._conn.execute(
            "SELECT layout, status, stats, error, elapsed_s FROM results WHERE experiment = ?",
            (experiment,))
        return {key: Evaluation(key, status, json.loads(stats) if stats else None, error, elapsed)
                for key, status, stats, error, elapsed in rows}

    def put(self, experiment: str, ev: Evaluation) -> None:
        """Store one result in its own transaction (replacing an older one)."""
        with self._conn:
            self._conn.execute(
                "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?)",
                (experiment, ev.key, ev.status,
                 None if ev.stats is None else json.dumps(ev.stats, sort_keys=True),
                 ev.error, ev.elapsed_s))

    def count(self, experiment: str | None = None) -> int:
        """Results stored (of ``experiment``, or of all)."""
        if experiment is None:
            return self._conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        return self._conn.execute("SELECT COUNT(*) FROM results WHERE experiment = ?",
                                  (experiment,)).fetchone()[0]

    def close(self) -> None:
        """Close the database connection."""
        self._conn.close()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
