"""Exact number literals: ``-3``, ``3.0``, ``1/2``, ``1,000`` as Fractions.

Used for the reference answers of the synthetic tasks and for the numeric
answers the arithmetic verifier reads. Nothing here evaluates an expression;
a literal is matched by one anchored regular expression without nested
quantifiers (linear time) and converted with :class:`fractions.Fraction`.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction
from numbers import Rational

MAX_LITERAL_CHARS = 200

_SIGN = r"[-+−]?"
_INTEGER = r"(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)"
_LITERAL = re.compile(
    rf"(?P<sign>{_SIGN})\s*(?:"
    rf"(?P<num>{_INTEGER})\s*/\s*(?P<den>[0-9]+)"
    rf"|(?P<int>{_INTEGER})(?P<frac>\.[0-9]+)?\.?"
    rf"|(?P<bare>\.[0-9]+)"
    r")"
)
# A number inside running text: a sign only counts when it does not follow a
# word character or a closing bracket ("5-3" holds the numbers 5 and 3).
NUMBER_IN_TEXT = re.compile(
    r"(?:(?<![\w).])[-−])?(?<![\w.])(?:[0-9]+/[0-9]+(?![0-9.])|[0-9]+(?:\.[0-9]+)?)"
)


def parse_number(text: str) -> Fraction | None:
    """Return the exact value of a whole-string number literal, else None.

    Accepted: optional sign (``-``, ``+`` or ``−``), then an integer
    (``1,000``-style thousands separators allowed), a decimal (``3.0``,
    ``.5``, a trailing full stop is ignored) or a fraction ``p/q`` with
    ``q != 0``; surrounding whitespace and ``$`` signs are ignored.
    """
    if not isinstance(text, str) or len(text) > MAX_LITERAL_CHARS:
        return None
    match = _LITERAL.fullmatch(text.strip().strip("$").strip())
    if match is None:
        return None
    negative = match["sign"] in ("-", "−")
    if match["den"] is not None:
        denominator = int(match["den"])
        if denominator == 0:
            return None
        value = Fraction(int(match["num"].replace(",", "")), denominator)
    elif match["int"] is not None:
        value = Fraction(match["int"].replace(",", "") + (match["frac"] or ""))
    else:
        value = Fraction(match["bare"])
    return -value if negative else value


def as_fraction(value: object) -> Fraction | None:
    """Return a reference value (int, Fraction, Decimal, float or literal string) exactly, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, Rational):
        return Fraction(value.numerator, value.denominator)
    if isinstance(value, Decimal):
        return Fraction(value) if value.is_finite() else None
    if isinstance(value, float):
        # Through the shortest repr, so 0.1 is 1/10 and not the binary float.
        return Fraction(Decimal(repr(value))) if math.isfinite(value) else None
    if isinstance(value, str):
        return parse_number(value)
    return None


def last_number(text: str) -> Fraction | None:
    """Return the value of the last number in running text (integer, decimal or p/q), else None."""
    if not isinstance(text, str):
        return None
    last = None
    for match in NUMBER_IN_TEXT.finditer(text):
        last = match
    if last is None:
        return None
    return parse_number(last.group())
