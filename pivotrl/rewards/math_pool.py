"""A pool of math-verify worker processes with a hard deadline per answer.

math-verify's own timeout is ``signal.alarm``: main thread only, whole
seconds, and blind to work stuck in C. Here each comparison runs in a
persistent worker process (:mod:`pivotrl.rewards.math_worker`, started with
``subprocess`` and fed through a pipe, so nothing is forked from a process
holding torch threads and the caller's ``__main__`` is never re-imported).
Each worker is kept two requests deep and answers them in order; an answer's
clock starts when its worker starts on it (when the previous answer
arrives). The worker enforces a soft deadline itself (most sympy work is
interruptible Python); if it has not answered by the hard deadline,
``timeout_s``, the parent kills it, counts the answer as 0.0, hands the
requests queued behind it to the other workers and starts a replacement.

One pool per process, created on first use, sized by
``PIVOTRL_MATH_WORKERS`` (default: CPU count, between 2 and 8), shut down at
exit. Calls from several threads are serialised by a lock; a batch spreads
over all workers. After ``os.fork`` the child builds its own pool and never
touches the parent's workers.
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
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("pivotrl.rewards")

WORKERS_ENV = "PIVOTRL_MATH_WORKERS"
STARTUP_TIMEOUT_S = 120.0
MAX_START_FAILURES = 3
PIPELINE_DEPTH = 2
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
    """Return the worker's own deadline: early enough to answer before the parent's kill."""
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


class _Worker:
    """One worker process and the request it is serving."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-P", str(_WORKER_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            close_fds=True,
        )
        assert self.process.stdout is not None and self.process.stdin is not None
        self.stdout_fd = self.process.stdout.fileno()
        os.set_blocking(self.stdout_fd, False)
        self.started = time.monotonic()
        self.ready = False
        self.buffer = b""
        # Requests sent and not yet answered, oldest first: (item, request id).
        # The worker serves them in order; the oldest one started when the
        # previous answer arrived (or when it was sent, if the worker was idle).
        self.inflight: deque[tuple[int, int]] = deque()
        self.head_started = 0.0

    def fileno(self) -> int:
        return self.stdout_fd

    def send(self, payload: bytes) -> bool:
        """Write one request; False if the worker is gone."""
        assert self.process.stdin is not None
        view = memoryview(payload)
        try:
            while view:
                written = self.process.stdin.write(view)
                view = view[written or 0 :]
        except (BrokenPipeError, OSError, ValueError):
            return False
        return True

    def read_messages(self) -> list[dict] | None:
        """Return the complete messages available now, or None at end of file."""
        chunks = []
        while True:
            try:
                chunk = os.read(self.stdout_fd, 65536)
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

    def kill(self) -> None:
        """Kill the process and reap it (no zombie)."""
        if self.process.poll() is None:
            try:
                self.process.kill()
            except OSError:
                pass
        self.process.wait()
        self._close_pipes()

    def close(self, deadline: float) -> None:
        """Ask the worker to exit (close its stdin), kill it if it lingers past ``deadline``."""
        try:
            assert self.process.stdin is not None
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
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
    """Persistent math-verify workers; :meth:`verify` compares (prediction, reference) pairs."""

    def __init__(self, size: int | None = None) -> None:
        self.size = max(1, size if size is not None else default_pool_size())
        self.pid = os.getpid()
        self.workers: list[_Worker] = []
        self.lock = threading.Lock()
        self.start_failures = 0
        self.next_request_id = 0

    def verify(self, pairs: Sequence[tuple[str, str]], timeout_s: float) -> list[Verdict]:
        """Compare each (prediction, reference) pair, each within ``timeout_s`` of its worker starting on it."""
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
        with self.lock:
            return self._run(pairs, float(timeout_s))

    def close(self) -> None:
        """Stop every worker and reap it."""
        with self.lock:
            deadline = time.monotonic() + 1.0
            for worker in self.workers:
                worker.close(deadline)
            self.workers = []

    def _fill(self) -> None:
        while len(self.workers) < self.size:
            self.workers.append(_Worker())

    def _retire(self, worker: _Worker) -> None:
        worker.kill()
        self.workers.remove(worker)
        self._fill()

    def _start_failed(self, worker: _Worker, why: str) -> None:
        self.start_failures += 1
        code = worker.process.poll()
        self._retire(worker)
        logger.error("math-verify worker failed to start (%s, exit code %s)", why, code)
        if self.start_failures >= MAX_START_FAILURES:
            raise RuntimeError(
                f"math-verify worker failed to start {self.start_failures} times in a row "
                f"({why}, exit code {code}); is math-verify installed for {sys.executable}?"
            )

    def _run(self, pairs: Sequence[tuple[str, str]], timeout_s: float) -> list[Verdict]:
        results: list[Verdict | None] = [None] * len(pairs)
        queue = deque(range(len(pairs)))
        crashed: set[int] = set()
        soft = soft_deadline(timeout_s)
        for worker in list(self.workers):
            if worker.inflight:  # left busy by an interrupted call
                self._retire(worker)
        self._fill()

        def requeue(worker: _Worker) -> None:
            # Everything a dead worker still held, except its current item, goes back.
            for item, _ in reversed(list(worker.inflight)[1:]):
                queue.appendleft(item)

        while queue or any(w.inflight for w in self.workers):
            # Keep every ready worker PIPELINE_DEPTH requests deep, so it never
            # waits for this loop between two answers.
            for worker in list(self.workers):
                while worker.ready and queue and len(worker.inflight) < PIPELINE_DEPTH:
                    item = queue.popleft()
                    self.next_request_id += 1
                    prediction, reference = pairs[item]
                    request = {
                        "i": self.next_request_id,
                        "p": prediction,
                        "g": reference,
                        "t": soft,
                    }
                    if not worker.send(json.dumps(request).encode() + b"\n"):
                        queue.appendleft(item)
                        requeue(worker)
                        if worker.inflight:
                            queue.appendleft(worker.inflight[0][0])
                        self._retire(worker)
                        break
                    if not worker.inflight:
                        worker.head_started = time.monotonic()
                    worker.inflight.append((item, self.next_request_id))

            wake = [
                w.head_started + timeout_s if w.ready else w.started + STARTUP_TIMEOUT_S
                for w in self.workers
                if w.inflight or not w.ready
            ]
            wait = max(0.0, min(wake) - time.monotonic()) if wake else 0.0
            readable, _, _ = select.select(self.workers, [], [], wait)

            for worker in readable:
                messages = worker.read_messages()
                if messages is None:
                    if not worker.ready:
                        self._start_failed(worker, "exited during start-up")
                        continue
                    requeue(worker)
                    if worker.inflight:
                        item = worker.inflight[0][0]
                        if item in crashed:
                            results[item] = Verdict(0.0, "error: worker crashed")
                            logger.warning(
                                "math_reward: worker crashed twice on one answer (counted 0.0)"
                            )
                        else:
                            crashed.add(item)
                            queue.appendleft(item)
                    self._retire(worker)
                    continue
                for message in messages:
                    if "ready" in message:
                        worker.ready = True
                        self.start_failures = 0
                    elif worker.inflight and message.get("i") == worker.inflight[0][1]:
                        item, _ = worker.inflight.popleft()
                        results[item] = Verdict(
                            1.0 if message.get("s") == 1 else 0.0, str(message.get("r", ""))
                        )
                        worker.head_started = time.monotonic()

            now = time.monotonic()
            for worker in list(self.workers):
                if worker.inflight and now >= worker.head_started + timeout_s:
                    item = worker.inflight[0][0]
                    results[item] = Verdict(0.0, f"timeout after {timeout_s:g}s (worker killed)")
                    requeue(worker)
                    self._retire(worker)
                elif not worker.ready and now >= worker.started + STARTUP_TIMEOUT_S:
                    self._start_failed(worker, f"not ready after {STARTUP_TIMEOUT_S:g}s")
        return [r if r is not None else Verdict(0.0, "error: no result") for r in results]


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
