"""A safe wire encoding for stage inputs and outputs: JSON, with tensors as raw buffers.

Nothing received over the network is ever unpickled. Values are JSON
primitives, lists, tuples, string-keyed dicts, and tensors or numpy arrays,
which travel as ``{"__esg__": "tensor", "dtype": ..., "shape": ..., "data": base64}``
with their raw little-endian bytes. Anything else is refused with an error
naming its type, before it is sent.

Example:
    >>> import torch
    >>> x = {"boxes": torch.arange(6, dtype=torch.float32).reshape(2, 3), "n": 2}
    >>> y = decode(encode(x))
    >>> bool(torch.equal(y["boxes"], x["boxes"])) and y["n"] == 2
    True
"""

from __future__ import annotations

import base64
import math
import sys
from typing import Any

from esg_prefect.exceptions import InvalidInputError

_TAG = "__esg__"
_DTYPES = (
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "bool",
)
MAX_DEPTH = 64


class CodecError(InvalidInputError):
    """A value that cannot be encoded, or a payload that does not decode; the message says which."""


def encode(value: Any, _depth: int = 0) -> Any:
    """A JSON-ready form of ``value``.

    Raises:
        CodecError: naming the type that has no safe encoding.
    """
    if _depth > MAX_DEPTH:
        raise CodecError(f"value nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {_TAG: "float", "v": repr(value)}
    if isinstance(value, list):
        return [encode(v, _depth + 1) for v in value]
    if isinstance(value, tuple):
        return {_TAG: "tuple", "v": [encode(v, _depth + 1) for v in value]}
    if isinstance(value, dict):
        for k in value:
            if not isinstance(k, str):
                raise CodecError(f"dict keys must be strings to travel, got key {k!r} of type {type(k).__name__}")
        if _TAG in value:
            raise CodecError(f"dict key {_TAG!r} is reserved by the wire encoding")
        return {k: encode(v, _depth + 1) for k, v in value.items()}
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return _tensor(value)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        arr = numpy.ascontiguousarray(value)
        if arr.dtype.name not in _DTYPES:
            raise CodecError(f"numpy dtype {arr.dtype.name!r} has no wire encoding; supported: {_DTYPES}")
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        return {_TAG: "ndarray", "dtype": arr.dtype.name, "shape": list(arr.shape), "data": _b64(data)}
    raise CodecError(
        f"values of type {type(value).__module__}.{type(value).__qualname__} cannot travel between a flow "
        "and the pool service (no pickling over the network); use tensors, arrays, numbers, strings, lists or dicts"
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _tensor(t: Any) -> dict[str, Any]:
    import torch

    t = t.detach().cpu()
    dtype = str(t.dtype).removeprefix("torch.")
    if dtype not in _DTYPES:
        raise CodecError(f"tensor dtype {dtype!r} has no wire encoding; supported: {_DTYPES}")
    # A fresh 1-d buffer: ``contiguous()`` and ``clone()`` keep a 0 stride on size-1 dimensions
    # (broadcast views such as ``x.expand(1)``), which ``view(uint8)`` refuses.
    flat = torch.empty(t.numel(), dtype=t.dtype).copy_(t.reshape(-1))
    raw = flat.view(torch.uint8) if t.dtype != torch.bool else flat.to(torch.uint8)
    return {_TAG: "tensor", "dtype": dtype, "shape": list(t.shape), "data": _b64(raw.numpy().tobytes())}


def decode(value: Any, _depth: int = 0) -> Any:
    """The value :func:`encode` encoded.

    Raises:
        CodecError: on a malformed payload (unknown tag, bad dtype, size mismatch), named.
    """
    if _depth > MAX_DEPTH:
        raise CodecError(f"payload nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [decode(v, _depth + 1) for v in value]
    if not isinstance(value, dict):
        raise CodecError(f"unexpected JSON value of type {type(value).__name__}")
    tag = value.get(_TAG)
    if tag is None:
        return {k: decode(v, _depth + 1) for k, v in value.items()}
    if tag == "tuple":
        return tuple(decode(v, _depth + 1) for v in _field(value, "v", list))
    if tag == "float":
        text = _field(value, "v", str)
        if text not in ("nan", "inf", "-inf"):
            raise CodecError(f"bad float payload {text!r}")
        return float(text)
    if tag in ("tensor", "ndarray"):
        return _array(value, tag)
    raise CodecError(f"unknown payload tag {tag!r}")


def _field(value: dict[str, Any], name: str, kind: type) -> Any:
    got = value.get(name)
    if not isinstance(got, kind):
        raise CodecError(f"payload field {name!r} must be a {kind.__name__}, got {type(got).__name__}")
    return got


def _array(value: dict[str, Any], tag: str) -> Any:
    import numpy as np

    dtype = _field(value, "dtype", str)
    if dtype not in _DTYPES:
        raise CodecError(f"payload dtype {dtype!r} is not one of {_DTYPES}")
    shape = _field(value, "shape", list)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise CodecError(f"payload shape must be non-negative ints, got {shape!r}")
    try:
        data = base64.b64decode(_field(value, "data", str), validate=True)
    except ValueError as exc:
        raise CodecError(f"payload data is not base64: {exc}") from None
    count = math.prod(shape)
    if tag == "ndarray" or dtype != "bfloat16":
        np_dtype = np.dtype("bool" if dtype == "bool" else dtype).newbyteorder("<") if dtype != "bfloat16" else None
        if np_dtype is None or len(data) != count * np_dtype.itemsize:
            raise CodecError(f"payload of {len(data)} bytes does not hold {count} {dtype} values")
        arr = np.frombuffer(data, dtype=np_dtype).reshape(shape)
        if tag == "ndarray":
            return arr.copy()
        import torch

        return torch.from_numpy(arr.astype(arr.dtype.newbyteorder("="), copy=True))
    import torch

    if len(data) != count * 2:
        raise CodecError(f"payload of {len(data)} bytes does not hold {count} bfloat16 values")
    if count == 0:  # frombuffer refuses an empty buffer
        return torch.empty(shape, dtype=torch.bfloat16)
    return torch.frombuffer(bytearray(data), dtype=torch.bfloat16).reshape(shape).clone()
