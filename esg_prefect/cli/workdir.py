"""The working directory on the import path: shared by the commands that import user modules.

``esg-prefect profile`` imports its targets and ``esg-prefect pool serve`` its
stages from the user's own modules, in this process and in worker processes.
Both call :func:`import_from_cwd` before anything is imported or forked, so a
console script finds what ``python -m`` would; it lives here, not in either
command, so that neither command imports the other.
"""

from __future__ import annotations

import os
import sys

__all__ = ["import_from_cwd"]


def import_from_cwd() -> str | None:
    """Let this process and its children import modules from the working directory, as ``uvicorn module:app`` does.

    Why: ``python -m`` puts the working directory on ``sys.path``, a console script does not, so
    ``esg-prefect profile -t mypipe:embed@mypipe:images`` run beside ``mypipe.py`` would not find it.
    The directory goes first on ``sys.path`` (what multiprocessing hands to spawned and fork-server
    children) and on ``PYTHONPATH`` (what any other child interpreter reads). Returns the directory
    added, or None when ``sys.path`` had it already (then nothing changes).
    """
    cwd = os.getcwd()
    if any(os.path.abspath(p or os.curdir) == cwd for p in sys.path):
        return None
    sys.path.insert(0, cwd)
    rest = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = cwd + (os.pathsep + rest if rest else "")
    return cwd
