"""The math-verify worker process: reads requests on stdin, answers on stdout.

Started by :mod:`pivotrl.rewards.math_pool` as ``python -P math_worker.py``
(by path, and standalone: it imports nothing from pivotrl, so it starts fast
and cannot shadow the standard library). One JSON object per line each way::

    -> {"i": 7, "p": "\\frac{1}{2}", "g": "0.5", "t": 1.7}
    <- {"i": 7, "s": 1, "r": "equal"}

``t`` is a soft deadline: an interval timer interrupts Python-level work
(most of sympy) and the worker answers ``"r": "timeout"``. Work stuck in C
(a huge integer power) ignores it; the parent then kills this process.

Safety, defence in depth on top of the parent's extraction:

* address space capped (``PIVOTRL_MATH_WORKER_MEMORY_MB``, default 3072,
  0 for none), so runaway big-number arithmetic raises MemoryError;
* every string that would reach sympy's ``parse_expr`` (which evaluates
  Python) is checked first. math-verify's ``ExprExtractionConfig`` calls it
  on strings its regex limited to digits and ``+ - * / ^ ( )``: only those
  pass (:func:`is_safe_expression`). ``sympify(str)``, which sympy and
  math-verify use on internal strings ("kilo", number literals), may parse
  words and operators but no quotes, brackets, underscores, Python builtins
  or string-making sympy functions (:func:`is_safe_for_sympify`). Model text
  reaches neither in practice; this is defence in depth;
* the worker exits when its parent dies (stdin closes, or a watchdog thread
  sees it re-parented).
"""

from __future__ import annotations

import builtins
import json
import logging
import os
import re
import resource
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from functools import lru_cache
from typing import Any

MEMORY_ENV = "PIVOTRL_MATH_WORKER_MEMORY_MB"
DEFAULT_MEMORY_MB = 3072
MAX_PARSE_CHARS = 2000

# What math-verify's plain-expression extraction may hand to parse_expr: its
# own regex only matches digits, blanks and + - * / ^ ( ) (^ becomes **).
_EXPRESSION_CHARS = re.compile(r"[0-9\s.+\-*/()]*")
# What sympy's own sympify(str) calls may parse (sympy uses it internally on
# strings such as "kilo" or "1/2"): words, numbers and operators, but no
# quotes, brackets, underscores or colons, and no name that could build or
# run code: every Python builtin (chr, eval, exec, open, getattr, ...) and the
# sympy functions that return strings or have side effects.
_SYMPIFY_CHARS = re.compile(r"[0-9A-Za-z\s.+\-*/()^,]*")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_REFUSED_NAMES = frozenset(dir(builtins)) | frozenset(
    (
        "S sympify srepr sstr sstrrepr latex mathml pretty pprint preview plot textplot "
        "test doctest var symbols lambdify evaluate python pycode ccode cxxcode fcode "
        "jscode julia octave rcode rust maple mathematica dotprint Function Symbol Dummy "
        "Wild parse exec eval interactive init"
    ).split()
)


class Deadline(BaseException):
    """The soft deadline passed (a BaseException, so library ``except Exception`` cannot swallow it)."""


def is_safe_expression(text: object) -> bool:
    """True iff ``text`` is a plain digits-and-operators string, safe for parse_expr."""
    return (
        isinstance(text, str)
        and len(text) <= MAX_PARSE_CHARS
        and _EXPRESSION_CHARS.fullmatch(text) is not None
    )


def is_safe_for_sympify(text: object) -> bool:
    """True iff ``text`` holds no construct that could make sympify run arbitrary code."""
    if not isinstance(text, str) or len(text) > MAX_PARSE_CHARS:
        return False
    if _SYMPIFY_CHARS.fullmatch(text) is None:
        return False
    return not any(name in _REFUSED_NAMES for name in _NAME.findall(text))


def _guard_parse_expr() -> None:
    """Check every string math-verify or sympify hands to sympy's parse_expr first."""
    import math_verify.parser
    import sympy.parsing.sympy_parser

    original = sympy.parsing.sympy_parser.parse_expr

    def guarded(check: Callable[[object], bool]) -> Callable[..., Any]:
        def parse_expr(s: Any, *args: Any, **kwargs: Any) -> Any:
            if not check(s):
                raise ValueError("pivotrl refused to hand this text to sympy's parse_expr")
            return original(s, *args, **kwargs)

        return parse_expr

    # sympify imports parse_expr from this module at call time.
    sympy.parsing.sympy_parser.parse_expr = guarded(is_safe_for_sympify)
    # math-verify's ExprExtractionConfig path bound the name at import.
    math_verify.parser.parse_expr = guarded(is_safe_expression)
    if hasattr(math_verify.parser, "parse_expr_cached"):
        math_verify.parser.parse_expr_cached.cache_clear()


def _limit_memory() -> None:
    try:
        megabytes = int(os.environ.get(MEMORY_ENV, DEFAULT_MEMORY_MB))
    except ValueError:
        megabytes = DEFAULT_MEMORY_MB
    if megabytes > 0:
        limit = megabytes * 1024 * 1024
        try:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ValueError, OSError):
            pass


def _watch_parent() -> None:
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _on_alarm(signum: int, frame: object) -> None:
    raise Deadline()


def main() -> None:
    """Serve verification requests until stdin closes."""
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    # Keep stray prints from libraries off the protocol channel.
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    _limit_memory()
    _watch_parent()
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)

    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    _guard_parse_expr()
    configs = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]

    @lru_cache(maxsize=8192)
    def parsed(answer: str) -> tuple[Any, ...]:
        # The answer is already extracted; boxing it lets math-verify's LaTeX
        # normaliser (units, \text, \%, \left...) see it whole, and plain
        # expressions ("1/2", "72 apples") still parse.
        return tuple(parse("\\boxed{" + answer + "}", configs, parsing_timeout=None))

    def judge(prediction: str, reference: str) -> tuple[int, str]:
        gold = parsed(reference)
        if not gold:
            return 0, "reference unparsable"
        target = parsed(prediction)
        if not target:
            return 0, "answer unparsable"
        if verify(list(gold), list(target), timeout_seconds=None):
            return 1, "equal"
        return 0, "not equal"

    signal.signal(signal.SIGALRM, _on_alarm)
    # Ctrl-C reaches the whole process group; the parent decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # math-verify builds its parsers on first use (a fraction of a second):
    # here, before "ready", so that no answer's deadline pays for it.
    judge("1", "1")
    protocol.write(b'{"ready": 1}\n')
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
            ident = request["i"]
        except (ValueError, KeyError, TypeError):
            continue
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, max(float(request.get("t", 1.0)), 0.001))
                score, reason = judge(str(request["p"]), str(request["g"]))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except Deadline:
            score, reason = 0, "timeout"
        except RecursionError:
            score, reason = 0, "error: RecursionError"
        except Exception as error:  # noqa: BLE001 - any failure scores 0.0
            score, reason = 0, f"error: {type(error).__name__}"
        protocol.write(json.dumps({"i": ident, "s": score, "r": reason}).encode() + b"\n")


if __name__ == "__main__":
    main()
