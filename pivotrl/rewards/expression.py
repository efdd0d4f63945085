"""A small safe arithmetic parser: ``+ - * /``, parentheses, exact Fractions.

Model text is never evaluated as Python. A single regular expression without
nested quantifiers splits the text into tokens (linear time), and a
recursive-descent parser over the tokens evaluates with
:class:`fractions.Fraction`, so ``1/3*3 == 1`` exactly. The grammar::

    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := NUMBER | "(" expr ")" | "-" factor      # unary minus only if allowed

NUMBER is a non-negative ASCII integer literal (``007`` is 7), or a decimal
literal such as ``1.5`` when ``allow_decimals`` is set. ``×`` and ``·`` are
read as ``*``, ``÷`` as ``/`` and the Unicode minus ``−`` as ``-``; there is
no exponent, no implicit multiplication and no unary plus. Inputs are bounded
(:data:`MAX_EXPRESSION_CHARS`, :data:`MAX_DEPTH`, :data:`MAX_NUMBER_DIGITS`)
so a call's cost is bounded too. Every failure, division by zero included,
raises :class:`ExpressionError`; :func:`try_evaluate` returns None instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction

MAX_EXPRESSION_CHARS = 1000
MAX_DEPTH = 32
MAX_NUMBER_DIGITS = 100

_OPERATOR_ALIASES = {"×": "*", "·": "*", "÷": "/", "−": "-"}
_LEXER = re.compile(
    r"(?P<num>[0-9]+(?:\.[0-9]+)?)"
    r"|(?P<op>[-+*/×·÷−])"
    r"|(?P<lp>\()"
    r"|(?P<rp>\))"
    r"|(?P<eq>=)"
    r"|(?P<newline>\n)"
    r"|(?P<space>[^\S\n]+)"
    r"|(?P<other>[^-+*/×·÷−()=0-9\s]+)"
)


class ExpressionError(ValueError):
    """The text is not a valid, evaluable arithmetic expression."""


@dataclass(frozen=True, slots=True)
class Token:
    """One lexical token: kind is num, op, lp, rp, eq, newline or other."""

    kind: str
    text: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The exact value of an expression and the number literals it used, in order."""

    value: Fraction
    numbers: tuple[Fraction, ...]


def lex(text: str) -> Iterator[Token]:
    """Yield the tokens of ``text`` (spaces dropped, operator aliases normalised)."""
    for match in _LEXER.finditer(text):
        kind = match.lastgroup
        if kind is None or kind == "space":
            continue
        token_text = match.group()
        if kind == "op":
            token_text = _OPERATOR_ALIASES.get(token_text, token_text)
        yield Token(kind, token_text, match.start(), match.end())


def number_value(token: Token, *, allow_decimals: bool = False) -> Fraction:
    """Return the exact value of a ``num`` token, or raise ExpressionError."""
    text = token.text
    if len(text) > MAX_NUMBER_DIGITS:
        raise ExpressionError(f"number literal longer than {MAX_NUMBER_DIGITS} characters")
    if "." in text and not allow_decimals:
        raise ExpressionError(f"decimal literal {text!r} not allowed")
    return Fraction(text)


class _Parser:
    """Recursive descent over a token list; one instance per expression."""

    def __init__(
        self,
        tokens: Sequence[Token],
        *,
        allow_unary_minus: bool,
        allow_decimals: bool,
        max_depth: int,
    ) -> None:
        self.tokens = tokens
        self.pos = 0
        self.depth = 0
        self.allow_unary_minus = allow_unary_minus
        self.allow_decimals = allow_decimals
        self.max_depth = max_depth
        self.numbers: list[Fraction] = []

    def peek(self) -> Token | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> Token:
        token = self.peek()
        if token is None:
            raise ExpressionError("unexpected end of expression")
        self.pos += 1
        return token

    def parse(self) -> Evaluation:
        if not self.tokens:
            raise ExpressionError("empty expression")
        value = self.expr()
        token = self.peek()
        if token is not None:
            raise ExpressionError(f"unexpected {token.text!r} at offset {token.start}")
        return Evaluation(value, tuple(self.numbers))

    def expr(self) -> Fraction:
        value = self.term()
        while (token := self.peek()) is not None and token.kind == "op" and token.text in "+-":
            self.pos += 1
            rhs = self.term()
            value = value + rhs if token.text == "+" else value - rhs
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while (token := self.peek()) is not None and token.kind == "op" and token.text in "*/":
            self.pos += 1
            rhs = self.factor()
            if token.text == "*":
                value = value * rhs
            elif rhs == 0:
                raise ExpressionError("division by zero")
            else:
                value = value / rhs
        return value

    def factor(self) -> Fraction:
        token = self.take()
        if token.kind == "num":
            value = number_value(token, allow_decimals=self.allow_decimals)
            self.numbers.append(value)
            return value
        if token.kind == "lp" or (token.kind == "op" and token.text == "-"):
            if token.kind == "op" and not self.allow_unary_minus:
                raise ExpressionError(f"unary minus at offset {token.start} not allowed")
            self.depth += 1
            if self.depth > self.max_depth:
                raise ExpressionError(f"nesting deeper than {self.max_depth}")
            if token.kind == "op":
                value = -self.factor()
            else:
                value = self.expr()
                closing = self.take()
                if closing.kind != "rp":
                    raise ExpressionError(f"expected ')' at offset {closing.start}")
            self.depth -= 1
            return value
        raise ExpressionError(f"unexpected {token.text!r} at offset {token.start}")


def evaluate_tokens(
    tokens: Sequence[Token],
    *,
    allow_unary_minus: bool = False,
    allow_decimals: bool = False,
    max_depth: int = MAX_DEPTH,
) -> Evaluation:
    """Evaluate already-lexed tokens exactly, or raise ExpressionError."""
    parser = _Parser(
        tokens,
        allow_unary_minus=allow_unary_minus,
        allow_decimals=allow_decimals,
        max_depth=max_depth,
    )
    return parser.parse()


def evaluate(
    text: str,
    *,
    allow_unary_minus: bool = False,
    allow_decimals: bool = False,
    max_length: int = MAX_EXPRESSION_CHARS,
    max_depth: int = MAX_DEPTH,
) -> Evaluation:
    """Evaluate ``text`` as an arithmetic expression exactly, or raise ExpressionError."""
    if not isinstance(text, str):
        raise ExpressionError(f"expected str, got {type(text).__name__}")
    if len(text) > max_length:
        raise ExpressionError(f"expression longer than {max_length} characters")
    tokens = list(lex(text))
    for token in tokens:
        if token.kind not in ("num", "op", "lp", "rp"):
            raise ExpressionError(f"unexpected {token.text!r} at offset {token.start}")
    return evaluate_tokens(
        tokens,
        allow_unary_minus=allow_unary_minus,
        allow_decimals=allow_decimals,
        max_depth=max_depth,
    )


def try_evaluate(
    text: str,
    *,
    allow_unary_minus: bool = False,
    allow_decimals: bool = False,
    max_length: int = MAX_EXPRESSION_CHARS,
    max_depth: int = MAX_DEPTH,
) -> Evaluation | None:
    """Like :func:`evaluate` but return None instead of raising."""
    try:
        return evaluate(
            text,
            allow_unary_minus=allow_unary_minus,
            allow_decimals=allow_decimals,
            max_length=max_length,
            max_depth=max_depth,
        )
    except (ExpressionError, RecursionError):
        return None
