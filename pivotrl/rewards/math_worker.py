"""The math-verify host process and the pool of workers it runs.

Started by :mod:`pivotrl.rewards.math_pool` as ``python -P math_worker.py
WORKERS`` (by path, and standalone: it imports nothing from pivotrl, so it
cannot shadow the standard library and does not import torch). The host runs
a :class:`pebble.ProcessPool` of WORKERS processes started with the
``spawn`` method: each judges one (prediction, reference) pair at a time, and
pebble kills a worker whose pair runs past its hard deadline (counted from
the moment that worker takes the pair) and starts a replacement. The pool
lives here, not in the caller, because a multiprocessing worker imports its
parent's ``__main__`` (with spawn and forkserver) or copies the whole parent
(with fork): from the host that is this small script, never the caller's
training script with torch in it.

One JSON object per line each way::

    <- {"ready": 1}                                  every worker has started
    -> {"t": 2.0, "soft": 1.7, "p": [["\\frac{1}{2}", "0.5"], ...]}
    <- {"i": 0, "s": 1, "r": "equal"}                 one line per pair, as they finish
    <- {"fatal": "..."}                              the workers cannot start; the host exits

``t`` is the hard deadline per pair (pebble's timeout); ``soft`` the
worker's own: an interval timer interrupts Python-level work (most of sympy)
and the worker answers ``"r": "timeout"`` without being killed. Work stuck in
C ignores the timer; pebble then kills the worker (SIGTERM at its default
action, so it dies even inside C code). ``soft`` null: no timer.

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
* the host exits when its stdin closes (the caller is gone) and stops its
  workers; a worker exits when it sees itself re-parented (the host died).
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
STARTUP_TIMEOUT_S = 120.0
MAX_POOL_FAILURES = 3

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


# --- the worker (runs in each pool process) ----------------------------------------


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


_judge: Callable[[str, str], tuple[int, str]] | None = None


def start_worker() -> None:
    """Pool initializer: limits, signal handlers, math-verify imported and guarded."""
    global _judge
    # pebble stops a worker with SIGTERM; at its default action it kills
    # even a worker stuck in C (a Python handler would wait for the C call).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
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

    _judge = judge
    signal.signal(signal.SIGALRM, _on_alarm)
    # math-verify builds its parsers on first use (a fraction of a second):
    # here, so that no answer's deadline pays for it.
    judge("1", "1")


def compare(prediction: str, reference: str, soft_s: float | None) -> tuple[int, str]:
    """Score one pair in a worker: (1, "equal") or (0, why), within ``soft_s`` of Python time."""
    if _judge is None:
        return 0, "error: worker not started"
    try:
        try:
            if soft_s is not None:
                signal.setitimer(signal.ITIMER_REAL, max(soft_s, 0.001))
            return _judge(prediction, reference)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except Deadline:
        return 0, "timeout"
    except RecursionError:
        return 0, "error: RecursionError"
    except Exception as error:  # noqa: BLE001 - any failure scores 0
        return 0, f"error: {type(error).__name__}"


def worker_pid() -> int:
    """The worker's process id (the host's start-up check)."""
    time.sleep(0.05)  # long enough that an idle worker takes the next check
    return os.getpid()


# --- the host ------------------------------------------------------------------------


class _Host:
    """The pebble pool and the protocol around it."""

    def __init__(self, size: int, protocol: Any) -> None:
        self.size = size
        self.protocol = protocol
        self.pool: Any = None
        self.failures = 0

    def send(self, message: dict) -> None:
        self.protocol.write(json.dumps(message).encode() + b"\n")

    def start(self) -> None:
        """A fresh pool whose every worker has answered; exit with a fatal line if none can start."""
        import multiprocessing

        from pebble import ProcessPool

        while True:
            if self.pool is not None:
                self.pool.stop()
                self.pool.join()
            self.pool = ProcessPool(
                max_workers=self.size,
                initializer=start_worker,
                context=multiprocessing.get_context("spawn"),
            )
            why = self._wait_for_workers()
            if why is None:
                return
            self.failures += 1
            if self.failures >= MAX_POOL_FAILURES:
                self.send({"fatal": f"math-verify workers failed to start ({why})"})
                self.pool.stop()
                self.pool.join()
                sys.exit(1)

    def _wait_for_workers(self) -> str | None:
        seen: set[int] = set()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while len(seen) < self.size:
            if time.monotonic() > deadline:
                return f"not ready after {STARTUP_TIMEOUT_S:g}s"
            try:
                futures = [self.pool.schedule(worker_pid) for _ in range(2 * self.size)]
                for future in futures:
                    seen.add(future.result(timeout=max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                continue
            except Exception as error:  # noqa: BLE001 - the pool broke while starting
                return f"{type(error).__name__}: {error}"
        return None

    def run(self, pairs: list[tuple[str, str]], hard_s: float, soft_s: float | None) -> None:
        """Score ``pairs``, sending one line per pair as it finishes."""
        from concurrent.futures.process import BrokenProcessPool
        from queue import SimpleQueue

        from pebble import ProcessExpired

        if not self.pool.active:
            self.start()
        finished: SimpleQueue[tuple[int, Any, Any]] = SimpleQueue()
        crashed: set[int] = set()

        def submit(index: int) -> None:
            prediction, reference = pairs[index]
            pool = self.pool
            future = pool.schedule(compare, args=(prediction, reference, soft_s), timeout=hard_s)
            future.add_done_callback(lambda done: finished.put((index, pool, done)))

        for index in range(len(pairs)):
            submit(index)
        left = len(pairs)
        while left:
            index, pool, future = finished.get()
            try:
                score, reason = future.result()
                self.failures = 0
            except TimeoutError:
                score, reason = 0, f"timeout after {hard_s:g}s (worker killed)"
            except ProcessExpired as error:
                if index in crashed:
                    score, reason = 0, f"error: worker crashed twice (exit code {error.exitcode})"
                else:  # once more, on another worker
                    crashed.add(index)
                    submit(index)
                    continue
            except BrokenProcessPool:
                # The whole pool failed: start a new one (once per pool) and resubmit.
                if pool is self.pool and not pool.active:
                    self.failures += 1
                    self.start()
                submit(index)
                continue
            except Exception as error:  # noqa: BLE001 - scores 0, with the reason
                score, reason = 0, f"error: {type(error).__name__}"
            self.send({"i": index, "s": score, "r": reason})
            left -= 1


def main() -> None:
    """Serve batches from stdin until it closes."""
    size = int(sys.argv[1])
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    # Keep stray prints off the protocol channel.
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    # Ctrl-C reaches the whole process group; the caller decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    host = _Host(size, protocol)
    host.start()
    host.send({"ready": 1})
    try:
        for line in sys.stdin.buffer:
            try:
                request = json.loads(line)
                pairs = [(str(p), str(g)) for p, g in request["p"]]
                hard_s = float(request["t"])
                soft_s = None if request.get("soft") is None else float(request["soft"])
            except (ValueError, KeyError, TypeError):
                continue
            host.run(pairs, hard_s, soft_s)
    except BrokenPipeError:
        pass
    finally:
        host.pool.stop()
        host.pool.join()


if __name__ == "__main__":
    main()
