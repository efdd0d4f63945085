"""Ctrl-C during training: the first one stops the run at the end of the current step, the second at once."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class StopRequest:
    """Set by the SIGINT handler; `defer` says whether a first Ctrl-C may wait for the step to end."""

    def __init__(self) -> None:
        self.requested = False
        self.defer = False
        self.notice = "stopping at the end of this step to save a checkpoint (Ctrl-C again to stop at once)"

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested or not self.defer:
            raise KeyboardInterrupt
        self.requested = True
        sys.stderr.write(f"\n{self.notice}\n")
        sys.stderr.flush()


@contextmanager
def sigint_stops_after_step() -> Iterator[StopRequest]:
    """Route SIGINT to a StopRequest while the block runs (main thread only; elsewhere SIGINT is left alone)."""
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = signal.signal(signal.SIGINT, stop.handle)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)
