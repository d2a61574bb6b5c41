"""How a command shows and times its runs: the shared progress bar and wall clock.

``simulate``, ``compare`` and ``demo`` run under :func:`progress_bar`; the first two time runs with
:class:`WallClock`; the benches time theirs with it too. The simulator they
drive reads no clock: it is handed this one.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn

__all__ = ["WallClock", "progress_bar"]


class WallClock:
    """Monotonic wall clock in ms (a class, so it pickles into worker processes)."""

    def __call__(self) -> float:
        return time.perf_counter() * 1000.0


def progress_bar(console: Console, *extra: ProgressColumn, transient: bool = True) -> Progress:
    """The commands' progress bar; transient by default, so that an error raised under it is printed alone,
    and off where the output is not a terminal (a pipe or a log gets no bar, nor the blank line or the
    finished bar it leaves). ``demo`` keeps its finished bars (``transient=False``): they show each pass's time.
    ``extra`` columns follow the elapsed time (``profile``'s label of the point being measured)."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        *extra,
        console=console,
        transient=transient,
        disable=not console.is_terminal,
    )
