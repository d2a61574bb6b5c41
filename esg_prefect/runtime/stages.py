"""Stage definitions as the pool and its workers see them.

A stage is a batch function ``run(model, items) -> outputs`` (same length and
order as ``items``) plus a loader ``load(device) -> model`` called once per
worker (the cold start). Workers run in other processes, so a stage is named
by an import path ``"package.module:attribute"`` that resolves to the
:class:`StageSpec` (or to an object with an ``esg_stage`` attribute holding
one, such as the Prefect task made by :meth:`esg_prefect.Pipeline.stage`).
A script's ``__main__`` module is found as ``__mp_main__`` in spawned workers.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from esg_prefect.exceptions import ESGError, InvalidInputError, UnknownStageError

LoadFn = Callable[[str], Any]
BatchFn = Callable[[Any, list[Any]], Sequence[Any]]
SizeFn = Callable[[Any], float]


def input_size(item: Any) -> float:
    """A generic size of one stage input, the variable of the Cypress size model.

    Texts count words; 1-d tensors (token ids) count elements; a dict with
    ``hidden`` (encoder states) counts their rows; a dict with ``boxes``
    (detections) counts the boxes; ``objects`` (the caption's detections) is
    sized like its value; other tensors count elements; lists sum their items.
    Why these units: they are what the example stages' cost grows with (tokens
    through an encoder, crops through a classifier); a user's stage can give
    its own ``size_of``.
    """
    if isinstance(item, str):
        return float(len(item.split()))
    if isinstance(item, dict):
        if "hidden" in item:
            return input_size(item["hidden"]) if _ndim(item["hidden"]) == 1 else _count(item["hidden"])
        if "boxes" in item:
            return _count(item["boxes"])
        if "objects" in item:
            return input_size(item["objects"])
        return float(sum(input_size(v) for v in item.values()))
    if isinstance(item, (list, tuple)):
        return float(sum(input_size(v) for v in item))
    numel = getattr(item, "numel", None)
    if callable(numel):
        return float(numel())
    if isinstance(item, (int, float)):
        return 1.0
    return 1.0


def _count(x: Any) -> float:
    """Rows of ``x`` (its length), or its generic size when it has no length (a malformed input still sizes)."""
    try:
        return float(len(x))
    except TypeError:
        return input_size(x)


_MIN_SIZE = 1e-6  # a job's size is > 0 (an empty input still costs a call)


def _ndim(x: Any) -> int:
    return int(getattr(x, "ndim", 0))


@dataclass(frozen=True, slots=True)
class StageSpec:
    """One DNN stage: how to load its model and how to run a batch.

    Args:
        name: stage name, unique within its workflow; also the profile's stage name.
        load: ``load(device) -> model``, called once per worker; ``device`` is
            ``"cpu"`` or ``"cuda"`` (the worker sees only its own GPU).
        run: ``run(model, items) -> outputs``, one output per item, in order.
        import_path: ``"module:attribute"`` resolving to this spec (or to an
            object whose ``esg_stage`` is this spec), for worker processes.
        profile_name: name of the stage in the latency profile (defaults to ``name``).
        size_of: ``size_of(item) -> float``, the size of one input in the unit the
            profile's size model was fitted in (Cypress); :func:`input_size` when
            None, which is what the profiler measures with unless told otherwise.
    """

    name: str
    load: LoadFn
    run: BatchFn
    import_path: str
    profile_name: str = ""
    size_of: SizeFn | None = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise InvalidInputError(f"stage name must be a non-empty string, got {self.name!r}")
        if not callable(self.load) or not callable(self.run):
            raise InvalidInputError(f"stage {self.name!r}: load and run must be callables")
        if ":" not in self.import_path:
            raise InvalidInputError(
                f"stage {self.name!r}: import_path must look like 'module:attribute', got {self.import_path!r}"
            )
        if not self.profile_name:
            object.__setattr__(self, "profile_name", self.name)
        if self.size_of is not None and not callable(self.size_of):
            raise InvalidInputError(f"stage {self.name!r}: size_of must be a callable, got {self.size_of!r}")

    def size(self, item: Any) -> float:
        """The input size of one call (:attr:`size_of`, or :func:`input_size`); at least a tiny positive number.

        Raises:
            InvalidInputError: naming the stage when the size function returns
                something that is not a finite number >= 0.
        """
        value = (self.size_of or input_size)(item)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value < float("inf")):
            raise InvalidInputError(f"stage {self.name!r}: size_of returned {value!r}, not a finite number >= 0")
        return max(float(value), _MIN_SIZE)


def import_object(
    path: str, what: str, *, called: str = "", hint: Callable[[str, BaseException], str] | None = None
) -> Any:
    """Import ``"module:attribute"`` (the attribute may be dotted) and return the object it names.

    One import for the stages the workers load and the targets the profiler is given, so both
    say the same things: ``what`` (``stage``, ``target``) names the path in every message,
    ``called`` how a malformed path is referred to (``a <what>`` by default), and ``hint(module,
    exc)`` is appended when the module cannot be imported (where to run from, say).

    Raises:
        UnknownStageError: naming the path and what went wrong: a malformed path, a module that
            cannot be imported or whose own code refused something as it was imported, a missing attribute.
    """
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise UnknownStageError(f"{called or 'a ' + what} must look like 'module:attribute', got {path!r}")
    if module_name == "__main__" and "__mp_main__" in sys.modules:
        module_name = "__mp_main__"  # a spawned worker sees the parent's script under this name
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        more = hint(module_name, exc) if hint else ""
        raise UnknownStageError(f"cannot import module {module_name!r} of {what} {path!r}: {exc}{more}") from exc
    except ESGError as exc:  # the module's own code refused something as it was imported: say where
        raise UnknownStageError(f"importing module {module_name!r} of {what} {path!r} failed: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UnknownStageError(f"module {module_name!r} has no attribute {attr!r} ({what} {path!r})") from None
    return obj


def resolve_stage(import_path: str) -> StageSpec:
    """Import ``"module:attribute"`` and return the stage spec it names.

    Raises:
        UnknownStageError: naming the path and what went wrong.
    """
    obj = import_object(import_path, "stage", called="stage import path")
    spec = obj if isinstance(obj, StageSpec) else getattr(obj, "esg_stage", None)
    if not isinstance(spec, StageSpec):
        raise UnknownStageError(f"{import_path!r} is neither a StageSpec nor has an 'esg_stage' attribute")
    return spec


def run_checked(spec: StageSpec, model: Any, items: list[Any]) -> list[Any]:
    """Run a batch and check it returned one output per item.

    The outputs must be an ordered sequence: a list, a tuple, a generator, or a
    tensor or array whose first dimension is the batch. A dict, a string, a set
    or a scalar is refused, even at a batch of one, where iterating it would
    pass the count check by chance (a dict's keys, a one-character string) and
    hand the caller garbage that breaks only once batches grow.

    Raises:
        InvalidInputError: when the batch function returns something else, or the wrong number of outputs.
    """
    outputs = spec.run(model, items)
    if _not_a_batch(outputs):
        raise InvalidInputError(
            f"stage {spec.name!r}: batch function returned a {type(outputs).__name__}, not a sequence of outputs; "
            f"it must return one output per input, in order (a list, a tuple, or a tensor whose first dimension "
            f"is the batch: {len(items)} here)"
        )
    outputs = list(outputs)
    if len(outputs) != len(items):
        raise InvalidInputError(
            f"stage {spec.name!r}: batch function returned {len(outputs)} output{'' if len(outputs) == 1 else 's'} "
            f"for {len(items)} input{'' if len(items) == 1 else 's'}; it must return one output per input, in order"
        )
    return outputs


def _not_a_batch(outputs: Any) -> bool:
    """Whether a batch function's return value cannot be one output per input, in order."""
    if isinstance(outputs, (str, bytes, bytearray, Mapping, Set)):
        return True
    if getattr(outputs, "ndim", None) == 0:  # a 0-d tensor or array: one value, not a batch
        return True
    return not isinstance(outputs, Iterable)
