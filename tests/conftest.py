"""Shared fixtures: one Prefect test harness for the whole run (it takes seconds to start); store URLs; a toy pool."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.prefect_server import CLIENT_SETTINGS

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Cost records of test runs go to a throw-away store, never to the user's ~/.prefect one.
os.environ.setdefault("ESG_PREFECT_STORE_URL", f"sqlite:///{tempfile.mkdtemp(prefix='esg-test-store-')}/costs.db")
os.environ.setdefault("DO_NOT_TRACK", "1")
# Prefect clients that wait out a busy test server (see tests/prefect_server.py), for the harness's
# clients too. Set before Prefect is imported: it reads its settings then.
for _name, _value in CLIENT_SETTINGS.items():
    os.environ.setdefault(_name, _value)

# Prefect sets up its logging once, on first import, and its console handler keeps the stderr of
# that moment: imported first inside a capsys test (the profile CLI's), it would write to that
# test's capture, closed afterwards, and fail a later test's flow run. Imported here, it keeps the
# session's stderr.
import prefect.main  # noqa: E402, F401

if TYPE_CHECKING:
    from esg_prefect.runtime.pool import Pool


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """A temporary Prefect API for tests that run flows; started once per session (per xdist worker)."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.testing.utilities import prefect_test_harness

    try:
        # A ceiling on a condition (the server answers): it took over a minute on a loaded machine.
        with prefect_test_harness(server_startup_timeout=300):
            yield
    finally:
        # The harness stops its server only after draining Prefect's log and event workers; when the
        # drain fails (a loaded machine's timeouts), the server outlived the session as an orphan.
        for server in list(SubprocessASGIServer._instances.values()):
            with contextlib.suppress(Exception):
                server.stop()


# ---- a PostgreSQL server of our own, when its binaries are installed --------------------------

PG_SKIP = (
    "PostgreSQL server binaries (initdb, pg_ctl) not found: CI installs them with "
    "scripts/install_postgres.sh (apt-get install -y postgresql)"
)


def _pg_bin() -> Path | None:
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).resolve().parent
    for cand in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True):
        if (Path(cand) / "pg_ctl").exists() and (Path(cand) / "initdb").exists():
            return Path(cand)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def pg_server() -> Iterator[str]:
    """A PostgreSQL cluster in a temp folder on 127.0.0.1; yields the server URL without a database."""
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip(PG_SKIP)
    pytest.importorskip("psycopg", reason="the psycopg driver is missing: pip install 'psycopg[binary]>=3.1'")
    # initdb refuses to run as root: then run the server as the 'postgres' user the package created.
    user = "postgres" if os.geteuid() == 0 else None
    if user is not None:
        import pwd

        try:
            pwd.getpwnam(user)
        except KeyError:
            pytest.skip(f"running as root and there is no {user!r} user to run PostgreSQL as; {PG_SKIP}")
    data = Path(tempfile.mkdtemp(prefix="esg-pg-"))
    if user is not None:
        shutil.chown(data, user)
    port = _free_port()
    log = data / "server.log"

    def run(*args: str) -> None:
        proc = subprocess.run(args, user=user, capture_output=True, text=True, timeout=60, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({proc.returncode}): {proc.stderr or proc.stdout}")

    try:
        run(str(bindir / "initdb"), "-D", str(data / "db"), "-U", "esg", "--auth=trust", "-E", "UTF8", "--no-sync")
        opts = f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c fsync=off"
        run(str(bindir / "pg_ctl"), "-D", str(data / "db"), "-o", opts, "-l", str(log), "-w", "-t", "30", "start")
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        shutil.rmtree(data, ignore_errors=True)
        pytest.fail(f"could not start PostgreSQL from {bindir}: {exc}")
    try:
        import psycopg

        with psycopg.connect(f"postgresql://esg@127.0.0.1:{port}/postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE costs")
        yield f"postgresql+psycopg://esg@127.0.0.1:{port}/costs"
    finally:
        run(str(bindir / "pg_ctl"), "-D", str(data / "db"), "-m", "immediate", "-w", "stop")
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL of an empty store database: a SQLite file, or the PostgreSQL database emptied."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'costs.db'}"
    import psycopg

    url: str = request.getfixturevalue("pg_server")
    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql"), autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")  # faster than a database per test
        conn.execute("CREATE SCHEMA public")
    return url


@pytest.fixture
def pool() -> Iterator[Pool]:
    """A pool of the toy profile on the inline backend, one a test (:func:`tests.toy_calls.toy_pool`).

    A module that wants another scope, vCPU count or settings defines a ``pool`` of its own.
    """
    from tests.toy_calls import toy_pool  # here, not at the top: a conftest import lands in every test's process

    with toy_pool() as p:
        yield p
