"""How a cost is written for people: one format for every surface that shows a run's cost.

Always three significant digits, trailing zeros kept (``0.000150``, ``2.40``;
zero is ``0``), positional from 1e-6 up and with an exponent below (``1.15e-7``,
as a browser writes such a number), so that a run's table artifact, its
summary, its runs-list tag, ``esg-prefect costs``, ``pool status``, the demo
and the tables and lines of ``simulate`` and ``compare`` read the same text
for the same figure, and a column of costs shows each to the same precision. Machine-readable outputs
(``--json``, CSV, the cost store) keep full precision; rounded rows need not
add up to a rounded total, which the tables that show both say.
"""

from __future__ import annotations

from decimal import Decimal

from esg_prefect.model.attribution import COST_UNIT

ROUNDED_NOTE = "rounded to 3 significant digits: rows may not add up to the total exactly"
"""What a table of rounded costs says under (or about) its figures."""


def money_round(value: float) -> float:
    """``value`` to three significant digits, still a number."""
    return float(f"{value:.3g}")


def money_text(value: float) -> str:
    """A cost as text, three significant digits (trailing zeros kept), without its unit.

    Positional from 1e-6 up to 1e21, with an exponent outside that range
    (``9.01e-7``, no padding zero in the exponent), so a tag reads like the
    table cell it repeats and ``float()`` reads either back.

    Example:
        >>> [money_text(v) for v in (2.15, 0.00015, 9.012e-07, 1234.5, 0.0, 4.55805e-05, 0.9)]
        ['2.15', '0.000150', '9.01e-7', '1230', '0', '0.0000456', '0.900']
    """
    v = money_round(value)
    if v == 0.0:
        return "0"
    if 1e-6 <= abs(v) < 1e21:
        exact = Decimal(repr(v))
        return format(exact, f".{max(0, 2 - exact.adjusted())}f")
    mantissa, exponent = f"{v:.2e}".split("e")
    return f"{mantissa}e{int(exponent):+d}"


def money_str(value: float, unit: str = COST_UNIT) -> str:
    """A cost with its unit in front: ``money_str(4.55805e-05) == "$0.0000456"``."""
    return f"{unit}{money_text(value)}"
