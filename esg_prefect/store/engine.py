"""Where the cost store lives: URL resolution and engines for SQLite and PostgreSQL.

SQLite is the default, at ``$PREFECT_HOME/esg_prefect/costs.db`` (beside
Prefect's own database; ``PREFECT_HOME`` defaults to ``~/.prefect``). The
environment variable ``ESG_PREFECT_STORE_URL``, or a URL given explicitly,
overrides it. PostgreSQL is used through the synchronous psycopg 3 driver:
the store writes from a pool's listener thread, where an async driver would
need an event loop of its own. ``postgresql://`` and ``postgres://`` URLs,
and Prefect-style ``postgresql+asyncpg://`` ones, are therefore read as
``postgresql+psycopg://``.

SQLite is set up for several processes writing one file (each flow process
with the embedded pool may write): WAL journal, a 30 s busy timeout, and
transactions begun by SQLAlchemy (``BEGIN``, or ``BEGIN IMMEDIATE`` for
writers) so that DDL in a migration rolls back with the rest of it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import StaticPool

from esg_prefect.exceptions import ConfigError

ENV_URL = "ESG_PREFECT_STORE_URL"
"""Environment variable naming the cost store's database URL (or a SQLite file path)."""

WRITE = "esg_write"
"""Execution option: a transaction that will write (SQLite then takes its write lock up front)."""

_PG_ALIASES = ("postgres", "postgresql", "postgresql+asyncpg")
_INSTALL_PG = "pip install 'psycopg[binary]>=3.1'"


def default_store_path() -> Path:
    """``$PREFECT_HOME/esg_prefect/costs.db``, with ``PREFECT_HOME`` defaulting to ``~/.prefect``."""
    home = os.environ.get("PREFECT_HOME") or "~/.prefect"
    return Path(home).expanduser() / "esg_prefect" / "costs.db"


def resolve_url(url: str | None = None) -> str:
    """The SQLAlchemy URL of the store: ``url``, else ``$ESG_PREFECT_STORE_URL``, else the default SQLite file.

    A value without ``://`` is a SQLite file path.

    Raises:
        ConfigError: for a database other than SQLite or PostgreSQL.

    Examples:
        >>> resolve_url("postgresql://esg@db:5432/costs")
        'postgresql+psycopg://esg@db:5432/costs'
        >>> resolve_url("/tmp/costs.db")
        'sqlite:////tmp/costs.db'
    """
    url = url or os.environ.get(ENV_URL) or None
    if url is None:
        return f"sqlite:///{default_store_path()}"
    if "://" not in url:
        return f"sqlite:///{Path(url).expanduser().resolve()}" if url != ":memory:" else "sqlite://"
    scheme, rest = url.split("://", 1)
    if scheme in _PG_ALIASES:
        return f"postgresql+psycopg://{rest}"
    if scheme == "sqlite+aiosqlite":
        return f"sqlite://{rest}"
    if scheme.split("+")[0] not in ("sqlite", "postgresql"):
        raise ConfigError(f"the cost store needs a sqlite:// or postgresql:// URL, got scheme {scheme!r}")
    return url


def safe_url(url: str) -> str:
    """The URL with its password masked, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):  # not a URL SQLAlchemy reads: mask what looks like user:password@
        return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL; None for an in-memory database or another dialect."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def create_engine(url: str, *, create: bool = True) -> Engine:
    """An engine for a resolved store URL (see :func:`resolve_url`).

    Args:
        url: SQLAlchemy URL, ``sqlite`` or ``postgresql+psycopg``.
        create: make the SQLite file's folder if missing; when False a missing file is an error.

    Raises:
        ConfigError: a missing SQLite file with ``create=False``, or no PostgreSQL driver.
    """
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is no number
        raise ConfigError(f"cost store URL {safe_url(url)!r} cannot be parsed: {exc}") from None
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(url, create)
    try:
        return sa_create_engine(url, pool_pre_ping=True)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"the cost store at {safe_url(url)} needs the PostgreSQL driver {exc.name!r}: {_INSTALL_PG}"
        ) from None


def _sqlite_engine(url: str, create: bool) -> Engine:
    path = sqlite_path(url)
    if path is None:
        # One shared connection, or every thread would see an empty database of its own.
        engine = sa_create_engine(url, connect_args={"check_same_thread": False}, poolclass=StaticPool)
    else:
        if not path.exists():
            if not create:
                raise ConfigError(f"no cost store at {path}: nothing was recorded there yet")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(mode=0o600)  # the owner's alone (SQLite gives its -wal and -shm files the same mode)
        engine = sa_create_engine(url, connect_args={"check_same_thread": False, "timeout": 30.0})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's BEGIN (below) open every transaction, DDL included:
        # sqlite3's own implicit transactions would commit an ALTER TABLE at once.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys=ON")
        if path is not None:
            cur.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # A writer takes the write lock at BEGIN: a deferred transaction that reads and then
        # writes can fail at once with "database is locked" instead of waiting for the lock.
        immediate = conn.get_execution_options().get(WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine
