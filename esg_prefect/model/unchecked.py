"""Unchecked constructors for records built by code that already guarantees their checks.

The records of the model layer (jobs, stage, batch and idle records, decision
statistics) are frozen dataclasses whose ``__post_init__`` checks every value,
so that a runtime, a plug-in or a test that builds one wrong hears about it at
once. The simulator builds them by the hundred thousand from values it made
itself (a 60 s run of the standard case writes ~45,000 stage records and
~45,000 jobs); there the checks and the frozen ``__init__`` (one
``object.__setattr__`` call per field) were a fifth of the simulator's own
time. :func:`unchecked` gives such a caller a positional constructor that
stores the fields through the slots' own descriptors and skips
``__post_init__``: the object is the same frozen, hashable record, built in a
quarter of the time.

Only callers that build every value themselves may use it; anything that
crosses a trust boundary (user input, the network, a database) goes through
the checked constructor.

Example:
    >>> from esg_prefect.model.attribution import BatchItem
    >>> make_item = unchecked(BatchItem)
    >>> make_item("r1", "run1", 2.0) == BatchItem("r1", "run1", 2.0)
    True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, is_dataclass
from typing import Any, TypeVar

T = TypeVar("T")


def unchecked(cls: type[T]) -> Callable[..., T]:
    """A positional constructor of the frozen, slotted dataclass ``cls`` that skips its checks.

    The constructor takes every ``init`` field in declaration order (no
    defaults: a caller on a hot path passes them all) and does not run
    ``__post_init__``, so values the checks would normalise must already be
    in normal form.

    Raises:
        TypeError: when ``cls`` is not a dataclass with ``__slots__``, or has a
            field that is not set by ``__init__`` (its value would be missing).
    """
    if not is_dataclass(cls) or "__slots__" not in vars(cls):
        raise TypeError(f"unchecked() needs a slotted dataclass, got {cls!r}")
    names = []
    for f in fields(cls):
        if not f.init:
            raise TypeError(f"unchecked({cls.__name__}): field {f.name!r} is not set by __init__")
        names.append(f.name)
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    lines = [f"def make({', '.join(names)}):", "    obj = _new(_cls)"]
    for i, name in enumerate(names):
        namespace[f"_set{i}"] = getattr(cls, name).__set__  # the slot's member descriptor
        lines.append(f"    _set{i}(obj, {name})")
    lines.append("    return obj")
    exec("\n".join(lines), namespace)  # the source is built above from the class's own field names
    make: Callable[..., T] = namespace["make"]
    make.__qualname__ = make.__name__ = f"unchecked_{cls.__name__}"
    make.__doc__ = f"{cls.__name__}(...) without its checks (esg_prefect.model.unchecked)."
    return make
