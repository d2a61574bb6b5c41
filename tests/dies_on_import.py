"""A module whose import fails in a worker started with ``DIE_ON_IMPORT`` set, as a script that runs flows at
import fails in a spawned worker: ``1`` exits with an error, ``signal`` is killed by SIGTERM (as at the
interpreter's exit). Anywhere else, pytest's collection included, it imports cleanly."""

import os
import signal

if os.environ.get("DIE_ON_IMPORT") == "1":
    raise SystemExit("this module cannot be imported by a worker")
if os.environ.get("DIE_ON_IMPORT") == "signal":
    os.kill(os.getpid(), signal.SIGTERM)
