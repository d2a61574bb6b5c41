#!/usr/bin/env bash
# Installs Debian's PostgreSQL server so that tests/test_store.py also runs the cost store on
# PostgreSQL (the tests start and stop a throwaway cluster of their own; no service is started here).
# Idempotent: does nothing when initdb and pg_ctl are already installed. Needs root (or sudo).
set -euo pipefail
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
    echo "PostgreSQL server binaries already installed: $(ls -d /usr/lib/postgresql/*/bin | tr '\n' ' ')"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq postgresql >/dev/null
# The package starts a system cluster on port 5432 where an init system runs; the tests do not use it.
ls -d /usr/lib/postgresql/*/bin
