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

    COLUMNS = ("experiment", "layout", "status", "stats", "error", "elapsed_s")
    """The columns of :data:`SCHEMA`, in order."""

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
            columns = [row[1] for row in self._conn.execute("PRAGMA table_info(results)")]
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"--db {self.path!r}: not a usable SQLite database: {exc}"
                              ) from None
        if columns != list(self.COLUMNS):
            raise ConfigError(f"--db {self.path!r}: its 'results' table has the columns "
                              f"{', '.join(columns)}, not those of sim search "
                              f"({', '.join(self.COLUMNS)}); use another file")

    def load(self, experiment: str) -> dict[str, Evaluation]:
        """Every stored result of ``experiment``, by layout key; ConfigError if the database
        is damaged or a row does not hold a result as :meth:`put` writes it."""
        try:
            rows = self._conn.execute(
                "SELECT layout, status, stats, error, elapsed_s FROM results "
                "WHERE experiment = ?", (experiment,)).fetchall()
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"--db {self.path!r}: cannot be read: {exc}") from None
        out = {}
        for key, status, stats, error, elapsed in rows:
            try:
                parsed = json.loads(stats) if stats else None
                if parsed is not None and not isinstance(parsed, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                raise ConfigError(f"--db {self.path!r}: the stored result of layout {key!r} "
                                  f"is damaged ({exc}); delete that row or use another file"
                                  ) from None
            out[key] = Evaluation(key, status, parsed, error, elapsed)
        return out

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
