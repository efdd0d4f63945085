"""transformers' progress bars kept out of pivotrl's output."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quiet_loading() -> Iterator[None]:
    """Silence transformers' progress bars for the block: "Loading weights" (from_pretrained) and
    "Writing model shards" (save_pretrained). Its previous setting is restored after."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
