#!/usr/bin/env bash
# Download, here, the wheels a GPU machine without a package registry needs to run esg-prefect.
#
# The GPU machines lent to this project (see docs/gpu.md) hold Python 3.12 with torch, networkx,
# nvidia-ml-py, httpx, typer, rich, matplotlib and pytest, but not Prefect or SQLModel, and reach no
# registry. This puts Prefect (pinned to the version CI runs), FastAPI in the range pyproject.toml
# allows, SQLModel and all of their dependencies into .whl/ (about 40 MB) as wheels for that
# Python; scripts/gpu_session.sh installs them there into /tmp/site.
#
# Usage: bash scripts/gpu_wheels.sh [python-version, default 3.12] [dest, default .whl]
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER="${1:-3.12}"
DEST="${2:-.whl}"
ABI="cp${PYVER/./}"
grep -qxF "/$DEST/" .git/info/exclude 2>/dev/null || echo "/$DEST/" >> .git/info/exclude
rm -rf "$DEST"
python3 -m pip download -q --only-binary=:all: --python-version "$PYVER" --implementation cp --abi "$ABI" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any \
    -d "$DEST" "prefect==3.9.1" "fastapi>=0.139,<0.151" "sqlmodel>=0.0.16"
echo "$(ls "$DEST" | wc -l) wheels, $(du -sh "$DEST" | cut -f1), in $DEST for Python $PYVER"
