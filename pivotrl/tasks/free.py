"""Free choices: filler words in a worked solution's think block, on which no outcome depends.

With the task option ``free`` (a level, 0 = off) ``countdown`` and ``countdown_search`` put a
*slot* of filler words before every step of their worked solutions: at the start of the
think block and after every step separator (``;`` in countdown; ``,`` and the newline
that starts a new attempt in countdown_search)::

    <think>Maybe so: 5*3=15; Indeed then well okay: 15+7=22</think><answer>5*3+7</answer>

A slot holds 1 to ``free`` words (uniform), each drawn uniformly from the 16
:data:`FILLER_WORDS`, lower-case or capitalised with equal odds, joined by spaces and
closed by ``": "``; after ``;`` or ``,`` a space comes first. The choices and the
character each is written with:

- the word and its case: the word's first character, 32 letters, log 32 nats (the
  words' first letters differ, so the rest of a word follows from it);
- the slot's length: the character after each word, a space (another word) or ``:``
  (the end), log(level) nats a slot in all;

every other filler character (the rest of a word, the space after ``:``, the space
after a separator) follows from what came before. So a token that writes a filler
character never writes a decision of the task, and one that does never writes a filler
choice: after a slot comes the step's first digit or ``</think>``, as without fillers.

Filler characters (:data:`FILLER_CHARACTERS`: the letters without ``x``/``X``, the
space and ``:``) are disjoint from what the trace and answer grammar uses (digits,
``+-*/=()``, ``;``, ``,``, the newline, the `` x`` that gives up an attempt), and every
slot is cut off from a number by a space, so the steps, the trace checks and the answer
read a response with fillers exactly as without them; only the think block has slots,
so only it is read for free characters (:func:`free_characters`).

Fillers are drawn from their own generator (:func:`fork`), so a worked solution with
fillers is the one without them, slots put in (:func:`insert_fillers`).
"""

from __future__ import annotations

import random
import re
import string

from pivotrl.rewards.template import think_bounds

#: The filler vocabulary: 16 words with distinct first letters and no ``x``.
FILLER_WORDS = (
    "also", "clearly", "fine", "good", "hmm", "indeed", "just", "look",
    "maybe", "now", "okay", "perhaps", "right", "so", "then", "well",
)
#: Every form a filler word is written in: lower-case and capitalised.
FILLER_FORMS = FILLER_WORDS + tuple(w.capitalize() for w in FILLER_WORDS)
SLOT_END = ":"
#: The letters a filler may use: all but ``x`` and ``X`` (`` x`` gives up a search attempt).
FILLER_LETTERS = frozenset(string.ascii_letters) - {"x", "X"}
FILLER_CHARACTERS = FILLER_LETTERS | {" ", SLOT_END}
# a run of filler characters; it is filler text when it holds a letter
_RUN = re.compile(r"[a-wyzA-WYZ: ]+")
_LETTER = re.compile(r"[a-wyzA-WYZ]")


def check_level(free: int) -> int:
    """``free`` as a level (the most words a slot holds; 0: no fillers), or ValueError."""
    if isinstance(free, bool) or not isinstance(free, int) or free < 0:
        raise ValueError(f"free is the most filler words a slot holds (0: none), got {free!r}")
    return free


def longest_slot(level: int) -> int:
    """The most characters a slot (with the space after a separator) can take at ``level``."""
    if level <= 0:
        return 0
    longest = max(len(w) for w in FILLER_WORDS)
    return 1 + level * (longest + 1) - 1 + len(SLOT_END) + 1


def filler_slot(rng: random.Random, level: int) -> str:
    """One slot: 1 to ``level`` filler words (uniform), each a uniform form, then ``": "``."""
    count = rng.randint(1, level)
    return " ".join(rng.choice(FILLER_FORMS) for _ in range(count)) + SLOT_END + " "


def insert_fillers(response: str, rng: random.Random, level: int, separators: str) -> str:
    """``response`` with a slot before every step of its think block (``level`` 0: unchanged).

    A slot goes at the start of the think block and after each character of
    ``separators`` in it (a space first, unless the separator is a newline).
    """
    bounds = think_bounds(response)
    if level <= 0 or bounds is None:
        return response
    start, end = bounds
    out = [response[:start], filler_slot(rng, level)]
    for ch in response[start:end]:
        out.append(ch)
        if ch in separators:
            out.append(("" if ch == "\n" else " ") + filler_slot(rng, level))
    out.append(response[end:])
    return "".join(out)


def free_characters(text: str) -> list[bool]:
    """For each character of ``text``, whether it is filler text: in the think block (also when
    not closed), in a run of :data:`FILLER_CHARACTERS` that holds a letter.

    For a worked solution these are exactly the characters :func:`insert_fillers` put in.
    """
    marks = [False] * len(text)
    bounds = think_bounds(text)
    if bounds is None:
        return marks
    for run in _RUN.finditer(text, *bounds):
        if _LETTER.search(run.group()):
            marks[run.start() : run.end()] = [True] * (run.end() - run.start())
    return marks


def fork(rng: random.Random, label: str = "free") -> random.Random:
    """A new generator seeded by ``rng``'s current state and ``label``; ``rng`` is not advanced."""
    return random.Random(f"{label}:{rng.getstate()}")
