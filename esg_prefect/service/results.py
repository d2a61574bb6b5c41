"""Finished calls kept by id, so a client retrying (after a service restart too) gets the first outcome.

A call id whose outcome is stored is answered from here, never run again,
as long as the call is the same one (its digest: stage, path, workflow,
request, run and input; another call under that id is refused). SQLite
(standard library) keeps it simple and durable.

Retention, so that memory and disk stay bounded: an outcome is kept for
``ttl_s`` seconds after it was stored, and the stored bodies together are kept
under ``max_bytes``, oldest dropped first. A retry that comes after its
outcome was dropped runs the call again.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from esg_prefect.exceptions import InvalidInputError

DEFAULT_TTL_S = 3600.0
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
_EXPIRE_EVERY_S = 30.0


class ResultCache:
    """Outcomes by call id, in a SQLite file (``":memory:"`` for tests and for a service without one).

    Args:
        path: database file.
        ttl_s: how long outcomes are kept.
        max_bytes: most bytes of stored bodies kept; the oldest go first.
        clock: seconds since the epoch (injected by tests).
    """

    def __init__(
        self,
        path: str | Path = ":memory:",
        ttl_s: float = DEFAULT_TTL_S,
        max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not ttl_s > 0:
            raise InvalidInputError(f"results ttl_s must be > 0 seconds, got {ttl_s!r}")
        if not max_bytes > 0:
            raise InvalidInputError(f"results max_bytes must be > 0, got {max_bytes!r}")
        if str(path) != ":memory:" and not Path(path).exists():
            Path(path).touch(mode=0o600)  # stage outputs: the owner's alone (-wal and -shm get the same mode)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS outcomes (call_id TEXT PRIMARY KEY, body TEXT, at REAL)")
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(outcomes)")}
        if "digest" not in columns:  # a file written before digests were kept
            self._db.execute("ALTER TABLE outcomes ADD COLUMN digest TEXT NOT NULL DEFAULT ''")
        self._db.execute("CREATE INDEX IF NOT EXISTS outcomes_at ON outcomes (at)")
        self._lock = threading.Lock()  # guards the connection: the event loop and its threads share it
        self._ttl_s = ttl_s
        self._max_bytes = max_bytes
        self._clock = clock
        self._bytes = int(self._db.execute("SELECT COALESCE(SUM(LENGTH(body)), 0) FROM outcomes").fetchone()[0])
        self._expired_at = -float("inf")

    def get(self, call_id: str) -> tuple[dict[str, Any], str] | None:
        """The stored outcome of ``call_id`` and the digest of the call it answered, if kept."""
        with self._lock:
            row = self._db.execute(
                "SELECT body, digest FROM outcomes WHERE call_id = ? AND at >= ?",
                (call_id, self._clock() - self._ttl_s),
            ).fetchone()
        return None if row is None else (dict(json.loads(row[0])), str(row[1]))

    def put(self, call_id: str, body: dict[str, Any], digest: str = "") -> None:
        """Store an outcome (the first one wins), then drop what the retention no longer keeps."""
        text = json.dumps(body)
        now = self._clock()
        with self._lock:
            cur = self._db.execute("INSERT OR IGNORE INTO outcomes VALUES (?, ?, ?, ?)", (call_id, text, now, digest))
            self._bytes += len(text) if cur.rowcount else 0
            if now - self._expired_at >= _EXPIRE_EVERY_S:
                self._expire(now)
            while self._bytes > self._max_bytes:
                self._drop_oldest()

    def expire(self) -> int:
        """Delete outcomes older than the TTL; returns how many."""
        with self._lock:
            return self._expire(self._clock())

    def stored_bytes(self) -> int:
        """Bytes of stored bodies (what ``max_bytes`` bounds)."""
        with self._lock:
            return self._bytes

    def _expire(self, now: float) -> int:
        self._expired_at = now
        cutoff = now - self._ttl_s
        gone = self._db.execute("SELECT COALESCE(SUM(LENGTH(body)), 0) FROM outcomes WHERE at < ?", (cutoff,))
        self._bytes -= int(gone.fetchone()[0])
        return int(self._db.execute("DELETE FROM outcomes WHERE at < ?", (cutoff,)).rowcount)

    def _drop_oldest(self, n: int = 1) -> None:
        rows = self._db.execute("SELECT call_id, LENGTH(body) FROM outcomes ORDER BY at LIMIT ?", (n,)).fetchall()
        if not rows:
            self._bytes = 0
            return
        self._db.executemany("DELETE FROM outcomes WHERE call_id = ?", [(r[0],) for r in rows])
        self._bytes -= sum(int(r[1]) for r in rows)

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()
