"""A pool service's address, checked one way wherever one is given: an http(s) URL with a host.

The runner (``address=``), the pool client and ``deployments/serve.py --pool-url``
all refuse a bad address with the same one line, naming the value, before
anything connects: a bare ``host:port`` or an ``http://`` with no host would
otherwise fail later, as a connection error far from the option that caused it.
"""

from __future__ import annotations

import httpx

from esg_prefect.exceptions import InvalidInputError

__all__ = ["EXAMPLE_ADDRESS", "address_error", "address_refusal", "check_address"]

EXAMPLE_ADDRESS = "http://127.0.0.1:4270"
"""The address of a pool service started with the defaults, shown in refusals as an example."""


def address_error(url: object) -> str | None:
    """Why ``url`` cannot be a pool service's address, or None when it is an http(s) URL with a host."""
    if not isinstance(url, str):
        return f"not a string but {type(url).__name__}"
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        return str(exc).rstrip(".")  # httpx's sentence, ended by the refusal's "; give ..."
    if parsed.scheme not in ("http", "https") or not parsed.host:
        return "not an http(s) URL with a host"
    return None


def address_refusal(url: object) -> str | None:
    """The refusal of ``url`` as a pool service's address (why, an example, the value), or None when it can be one.

    One wording wherever an address is given: each caller puts the option's name in front.
    """
    if why := address_error(url):
        return f"{why}; give the pool service's address, e.g. {EXAMPLE_ADDRESS}, got {url!r}"
    return None


def check_address(url: object, what: str = "address") -> None:
    """Refuse ``url`` unless it can be a pool service's address (see :func:`address_error`).

    Raises:
        InvalidInputError: one line naming ``what`` (the option or argument) and the value.
    """
    if refusal := address_refusal(url):
        raise InvalidInputError(f"{what}: {refusal}")
