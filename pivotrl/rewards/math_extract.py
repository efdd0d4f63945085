r"""Find the final answer of a math completion, in linear time.

The final answer is, in this order of preference:

1. the content of the last ``\boxed{...}`` or ``\fbox{...}`` (braces
   balanced, ``\{`` and ``\}`` are literal braces); when the last box is not
   closed (a truncated completion) there is no answer at all;
2. the content of the last closed ``<answer>...</answer>`` block (the
   think/answer layout), itself reduced by rule 4 if it reads
   ``The answer is X``;
3. the rest of the line after the last ``####`` (GSM8K's convention);
4. the rest of the line after the last ``answer is`` / ``answer:``
   (case-insensitive, ``final answer is``, ``Answer: X`` ...).

Rule 2 comes before 3 and 4, not after: an explicit answer block beats a
phrase in the reasoning before it. The answer is then cleaned (NUL bytes
dropped, enclosing ``$``/``\(...\)``/``**``, a final full stop and anything
after a sentence break such as ``. I hope it is correct`` removed from a
phrase's line)
and bounded: longer than :data:`MAX_ANSWER_CHARS` means no answer. Only this
short string ever reaches the math parser.

Everything here is ``str.find``/``rfind``, one forward scan for braces, and
regular expressions without nested quantifiers.
"""

from __future__ import annotations

import re

from pivotrl.rewards.template import extract_answer

MAX_ANSWER_CHARS = 1000

# A box command, up to 64 blanks, its opening brace ("\boxedx" is no box).
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)[ \t\n]{0,64}\{")
_ANSWER_PHRASE = re.compile(
    r"\banswer\b(?:\*\*)?[ \t]*(?:is\b[ \t]*:?|:)(?:[ \t]*\*\*(?=[ \t]))?", re.IGNORECASE
)
_HASHES = "####"
_SENTENCE_END = re.compile(r"\.\s+[A-Z]")
_WRAPPERS = (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("**", "**"))
# How far a box's content is scanned (beyond it, the answer is too long).
_MAX_BOX_CONTENT = 4 * MAX_ANSWER_CHARS


def _last_box(text: str) -> tuple[bool, str | None]:
    """Return (found, content) for the last box command; content None if unclosed or too long."""
    last = None
    for match in _BOX_OPEN.finditer(text):
        last = match
    if last is None:
        return False, None
    return True, _braced(text, last.end() - 1)


def _braced(text: str, open_brace: int) -> str | None:
    """Return the content of the group opening at ``open_brace``, or None if unclosed or too long."""
    depth = 0
    index = open_brace
    stop = min(len(text), open_brace + 2 + _MAX_BOX_CONTENT)
    while index < stop:
        char = text[index]
        if char == "\\":
            index += 2  # \{ and \} are literal braces; skip any escaped char.
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[open_brace + 1 : index]
        index += 1
    return None


def _rest_of_line(text: str, start: int) -> str:
    end = text.find("\n", start)
    return text[start : end if end >= 0 else len(text)]


def _after_phrase(text: str) -> str | None:
    last = None
    for match in _ANSWER_PHRASE.finditer(text):
        last = match
    if last is None:
        return None
    return _rest_of_line(text, last.end())


def _after_hashes(text: str) -> str | None:
    position = text.rfind(_HASHES)
    if position < 0:
        return None
    return _rest_of_line(text, position + len(_HASHES))


def clean_answer(answer: str, *, prose: bool = False) -> str | None:
    """Strip wrappers from an extracted answer; None if it is empty or too long."""
    if len(answer) > _MAX_BOX_CONTENT:
        return None
    text = answer.replace("\x00", "").strip()
    if prose:
        sentence_end = _SENTENCE_END.search(text)
        if sentence_end is not None:
            text = text[: sentence_end.start()]  # "42. I hope it is correct." -> "42"
    changed = True
    while changed and text:
        changed = False
        for opening, closing in _WRAPPERS:
            if (
                len(text) >= len(opening) + len(closing)
                and text.startswith(opening)
                and text.endswith(closing)
            ):
                text = text[len(opening) : len(text) - len(closing)].strip()
                changed = True
        if text.endswith("."):
            text = text[:-1].rstrip()
            changed = True
    if not text or len(text) > MAX_ANSWER_CHARS:
        return None
    return text


def extract_math_answer(text: str) -> str | None:
    """Return the cleaned final answer of a math completion (see the module docstring), else None."""
    if not isinstance(text, str):
        return None
    found, boxed = _last_box(text)
    if found:
        return clean_answer(boxed) if boxed is not None else None
    block = extract_answer(text)
    if block is not None:
        phrase = _after_phrase(block)
        if phrase is not None and phrase.strip():
            return clean_answer(phrase, prose=True)
        return clean_answer(block)
    for candidate in (_after_hashes(text), _after_phrase(text)):
        if candidate is not None and candidate.strip():
            return clean_answer(candidate, prose=True)
    return None
