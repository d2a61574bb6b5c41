#!/usr/bin/env bash
# Installs Debian's Chromium so that tests/test_ui_artifacts.py can open the Prefect UI headless
# (the test starts and stops the browser itself; it skips, saying why, where Chromium is missing).
# Idempotent: does nothing when chromium is already on PATH. Needs root (or sudo).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    echo "Chromium already installed: $(chromium --version 2>/dev/null || command -v chromium)"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# fonts-liberation: readable text in the test's screenshots.
$SUDO apt-get install -y -qq chromium fonts-liberation >/dev/null
chromium --version
