"""math-verify worker processes with a hard deadline per answer.

math-verify's own timeout is ``signal.alarm``: main thread only, whole
seconds, and blind to work stuck in C. Here each comparison runs in a worker
of a :class:`pebble.ProcessPool`, which kills a worker whose answer runs past
its deadline, ``timeout_s``, and starts a replacement; that answer counts as
0.0. An answer's clock starts when a worker takes it, so answers queued
behind a slow one lose nothing, and starting the workers is not counted.
The worker also enforces a soft deadline itself (most sympy work is
interruptible Python), which answers "timeout" without the cost of a new
worker.

The pool runs inside one host process (:mod:`pivotrl.rewards.math_worker`,
started with ``subprocess`` and fed batches through a pipe): multiprocessing
workers started from the caller would import the caller's ``__main__`` (a
training script with torch in it, once per worker and per replacement) or be
forked from a process holding torch threads. From the host they import only
that small script.

One host per process, created on first use, with ``PIVOTRL_MATH_WORKERS``
workers (default: CPU count, between 2 and 8), shut down at exit. Calls from
several threads are serialised by a lock; a batch spreads over all workers.
After ``os.fork`` the child starts its own host and never touches the
parent's.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("pivotrl.rewards")

WORKERS_ENV = "PIVOTRL_MATH_WORKERS"
STARTUP_TIMEOUT_S = 180.0
# How long a host may go without answering anything, beyond one deadline,
# before it is taken for hung (its workers would have been killed long before).
STALL_S = 60.0
MAX_START_FAILURES = 3
_WORKER_SCRIPT = Path(__file__).with_name("math_worker.py")
_MAX_SOFT_TIMEOUT_S = 1e6


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one comparison: a score of 0.0 or 1.0 and why."""

    score: float
    reason: str

    @property
    def timed_out(self) -> bool:
        """True when the comparison ran out of time."""
        return self.reason.startswith("timeout")


def soft_deadline(timeout_s: float) -> float:
    """Return the worker's own deadline: early enough to answer before pebble's kill."""
    return min(max(timeout_s - 0.3, 0.85 * timeout_s), _MAX_SOFT_TIMEOUT_S)


def default_pool_size() -> int:
    """Return the pool size from ``PIVOTRL_MATH_WORKERS`` or the CPU count (2 to 8)."""
    try:
        configured = int(os.environ.get(WORKERS_ENV, "0"))
    except ValueError:
        configured = 0
    if configured > 0:
        return configured
    return max(2, min(8, os.cpu_count() or 2))


class _HostError(RuntimeError):
    """The host process failed to start (``fatal``: it said why, so trying again will not help)."""

    def __init__(self, message: str, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


class _HostProcess:
    """The host process and the bytes read from it."""

    def __init__(self, size: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-P", str(_WORKER_SCRIPT), str(size)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            close_fds=True,
        )
        assert self.process.stdout is not None
        self.stdout_fd = self.process.stdout.fileno()
        os.set_blocking(self.stdout_fd, False)
        self.buffer = b""
        self.busy = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, message: dict) -> bool:
        """Write one request line; False if the host is gone."""
        assert self.process.stdin is not None
        view = memoryview(json.dumps(message).encode() + b"\n")
        try:
            while view:
                written = self.process.stdin.write(view)
                view = view[written or 0 :]
        except (BrokenPipeError, OSError, ValueError):
            return False
        return True

    def receive(self, wait_s: float) -> list[dict] | None:
        """The messages that arrive within ``wait_s`` (maybe none); None at end of file."""
        # poll, not select: a process with many open files may hold descriptors past 1024.
        poller = select.poll()
        poller.register(self.stdout_fd, select.POLLIN)
        if not poller.poll(max(0.0, wait_s) * 1000):
            return []
        chunks = []
        while True:
            try:
                chunk = os.read(self.stdout_fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError:
                return None
            if not chunk:
                if not chunks:
                    return None
                break
            chunks.append(chunk)
        self.buffer += b"".join(chunks)
        *lines, self.buffer = self.buffer.split(b"\n")
        messages = []
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict):
                messages.append(message)
        return messages

    def wait_ready(self) -> None:
        """Return once the host's workers have started; raise _HostError if they cannot."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            messages = self.receive(deadline - time.monotonic())
            if messages is None:
                raise _HostError(f"exited during start-up (exit code {self.process.wait()})")
            for message in messages:
                if "fatal" in message:
                    raise _HostError(str(message["fatal"]), fatal=True)
                if "ready" in message:
                    return
        raise _HostError(f"not ready after {STARTUP_TIMEOUT_S:g}s")

    def kill(self) -> None:
        """Kill the host and reap it (its workers see it gone and exit)."""
        if self.process.poll() is None:
            try:
                self.process.kill()
            except OSError:
                pass
        self.process.wait()
        self._close_pipes()

    def close(self, timeout_s: float) -> None:
        """Ask the host to stop its workers and exit (close its stdin); kill it if it lingers."""
        try:
            assert self.process.stdin is not None
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def _close_pipes(self) -> None:
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass


class MathWorkerPool:
    """math-verify workers behind one host process; :meth:`verify` compares (prediction, reference) pairs."""

    def __init__(self, size: int | None = None) -> None:
        self.size = max(1, size if size is not None else default_pool_size())
        self.pid = os.getpid()
        self.host: _HostProcess | None = None
        self.lock = threading.Lock()

    def start(self) -> None:
        """Start the host and its workers now (the first :meth:`verify` otherwise does)."""
        with self.lock:
            self._ensure_host()

    def verify(
        self,
        pairs: Sequence[tuple[str, str]],
        timeout_s: float,
        *,
        soft: bool = True,
    ) -> list[Verdict]:
        """Compare each (prediction, reference) pair, each within ``timeout_s`` of a worker taking it.

        ``soft``: the worker also stops itself a little before ``timeout_s``
        (:func:`soft_deadline`); False leaves only the kill at ``timeout_s``.
        """
        for pair in pairs:
            if not (
                isinstance(pair, (tuple, list))
                and len(pair) == 2
                and all(isinstance(text, str) for text in pair)
            ):
                raise TypeError(
                    f"verify takes (prediction, reference) pairs of strings, got {repr(pair)[:80]}"
                )
        if not pairs:
            return []
        if not timeout_s > 0:
            return [Verdict(0.0, "timeout: no time allowed") for _ in pairs]
        timeout_s = float(timeout_s)
        soft_s = soft_deadline(timeout_s) if soft else None
        with self.lock:
            return self._run(pairs, timeout_s, soft_s)

    def close(self) -> None:
        """Stop the host and its workers, and reap the host."""
        with self.lock:
            if self.host is not None:
                self.host.close(2.0)
                self.host = None

    def _ensure_host(self) -> _HostProcess:
        if self.host is not None and (self.host.busy or self.host.process.poll() is not None):
            self.host.kill()  # left busy by an interrupted call, or dead
            self.host = None
        failures = 0
        while self.host is None:
            host = _HostProcess(self.size)
            try:
                host.wait_ready()
            except _HostError as error:
                host.kill()
                failures += 1
                logger.error("math-verify host failed to start (%s)", error)
                if error.fatal or failures >= MAX_START_FAILURES:
                    raise RuntimeError(
                        f"math-verify workers failed to start ({error}); "
                        f"are math-verify and pebble installed for {sys.executable}?"
                    ) from error
                continue
            self.host = host
        return self.host

    def _run(
        self, pairs: Sequence[tuple[str, str]], timeout_s: float, soft_s: float | None
    ) -> list[Verdict]:
        results: list[Verdict | None] = [None] * len(pairs)
        host = self._ensure_host()
        request = {"t": timeout_s, "soft": soft_s, "p": [list(pair) for pair in pairs]}
        host.busy = True
        if not host.send(request):
            return self._lost(host, results, "error: the host closed its input")
        left = len(pairs)
        patience = timeout_s + STALL_S
        last = time.monotonic()
        while left:
            wait_s = last + patience - time.monotonic()
            if wait_s <= 0:
                return self._lost(host, results, f"error: no answer from the host in {patience:g}s")
            messages = host.receive(wait_s)
            if messages is None:
                return self._lost(host, results, "error: the host exited")
            for message in messages:
                if "fatal" in message:
                    return self._lost(host, results, f"error: {message['fatal']}")
                index = message.get("i")
                if isinstance(index, int) and 0 <= index < len(results) and results[index] is None:
                    results[index] = Verdict(
                        1.0 if message.get("s") == 1 else 0.0, str(message.get("r", ""))
                    )
                    left -= 1
                    last = time.monotonic()
        host.busy = False
        return [r if r is not None else Verdict(0.0, "error: no result") for r in results]

    def _lost(self, host: _HostProcess, results: list[Verdict | None], why: str) -> list[Verdict]:
        """Give up on the host: kill it and score what it had not answered 0.0."""
        logger.error("math-verify host lost (%s); a new one starts on the next call", why)
        host.kill()
        self.host = None
        return [r if r is not None else Verdict(0.0, why) for r in results]


_POOL: MathWorkerPool | None = None
_POOL_LOCK = threading.Lock()


def get_pool() -> MathWorkerPool:
    """Return this process's pool, creating it on first use (and anew after a fork)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():
            _POOL = MathWorkerPool()
        return _POOL


def configure_pool(workers: int | None = None) -> None:
    """Replace this process's pool by one of ``workers`` processes (None: the default size)."""
    global _POOL
    shutdown_pool()
    with _POOL_LOCK:
        _POOL = MathWorkerPool(workers)


def shutdown_pool() -> None:
    """Stop this process's workers now (they restart on the next call)."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None and pool.pid == os.getpid():
        pool.close()


atexit.register(shutdown_pool)
