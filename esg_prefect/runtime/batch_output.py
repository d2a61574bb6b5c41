"""What a batch function prints or logs, caught on the worker and handed back with the batch's results.

A stage's batch function runs in a worker (a process, a Ray actor or a pool
thread), away from the task runs it serves, so its ``print`` and ``logging``
output would otherwise land on the worker's console and in no task run's logs.
:func:`capture` catches, for the thread that runs the batch only, what is
written to ``sys.stdout``/``sys.stderr`` and the log records it makes (those
its logger's level lets through, as on a console; a handler's printing of them
is not caught twice); other threads' output passes through untouched, so an
inline pool's own logging is not taken. The same catch covers a worker's model
load, whose lines go with the first batch that waited for it. The caller side
(``integration.stage``) replays the lines on each task run the batch served:
prints through ``print`` (Prefect's ``log_prints`` decides, as for any task),
stderr to stderr, log records through the task run's logger at their level.

A batch keeps at most :data:`MAX_LINES` lines and :data:`MAX_CHARS`
characters; what is cut is counted in one last line. Lines travel as plain
``(level, logger, text)`` tuples, ``logger`` empty for a print, so they cross
the pool service as JSON.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

__all__ = [
    "MAX_CHARS",
    "MAX_LINES",
    "STDERR_LEVEL",
    "BatchLines",
    "Caught",
    "LogLine",
    "capture",
    "checked_lines",
    "loading",
    "run_caught",
    "with_output",
]

LogLine = tuple[int, str, str]
"""One line of a batch's output: (logging level, logger name or "" for a print, text)."""

MAX_LINES = 200
MAX_CHARS = 32_000
MAX_LINE_CHARS = 2_000
PRINT_LEVEL = logging.INFO
STDERR_LEVEL = logging.WARNING


class BatchLines:
    """The lines one batch produced, bounded (module docstring)."""

    def __init__(self) -> None:
        self.lines: list[LogLine] = []
        self.dropped = 0
        self._chars = 0
        self._partial: dict[int, str] = {}  # level -> text written without its newline yet

    def add(self, level: int, logger: str, text: str) -> None:
        """Keep one line, or count it as dropped past the bounds."""
        if len(text) > MAX_LINE_CHARS:
            text = text[:MAX_LINE_CHARS] + f"... ({len(text) - MAX_LINE_CHARS} characters cut)"
        if len(self.lines) >= MAX_LINES or self._chars + len(text) > MAX_CHARS:
            self.dropped += 1
            return
        self._chars += len(text)
        self.lines.append((level, logger, text))

    def write(self, level: int, data: str) -> None:
        """Text written to stdout (``PRINT_LEVEL``) or stderr: whole lines kept, a trailing part held."""
        text = self._partial.pop(level, "") + data
        *whole, rest = text.split("\n")
        for line in whole:
            self.add(level, "", line)
        if rest:
            self._partial[level] = rest

    def result(self) -> tuple[LogLine, ...]:
        """Every line kept, a held partial line flushed, and a last line counting those dropped."""
        for level, rest in sorted(self._partial.items()):
            self.add(level, "", rest)
        self._partial.clear()
        out = list(self.lines)
        if self.dropped:
            out.append((logging.WARNING, __name__, f"{self.dropped} more line(s) of this batch's output not kept"))
        return tuple(out)


_MESSAGE = logging.Formatter("%(message)s")
_active: dict[int, BatchLines] = {}  # thread id -> the capture running on it
_install_lock = threading.Lock()


class _Routed(io.TextIOBase):
    """A stream that sends a capturing thread's writes to its capture and every other thread's to ``inner``."""

    def __init__(self, inner: TextIO, level: int) -> None:
        self.inner = inner
        self.level = level

    def write(self, s: str) -> int:
        got = _active.get(threading.get_ident())
        if got is None:
            return self.inner.write(s)
        if _from_a_handler():  # a logging handler printing a record: caught as the record already
            return len(s)
        got.write(self.level, s)
        return len(s)

    def flush(self) -> None:
        if threading.get_ident() not in _active:
            with contextlib.suppress(Exception):
                self.inner.flush()

    def isatty(self) -> bool:
        return bool(getattr(self.inner, "isatty", lambda: False)())

    def fileno(self) -> int:
        return self.inner.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self.inner, "encoding", "utf-8"))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _from_a_handler(depth: int = 16) -> bool:
    """Whether the write under way comes from a logging handler's ``emit`` (any handler class: Prefect's too)."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return False
        if frame.f_code.co_name == "emit" and isinstance(frame.f_locals.get("self"), logging.Handler):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _install() -> None:
    """Route ``sys.stdout``/``sys.stderr`` and catch records: again where something undid it (pytest swaps streams)."""
    if (
        isinstance(sys.stdout, _Routed)
        and isinstance(sys.stderr, _Routed)
        and getattr(logging.getLogRecordFactory(), "_esg_marks", False)
    ):
        return
    with _install_lock:
        if not isinstance(sys.stdout, _Routed):
            sys.stdout = _Routed(sys.stdout, PRINT_LEVEL)
        if not isinstance(sys.stderr, _Routed):
            sys.stderr = _Routed(sys.stderr, STDERR_LEVEL)
        if not getattr(logging.getLogRecordFactory(), "_esg_marks", False):
            _catch_records(logging.getLogRecordFactory())


def _catch_records(inner: Callable[..., logging.LogRecord]) -> None:
    """Keep each record a capturing thread makes, and opt it out of Prefect's API log handler (``send_to_api``).

    Caught where records are made (the record factory), not by a handler: a
    logger makes a record only past its level, and a stage module's import may
    reconfigure logging (Prefect's does; ``dictConfig`` drops the root's
    handlers) while a load is being caught. The records are replayed on each
    task run the batch served; sent to the API from the worker, which has no
    run context, Prefect would only warn that no run is active.
    """

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = inner(*args, **kwargs)
        got = _active.get(threading.get_ident())
        if got is not None:
            record.send_to_api = False
            try:
                text = _MESSAGE.format(record)  # the message, and its traceback and stack when it has them
            except Exception:  # a bad format string: keep what was asked, as logging's own handlers would report
                text = f"{record.msg!r} % {record.args!r}"
            got.add(record.levelno, record.name, text)
        return record

    factory._esg_marks = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


@contextlib.contextmanager
def capture() -> Iterator[BatchLines]:
    """Catch this thread's prints and log records until the block ends (module docstring)."""
    _install()
    me = threading.get_ident()
    lines = BatchLines()
    outer = _active.get(me)
    _active[me] = lines
    try:
        yield lines
    finally:
        if outer is None:
            _active.pop(me, None)
        else:
            _active[me] = outer


@dataclass(frozen=True, slots=True)
class Caught:
    """What :func:`run_caught` got: the value, or the error it raised, and the lines."""

    value: Any
    error: Exception | None
    lines: tuple[LogLine, ...]

    @property
    def failed(self) -> tuple[str, str, str] | None:
        """The error as it travels from a worker, (type, message, traceback), or None; made from :attr:`error`."""
        exc = self.error
        if exc is None:
            return None
        return type(exc).__qualname__, str(exc), "".join(traceback.format_exception(exc))


def run_caught(fn: Callable[..., Any], *args: Any) -> Caught:
    """Call ``fn(*args)`` under :func:`capture`: its value or its error, never raised, with what it printed or logged.

    Every backend runs a batch and a model load this way, so that its worker
    lives on past the stage's own error and reports the lines either way.
    """
    with capture() as caught:
        try:
            value = fn(*args)
        except Exception as exc:  # the stage's own code: reported by the caller, the worker lives on
            return Caught(None, exc, caught.result())
    return Caught(value, None, caught.result())


def loading(lines: Sequence[LogLine]) -> tuple[LogLine, ...]:
    """Lines a worker's model load produced, marked so, for the first batch whose calls waited for it."""
    return tuple((level, name, f"(loading the model) {text}") for level, name, text in lines)


def checked_lines(raw: Any) -> tuple[LogLine, ...]:
    """Lines received from elsewhere (a worker, the pool service) as :data:`LogLine` tuples; malformed ones dropped.

    The service's answers are data, not code: only ints and strings pass, and
    no more lines than a batch may keep.
    """
    if not isinstance(raw, (list, tuple)):
        return ()
    out: list[LogLine] = []
    for item in raw[: MAX_LINES + 1]:
        if (
            isinstance(item, (list, tuple))
            and len(item) == 3
            and isinstance(item[0], int)
            and not isinstance(item[0], bool)
            and isinstance(item[1], str)
            and isinstance(item[2], str)
        ):
            out.append((item[0], item[1], item[2][: MAX_LINE_CHARS + 64]))
    return tuple(out)


def with_output(traceback_text: str, lines: Sequence[LogLine], what: str = "the batch") -> str:
    """A failed batch's (or model load's) traceback followed by what it printed or logged: the clue to its failure."""
    if not lines:
        return traceback_text
    shown = "\n".join(f"  {name + ': ' if name else ''}{text}" for _, name, text in lines)
    return f"{traceback_text.rstrip()}\nOutput of {what} before it failed:\n{shown}\n"
