"""The think/answer layout: ``<think>STEPS</think><answer>ANSWER</answer>``.

This is the one place that knows the tags. Task generators render completions
with :func:`render_completion`; the verifiers read them back with
:func:`extract_think`, :func:`extract_answer` and :func:`split_layout`
(:func:`think_bounds`: where the think block is, also in a response cut off).
Every function here is linear in the text length (``str.find``/``rfind``
only, no regular expressions) and never raises on any text.
"""

from __future__ import annotations

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)


def render_completion(think: str, answer: str) -> str:
    """Return ``think`` and ``answer`` in the canonical layout, no whitespace added."""
    return f"{THINK_OPEN}{think}{THINK_CLOSE}{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


def extract_answer(text: str) -> str | None:
    """Return the stripped content of the last closed ``<answer>...</answer>``, else None."""
    if not isinstance(text, str):
        return None
    end = text.rfind(ANSWER_CLOSE)
    if end < 0:
        return None
    start = text.rfind(ANSWER_OPEN, 0, end)
    if start < 0:
        return None
    return text[start + len(ANSWER_OPEN) : end].strip()


def think_bounds(text: str) -> tuple[int, int] | None:
    """Offsets ``(start, end)`` of what the first ``<think>`` holds, unstripped: up to the next
    ``</think>``, or to the end of ``text`` when it is not closed (a response cut off); None
    without ``<think>``."""
    if not isinstance(text, str):
        return None
    start = text.find(THINK_OPEN)
    if start < 0:
        return None
    body = start + len(THINK_OPEN)
    end = text.find(THINK_CLOSE, body)
    return body, len(text) if end < 0 else end


def extract_think(text: str) -> str | None:
    """Return the stripped content of the first closed ``<think>...</think>``, else None."""
    bounds = think_bounds(text)
    if bounds is None or not text.startswith(THINK_CLOSE, bounds[1]):
        return None
    return text[bounds[0] : bounds[1]].strip()


def split_layout(text: str) -> tuple[str, str] | None:
    """Return ``(think, answer)`` iff ``text`` follows the layout exactly, else None.

    Exactly means: optional whitespace, ``<think>``, anything without tags,
    ``</think>``, optional whitespace, ``<answer>``, a non-empty (after
    stripping) answer without tags, ``</answer>``, optional whitespace; each
    of the four tags occurs exactly once. The think part may be empty.
    """
    if not isinstance(text, str):
        return None
    if any(text.count(tag) != 1 for tag in TAGS):
        return None
    body = text.strip()
    if not (body.startswith(THINK_OPEN) and body.endswith(ANSWER_CLOSE)):
        return None
    think_end = body.find(THINK_CLOSE)
    answer_start = body.find(ANSWER_OPEN)
    if answer_start < think_end:
        return None
    if body[think_end + len(THINK_CLOSE) : answer_start].strip():
        return None
    think = body[len(THINK_OPEN) : think_end]
    answer = body[answer_start + len(ANSWER_OPEN) : len(body) - len(ANSWER_CLOSE)]
    if not answer.strip():
        return None
    return think.strip(), answer.strip()
