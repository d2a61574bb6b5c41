#!/usr/bin/env bash
# The README's test command: lint, type check, then the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
ruff check esg_prefect tests bench flows deployments blocks
mypy
python -m pytest -q -n 2 --dist loadgroup "$@"
