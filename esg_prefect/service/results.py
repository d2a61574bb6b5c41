"""Finished calls kept on disk, so a client retrying after a service restart gets the first outcome.

A call id whose outcome is stored is never run again: the stored encoded
result (or error) is returned. SQLite (standard library) keeps it simple and
durable; rows expire after ``ttl_s``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any


class ResultCache:
    """Outcomes by call id, in a SQLite file (``":memory:"`` for tests).

    Args:
        path: database file.
        ttl_s: how long outcomes are kept.
    """

    def __init__(self, path: str | Path = ":memory:", ttl_s: float = 3600.0) -> None:
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS outcomes (call_id TEXT PRIMARY KEY, body TEXT, at REAL)")
        self._lock = threading.Lock()  # guards the connection: the event loop and cleanup share it
        self._ttl_s = ttl_s

    def get(self, call_id: str) -> dict[str, Any] | None:
        """The stored outcome of ``call_id``, if any."""
        with self._lock:
            row = self._db.execute("SELECT body FROM outcomes WHERE call_id = ?", (call_id,)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def put(self, call_id: str, body: dict[str, Any]) -> None:
        """Store an outcome (the first one wins)."""
        text = json.dumps(body)
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO outcomes VALUES (?, ?, ?)", (call_id, text, time.time()))

    def expire(self) -> int:
        """Delete outcomes older than the TTL; returns how many."""
        with self._lock:
            cur = self._db.execute("DELETE FROM outcomes WHERE at < ?", (time.time() - self._ttl_s,))
        return cur.rowcount

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()
