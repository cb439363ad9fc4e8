"""Kubernetes resource quantities ("16Gi", "1.5G", "2e9") as numbers (pure, standard library only).

`pdfleet validate` and `pdfleet local` run without the kubernetes client, so the API parses
quantities itself, the way apimachinery's resource.Quantity reads them: a signed decimal number,
then at most one suffix: binary (Ki Mi Gi Ti Pi Ei), decimal (n u m "" k M G T P E) or a decimal
exponent (e3, E-2).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1), "k": Decimal("1e3"),
           "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18")}
_FORM = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$")


class BadQuantity(ValueError):
    """Not a Kubernetes quantity; the message says what one looks like."""


def parse(value: str) -> Decimal:
    """The quantity's value; BadQuantity when ``value`` is not one."""
    m = _FORM.match(value.strip()) if isinstance(value, str) else None
    if not m:
        raise BadQuantity(f"{value!r} is not a quantity (a number with an optional suffix: 16Gi, 1.5G, 2e9)")
    number, suffix = Decimal(m.group(1)), m.group(2) or ""
    try:
        if suffix in BINARY:
            return number * BINARY[suffix]
        if suffix in DECIMAL:
            return number * DECIMAL[suffix]
        return number.scaleb(int(suffix[1:]))
    except (InvalidOperation, OverflowError, ValueError):
        raise BadQuantity(f"{value!r} is out of range") from None


def to_bytes(value: str) -> int:
    """A byte count: the quantity rounded down to a whole byte."""
    return int(parse(value))


__all__ = ["BadQuantity", "parse", "to_bytes"]
