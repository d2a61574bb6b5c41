"""Keep N CPU cores busy until killed: a loaded machine, to check that the tests do not depend on its speed.

Usage (docs/testing.md)::

    python scripts/cpu_hog.py 4 --lock /tmp/hog.lock & HOG=$!
    python -m pytest -q -n 2 --dist loadgroup
    kill $HOG

Each of the N processes spins on arithmetic. The hog stops on SIGTERM or SIGINT
(``kill``, Ctrl-C), after ``--max-seconds`` (a forgotten hog ends by itself), or
when its parent is gone; its processes also end if the hog itself is killed
with SIGKILL. ``--lock PATH`` creates a file while the hog runs and removes it
when the hog stops, for whoever measures timings on the same machine.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import signal
import sys
import time
from pathlib import Path


def _spin(parent: int) -> None:
    """Burn one core until the hog's main process is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group: the main process ends us
    x = 0
    while True:
        for _ in range(200_000):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        if os.getppid() != parent:  # the main process died (even of SIGKILL): stop
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("n", nargs="?", type=int, default=4, help="busy processes (default 4)")
    parser.add_argument("--max-seconds", type=float, default=3600.0, help="stop by itself after this long")
    parser.add_argument("--lock", type=Path, default=None, help="a file that exists while the hog runs")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("n must be at least 1")

    stopping = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    if args.lock is not None:
        args.lock.write_text(f"{os.getpid()}\n")
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_spin, args=(os.getpid(),), daemon=True) for _ in range(args.n)]
    try:
        for p in procs:
            p.start()
        print(f"cpu_hog: {args.n} busy processes (pid {os.getpid()})", file=sys.stderr, flush=True)
        give_up = time.monotonic() + args.max_seconds
        while not stopping and time.monotonic() < give_up:
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.pid is not None:
                p.kill()
        for p in procs:
            if p.pid is not None:
                p.join(5)
        if args.lock is not None:
            with contextlib.suppress(FileNotFoundError):
                args.lock.unlink()
        print("cpu_hog: stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
