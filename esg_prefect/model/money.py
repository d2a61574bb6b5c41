"""How a cost is written for people: one format for every surface that shows a run's cost.

Always three significant digits, trailing zeros kept (``0.000150``, ``2.40``;
zero is ``0``), positional from 1e-6 up and with an exponent below (``1.15e-7``,
as a browser writes such a number), so that a run's table artifact, its
summary, its runs-list tag, ``esg-prefect costs``, ``pool status``, the demo
and the tables and lines of ``simulate`` and ``compare`` read the same figure
for the same cost. A column of costs (and a bill split into its parts) is
written in one notation, decided from all its values (:func:`money_column`):
``0.00000107`` above ``5.86e-7`` reads as two different scales, ``1.07e-6``
above ``5.86e-7`` does not. Machine-readable outputs (``--json``, CSV, the
cost store) keep full precision; rounded rows need not add up to a rounded
total, which the tables that show both say.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from decimal import Decimal

from esg_prefect.model.attribution import COST_UNIT

ROUNDED_NOTE = "rounded to 3 significant digits: rows may not add up to the total exactly"
"""What a table of rounded costs says under (or about) its figures."""


def money_round(value: float) -> float:
    """``value`` to three significant digits, still a number."""
    return float(f"{value:.3g}")


def _positional(v: float) -> bool:
    """Whether ``v`` (already rounded) is written without an exponent on its own."""
    return v == 0.0 or 1e-6 <= abs(v) < 1e21


def money_exponent(values: Iterable[float]) -> bool:
    """Whether a column of these costs is written with exponents: when any of them, rounded, needs one."""
    return not all(_positional(money_round(v)) for v in values)


def money_text(value: float, exponent: bool | None = None) -> str:
    """A cost as text, three significant digits (trailing zeros kept), without its unit.

    ``exponent`` None: positional from 1e-6 up to 1e21, with an exponent outside
    that range (``9.01e-7``, no padding zero in the exponent), so a tag reads like
    the table cell it repeats and ``float()`` reads either back. True or False:
    that notation whatever the size, for a column that shares one (:func:`money_column`).
    Zero is ``0`` in either.

    Example:
        >>> [money_text(v) for v in (2.15, 0.00015, 9.012e-07, 1234.5, 0.0, 4.55805e-05, 0.9)]
        ['2.15', '0.000150', '9.01e-7', '1230', '0', '0.0000456', '0.900']
        >>> money_text(1.0712e-06, exponent=True), money_text(5.861e-07, exponent=False)
        ('1.07e-6', '0.000000586')
    """
    v = money_round(value)
    if v == 0.0:
        return "0"
    if exponent is None:
        exponent = not _positional(v)
    if exponent:
        mantissa, power = f"{v:.2e}".split("e")
        return f"{mantissa}e{int(power):+d}"
    exact = Decimal(repr(v))
    return format(exact, f".{max(0, 2 - exact.adjusted())}f")


def money_column(values: Sequence[float], unit: str = "") -> list[str]:
    """Costs that are read together (a table's column, a total and its parts) as text, in one notation.

    Positional when every value is positional on its own, else every non-zero one with an exponent, each
    to three significant digits: a column never mixes ``0.00000107`` and ``5.86e-7``. ``unit`` goes in
    front of each (none in a table cell, whose header carries it).

    Example:
        >>> money_column([1.0712e-06, 5.861e-07, 0.0]), money_column([0.00015, 2.15])
        (['1.07e-6', '5.86e-7', '0'], ['0.000150', '2.15'])
    """
    exponent = money_exponent(values)
    return [f"{unit}{money_text(v, exponent)}" for v in values]


def money_str(value: float, unit: str = COST_UNIT) -> str:
    """A cost with its unit in front: ``money_str(4.55805e-05) == "$0.0000456"``."""
    return f"{unit}{money_text(value)}"
