"""A module whose import fails in a worker started with ``DIE_ON_IMPORT=1``, as a script that runs flows at
import fails in a spawned worker (anywhere else, pytest's collection included, it imports cleanly)."""

import os

if os.environ.get("DIE_ON_IMPORT") == "1":
    raise SystemExit("this module cannot be imported by a worker")
