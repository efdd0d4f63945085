"""What a task is: problems, reference answers, a verifier and a prompt template.

A task gives, for a split, a list of :class:`Problem` (the question text, the
reference answer the verifier compares against, and free-form metadata); it
scores a completion with ``task.verifier(completion, problem.answer) -> float``;
and it renders a problem into the exact string fed to a model with
``task.format_prompt(problem, tokenizer=None, chat=False)``.

Splits are ``"train"`` and ``"test"``; ``"heldout"``, ``"eval"``,
``"validation"`` (and a few spellings of them) mean ``"test"``.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import inspect
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("pivotrl.tasks")

Verifier = Callable[[str, Any], float]

#: The layout every synthetic worked solution follows (and the instruction asks for).
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

FORMAT_INSTRUCTION = (
    "Think step by step inside <think> </think>, then give the final answer "
    "inside <answer> </answer>."
)

_SPLIT_ALIASES = {
    "train": "train",
    "training": "train",
    "test": "test",
    "heldout": "test",
    "held-out": "test",
    "held_out": "test",
    "eval": "test",
    "evaluation": "test",
    "validation": "test",
    "val": "test",
    "dev": "test",
}


def normalize_split(split: str) -> str:
    """Return ``"train"`` or ``"test"`` for any accepted spelling of a split."""
    try:
        return _SPLIT_ALIASES[split.strip().lower()]
    except (KeyError, AttributeError):
        raise ValueError(
            f"unknown split {split!r}: use 'train' or 'test' (alias 'heldout')"
        ) from None


def layout(steps: Iterable[str], answer: Any) -> str:
    """``<think>s1;s2</think><answer>answer</answer>``: the canonical response."""
    return f"{THINK_OPEN}{';'.join(steps)}{THINK_CLOSE}{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


def stable_fraction(key: str) -> float:
    """A number in [0, 1) fixed by ``key`` alone (SHA-256; no process salt)."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


@dataclass(frozen=True)
class Problem:
    """One problem: the question text, its reference answer, and metadata.

    ``prompt`` is the bare question; :meth:`Task.format_prompt` turns it into
    what the model sees. ``answer`` is whatever the task's verifier takes
    (a string for math, an int for arithmetic, ``{"numbers", "target"}`` for
    countdown). ``meta`` holds the rest (a source row id, a worked solution...).
    """

    prompt: str
    answer: Any
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


class ProblemList(list):
    """A list of problems that also says where they came from.

    ``skipped`` counts the rows of the source that could not be used (a missing
    field, an empty answer); ``source`` names the file, dataset or generator.
    """

    def __init__(self, problems: Iterable[Problem] = (), *, source: str = "", skipped: int = 0):
        super().__init__(problems)
        self.source = source
        self.skipped = skipped


def lazy_verifier(module: str, name: str, **kwargs: Any) -> Verifier:
    """A verifier that imports ``module.name`` only when first called.

    Lets a task be built (and its problems listed) without importing the
    reward code; the keyword options are passed on every call.
    """

    def verify(completion: str, answer: Any) -> float:
        fn = getattr(importlib.import_module(module), name)
        return float(fn(completion, answer, **kwargs))

    verify.__name__ = f"{name}"
    verify.__qualname__ = f"{module}.{name}"
    return verify


class Task:
    """Base class of every task; subclasses implement :meth:`_load`.

    Attributes:
        name: the registry name.
        verifier: ``fn(completion, answer) -> float`` in [0, 1].
        template: the plain prompt template, a ``str.format`` string with the
            fields ``{prompt}`` (the problem text) and ``{instruction}``.
        user_template: the user message of the chat form, same fields.
        instruction: the sentence that says what layout to answer in.
        system_prompt: optional system message of the chat form.
        max_new_tokens: the longest response a held-out evaluation allows by default, in pivotrl's
            character tokenizer (:meth:`response_limit` gives it for any tokenizer).
    """

    name: str = "task"
    #: The longest response a held-out evaluation allows unless told otherwise (``pivotrl eval``,
    #: ``pivotrl pretrain``'s measurement): the length the task's policies are trained with.
    max_new_tokens: int = 34
    template: str = "{prompt}\n"
    user_template: str = "{prompt}\n{instruction}"
    instruction: str = FORMAT_INSTRUCTION
    system_prompt: str | None = None

    def __init__(
        self,
        *,
        verifier: Verifier | None = None,
        template: str | None = None,
        user_template: str | None = None,
        instruction: str | None = None,
        system_prompt: str | None = None,
    ):
        if verifier is not None:
            self.verifier = verifier
        if template is not None:
            self.template = template
        if user_template is not None:
            self.user_template = user_template
        if instruction is not None:
            self.instruction = instruction
        if system_prompt is not None:
            self.system_prompt = system_prompt
        self._cache: dict[str, ProblemList] = {}

    # -- problems ----------------------------------------------------------
    def problems(self, split: str = "train", limit: int | None = None) -> ProblemList:
        """The problems of ``split`` (``"train"`` or ``"test"``/``"heldout"``); with ``limit``, its first ``limit``.

        ``problems(split, limit=n)`` equals ``problems(split)[:n]``, but a task that can
        (the synthetic ones) builds only those n, not the whole split: what a command
        that looks at a few problems (``eval -n 8``) asks for. The whole split is built
        once and cached; the list returned is a copy, so a caller may shuffle it.
        """
        key = normalize_split(split)
        if limit is not None:
            if limit < 0:
                raise ValueError(f"limit must be >= 0 problems, got {limit}")
            if key not in self._cache:
                first = self._load_first(key, limit)
                if first is not None:
                    return first
        if key not in self._cache:
            self._cache[key] = self._load(key)
        cached = self._cache[key]
        return ProblemList(cached[:limit], source=cached.source, skipped=cached.skipped)

    def _load(self, split: str) -> ProblemList:  # pragma: no cover - abstract
        raise NotImplementedError

    def _load_first(self, split: str, n: int) -> ProblemList | None:
        """The first ``n`` problems of ``split``, built without the rest; None when the task
        cannot (then :meth:`problems` builds and caches the whole split)."""
        return None

    # -- scoring -----------------------------------------------------------
    def verifier(self, completion: str, answer: Any) -> float:  # pragma: no cover
        raise NotImplementedError(f"task {self.name!r} has no verifier")

    def score(self, completion: str, problem: Problem) -> float:
        """``verifier(completion, problem.answer)``."""
        return float(self.verifier(completion, problem.answer))

    def response_limit(self, tokenizer: Any = None) -> int:
        """The longest response a model with ``tokenizer`` gets unless told otherwise: :attr:`max_new_tokens`
        (a task that writes worked solutions derives a longer one for tokenizers other than pivotrl's
        character tokenizer: :meth:`SyntheticTask.response_limit`)."""
        return self.max_new_tokens

    def trace_validity(self, completion: str, problem: Problem) -> float | None:
        """The share of true arithmetic steps in the think part (None: no step).

        :func:`pivotrl.rewards.trace_validity` unless the task knows more about
        its steps (``countdown_search`` also checks the numbers each step uses).
        """
        from pivotrl.rewards.trace import trace_validity

        return trace_validity(completion)

    def response_stats(self, completion: str) -> dict[str, float]:
        """Task-specific counts of a response (``countdown_search``: ``{"attempts": n}``).

        Evaluation reports the mean of each as ``mean_<name>``; none by default.
        """
        return {}

    @property
    def marks(self) -> tuple[str, ...]:
        """The marks :meth:`token_marks` gives of any response of this task: ``"free"`` (free choices,
        which cannot change the outcome) and ``"reachable"`` (the target can still be reached); none by default."""
        return ()

    def token_marks(self, pieces: list[str], problem: Problem) -> dict[str, list[bool]]:
        """Per-token marks of one response whose tokens decode to ``pieces`` (in order; their
        concatenation is the response text). A task returns the marks it knows, each a list
        of ``len(pieces)`` booleans:
        ``"free"``: the token is an outcome-irrelevant choice (only when the task has free choices);
        ``"reachable"``: the target can still be reached from the state the token is written in.

        None by default; ``countdown`` and ``countdown_search`` give both (``"free"`` with
        their option ``free`` on) and say their rules.
        """
        return {}

    # -- prompts -----------------------------------------------------------
    def format_prompt(self, problem: Problem, tokenizer: Any = None, chat: bool = False) -> str:
        """The text given to the model for ``problem``.

        ``chat=False``: ``template`` filled in (no tokenizer needed).
        ``chat=True``: the user message (``user_template`` filled in, after
        ``system_prompt`` if set) rendered by ``tokenizer.apply_chat_template``
        with the generation prompt added.
        """
        fields = {"prompt": problem.prompt, "instruction": self.instruction}
        if not chat:
            return self.template.format(**fields)
        if tokenizer is None:
            raise ValueError(
                "format_prompt(chat=True) needs the tokenizer whose chat template to use"
            )
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__!s} "
                "has no chat template; use chat=False (plain prompts)"
            )
        return tokenizer.apply_chat_template(self.messages(problem), tokenize=False, add_generation_prompt=True)

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        """The chat form of ``problem``: ``system_prompt`` (if set), then the user message."""
        fields = {"prompt": problem.prompt, "instruction": self.instruction}
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": self.user_template.format(**fields)}]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


# -- registry ---------------------------------------------------------------


def _keyword_options(factory: Callable[..., Task]) -> tuple[set[str], set[str]] | None:
    """(accepted, required) keyword options of a factory, following ``**options`` up the
    classes' ``__init__`` chain; None when the set cannot be known (a ``**`` that goes nowhere known).

    Only the factory's own signature says what is required (a subclass may fill in its parents')."""
    inits = [c.__init__ for c in factory.__mro__ if "__init__" in vars(c)] if isinstance(factory, type) else [factory]
    accepted: set[str] = set()
    required: set[str] = set()
    for init in inits:
        try:
            params = list(inspect.signature(init).parameters.values())
        except (TypeError, ValueError):
            return None
        open_ended = False
        for p in params:
            if p.name == "self" or p.kind is p.VAR_POSITIONAL:
                continue
            if p.kind is p.VAR_KEYWORD:
                open_ended = True
                continue
            accepted.add(p.name)
            if p.default is p.empty and init is inits[0]:
                required.add(p.name)
        if not open_ended:
            return accepted, required
        if init is object.__init__:
            break
    return None


def _check_options(name: str, factory: Callable[..., Task], options: dict[str, Any]) -> None:
    """ValueError naming the options a task does not take (e.g. left over from another task) or lacks."""
    known = _keyword_options(factory)
    if known is None:
        return
    accepted, required = known
    unknown = sorted(set(options) - accepted)
    if unknown:
        listed = ", ".join(repr(k) for k in unknown)
        near = [m for k in unknown for m in difflib.get_close_matches(str(k), sorted(accepted), n=1, cutoff=0.6)]
        why = f"did you mean {', '.join(repr(m) for m in near)}?" if near else "left over from another task?"
        raise ValueError(f"task {name!r} does not take the option(s) {listed} ({why}); "
                         f"its options: {', '.join(sorted(accepted))}")
    missing = sorted(required - set(options))
    if missing:
        raise ValueError(f"task {name!r} needs the option(s) {', '.join(repr(k) for k in missing)}")


#: Registered task names -> factory (a Task subclass or any callable returning a Task).
TASKS: dict[str, Callable[..., Task]] = {}


def register_task(name: str) -> Callable[[Callable[..., Task]], Callable[..., Task]]:
    """Decorator: make ``get_task(name, **options)`` call the decorated factory."""

    def decorate(factory: Callable[..., Task]) -> Callable[..., Task]:
        if name in TASKS and TASKS[name] is not factory:
            raise ValueError(f"task {name!r} is already registered")
        TASKS[name] = factory
        return factory

    return decorate


def check_task(name: str, options: dict[str, Any]) -> Callable[..., Task]:
    """The factory of task `name`, after checking (without building anything) that it exists and
    takes `options`: KeyError for an unknown task, ValueError for unknown or missing options."""
    try:
        factory = TASKS[name]
    except KeyError:
        known = ", ".join(sorted(TASKS))
        near = difflib.get_close_matches(str(name), sorted(TASKS), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise KeyError(f"unknown task {name!r}{hint}; known tasks: {known}") from None
    _check_options(name, factory, options)
    return factory


def get_task(name: str, **options: Any) -> Task:
    """Build the task registered as ``name`` with its options.

    >>> get_task("countdown", num_numbers=3, test_size=500)  # doctest: +SKIP
    """
    factory = check_task(name, options)
    task = factory(**options)
    task.name = name
    return task
