"""Synthetic tasks: countdown, arithmetic, linear.

Each generator is a pure function of its options and seeds, and every
problem has an identity (its canonical key: for countdown the sorted numbers
and the target). A problem is *held out* when a hash of that key falls below
``heldout_fraction``; the test split draws only held-out problems and the
train split only the others, so no test problem can appear in training,
whatever the seeds or sizes.

Each problem carries a worked solution in the canonical layout
``<think>STEPS</think><answer>ANSWER</answer>`` (STEPS: equations separated by
``;``), and :meth:`SyntheticTask.worked_solution` can make it deliberately
imperfect (a wrong step, or a wrong final answer) for supervised warm-up data
that does not make the policy perfect.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pivotrl.tasks import marks
from pivotrl.tasks.base import (
    Problem,
    ProblemList,
    Task,
    layout,
    lazy_verifier,
    register_task,
    stable_fraction,
)
from pivotrl.tasks.free import check_level, fork, insert_fillers, longest_slot

FLAWS = ("wrong_step", "wrong_answer")

_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


def _apply(a: int, op: str, b: int) -> int | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0 or a % b:
            return None
        return a // b
    raise ValueError(f"unknown operator {op!r}")


@dataclass(frozen=True)
class Program:
    """An expression as a sequence of binary steps over value slots.

    Slots ``0..len(leaves)-1`` hold the leaves; step ``k`` combines two earlier
    slots and writes slot ``len(leaves)+k``. The last slot is the result.
    """

    leaves: tuple[int, ...]
    steps: tuple[tuple[int, str, int], ...]

    def values(self, perturb: dict[int, int] | None = None) -> list[int] | None:
        """Every slot's value; ``perturb[k]`` is added to step k's result
        (and propagates). None when a division is not exact."""
        vals = list(self.leaves)
        for k, (i, op, j) in enumerate(self.steps):
            v = _apply(vals[i], op, vals[j])
            if v is None:
                return None
            vals.append(v + (perturb or {}).get(k, 0))
        return vals

    @property
    def value(self) -> int:
        vals = self.values()
        assert vals is not None
        return vals[-1]

    def equations(self, vals: Sequence[int]) -> list[str]:
        """``a op b=r`` for each step, with the values ``vals`` (maybe perturbed)."""
        n = len(self.leaves)
        return [f"{vals[i]}{op}{vals[j]}={vals[n + k]}" for k, (i, op, j) in enumerate(self.steps)]

    def text(self) -> str:
        """The expression with the fewest parentheses that keep its meaning."""
        n = len(self.leaves)
        texts: list[tuple[str, int]] = [(str(v), 3) for v in self.leaves]
        for i, op, j in self.steps:
            (lt, lp), (rt, rp) = texts[i], texts[j]
            p = _PREC[op]
            if lp < p:
                lt = f"({lt})"
            if rp < p or (rp == p and op in "-/"):
                rt = f"({rt})"
            texts.append((f"{lt}{op}{rt}", p))
        return texts[n + len(self.steps) - 1][0] if self.steps else texts[-1][0]

    def to_meta(self) -> dict[str, Any]:
        return {"leaves": list(self.leaves), "steps": [list(s) for s in self.steps]}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> Program:
        return cls(
            tuple(meta["leaves"]), tuple((int(i), str(op), int(j)) for i, op, j in meta["steps"])
        )


def random_program(
    rng: random.Random,
    leaves: Sequence[int],
    ops: str,
    *,
    min_value: int | None = 1,
    max_value: int | None = None,
    tries: int = 20,
) -> Program | None:
    """Combine the leaves pairwise in random order with random operators.

    Every intermediate value must be an integer within [min_value, max_value]
    (a bound of None is open). None when no valid combination was found.
    """
    for _ in range(tries):
        vals = list(leaves)
        pool = list(range(len(leaves)))
        steps: list[tuple[int, str, int]] = []
        ok = True
        while len(pool) > 1 and ok:
            a, b = rng.sample(pool, 2)
            for op in rng.sample(ops, len(ops)):
                v = _apply(vals[a], op, vals[b])
                if v is None or (min_value is not None and v < min_value):
                    continue
                if max_value is not None and v > max_value:
                    continue
                break
            else:
                ok = False
                break
            steps.append((a, op, b))
            vals.append(v)
            pool.remove(a)
            pool.remove(b)
            pool.append(len(vals) - 1)
        if ok:
            return Program(tuple(leaves), tuple(steps))
    return None


@dataclass(frozen=True)
class WorkedSolution:
    """A supervised example: the prompt text, the response, and its flaw (None if correct)."""

    prompt: str
    response: str
    flaw: str | None
    problem: Problem


#: How many train problems' worked solutions :meth:`SyntheticTask.response_limit` measures.
LIMIT_SAMPLE = 1000


class SyntheticTask(Task):
    """A generated task with a hash-defined held-out split and worked solutions.

    Options (all tasks): ``seed`` (train split), ``test_seed`` (test split),
    ``train_size``, ``test_size``, ``heldout_fraction`` (the share of the
    problem space reserved for the test split), ``imperfect`` (the share of
    worked solutions :meth:`sft_examples` makes flawed) and ``flaw_weights``
    (relative weights of ``"wrong_step"`` and ``"wrong_answer"``).
    """

    key_prefix = "synthetic"
    default_flaw_weights: dict[str, float] = {"wrong_step": 0.5, "wrong_answer": 0.5}

    def __init__(
        self,
        *,
        seed: int = 0,
        test_seed: int = 0,
        train_size: int = 10_000,
        test_size: int = 2_000,
        heldout_fraction: float = 0.1,
        imperfect: float = 0.3,
        flaw_weights: dict[str, float] | None = None,
        **task_options: Any,
    ):
        super().__init__(**task_options)
        if not 0.0 < heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        if not 0.0 <= imperfect <= 1.0:
            raise ValueError(f"imperfect must be in [0, 1], got {imperfect}")
        self.seed = seed
        self.test_seed = test_seed
        self.train_size = int(train_size)
        self.test_size = int(test_size)
        self.heldout_fraction = float(heldout_fraction)
        self.imperfect = float(imperfect)
        self.flaw_weights = dict(flaw_weights or self.default_flaw_weights)
        unknown = set(self.flaw_weights) - set(FLAWS)
        if unknown:
            raise ValueError(f"unknown flaws {sorted(unknown)}; known: {FLAWS}")

    # -- identity and splits --------------------------------------------------
    def key(self, problem: Problem) -> str:
        """The canonical identity of a problem (what the split hash is taken of)."""
        return problem.meta["key"]

    def is_heldout(self, problem: Problem) -> bool:
        """Whether ``problem`` belongs to the held-out (test) part of the problem space."""
        return stable_fraction(self.key(problem)) < self.heldout_fraction

    def _load(self, split: str) -> ProblemList:
        return self._generate_split(split)

    def _load_first(self, split: str, n: int) -> ProblemList | None:
        if type(self)._load is not SyntheticTask._load:  # a subclass builds its splits its own way
            return None
        return self._generate_split(split, n)

    def _generate_split(self, split: str, limit: int | None = None) -> ProblemList:
        """The split's problems in their fixed order; with ``limit``, only the first ``limit`` are
        generated (the same as the whole split's first ones: each is drawn after the ones before)."""
        size, seed = (
            (self.train_size, self.seed) if split == "train" else (self.test_size, self.test_seed)
        )
        want_heldout = split == "test"
        rng = random.Random(f"{self.key_prefix}:{split}:{seed}")
        seen: set[str] = set()
        out: list[Problem] = []
        budget = max(1000, 50 * size)
        misses = 0
        wanted = size if limit is None else min(size, limit)
        while len(out) < wanted:
            problem = self.generate(rng)
            if problem is None or self.is_heldout(problem) != want_heldout:
                continue
            k = self.key(problem)
            if k in seen:
                misses += 1
                if misses > budget:
                    raise ValueError(
                        f"{self.key_prefix}: found only {len(out)} distinct {split} problems of "
                        f"{size} asked for; ask for fewer or widen the ranges"
                    )
                continue
            seen.add(k)
            out.append(problem)
        return ProblemList(out, source=f"{self.key_prefix}(seed={seed}, split={split})")

    # -- generation (subclasses) ----------------------------------------------
    def generate(self, rng: random.Random) -> Problem | None:  # pragma: no cover - abstract
        """One random problem (of either split), or None to draw again."""
        raise NotImplementedError

    def _flawed(
        self, problem: Problem, flaw: str, rng: random.Random
    ) -> str | None:  # pragma: no cover
        raise NotImplementedError

    # -- worked solutions -----------------------------------------------------
    def solution(self, problem: Problem) -> str:
        """The correct worked solution, ``<think>...</think><answer>...</answer>``."""
        return problem.meta["solution"]

    def worked_solution(
        self, problem: Problem, flaw: str | None = None, rng: random.Random | None = None
    ) -> str:
        """The worked solution, correct (``flaw=None``) or with the given flaw.

        ``"wrong_step"``: one equation's result is wrong (and the error carries
        on); ``"wrong_answer"``: the final answer is wrong. The flaw is drawn
        with ``rng`` (default: seeded by the problem's key).
        """
        if flaw is None:
            return self.solution(problem)
        if flaw not in FLAWS:
            raise ValueError(f"unknown flaw {flaw!r}; known: {FLAWS}")
        rng = rng or random.Random(f"flaw:{flaw}:{self.key(problem)}")
        text = self._flawed(problem, flaw, rng)
        if text is None:  # that flaw is impossible here: use the other one
            other = FLAWS[1 - FLAWS.index(flaw)]
            text = self._flawed(problem, other, rng)
        return text if text is not None else self.solution(problem)

    def draw_flaw(self, rng: random.Random, imperfect: float | None = None) -> str | None:
        """None (a correct trace) or a flaw name, with probability ``imperfect``."""
        p = self.imperfect if imperfect is None else imperfect
        if rng.random() >= p:
            return None
        names = [f for f in FLAWS if self.flaw_weights.get(f, 0) > 0]
        return rng.choices(names, weights=[self.flaw_weights[f] for f in names])[0]

    def response_limit(self, tokenizer: Any = None) -> int:
        """The longest response a model with ``tokenizer`` gets unless told otherwise.

        :attr:`max_new_tokens` is stated for pivotrl's character tokenizer (the shipped policies were
        trained and measured with it), and is the answer for it and when no tokenizer is given. In any
        other tokenizer, where the layout tags and numbers take more pieces, it is twice the longest
        correct worked solution (``<eos>`` included) of the first :data:`LIMIT_SAMPLE` train problems,
        and never less than :attr:`max_new_tokens`: on SmolLM2-135M, 78 for countdown (its longest
        solution is 39 pieces, 35 characters) and 48 for add_sub.
        """
        from pivotrl.modeling.tokenizer import is_char_tokenizer

        if tokenizer is None or is_char_tokenizer(tokenizer):
            return self.max_new_tokens
        texts = [self.solution(p) for p in self.problems("train", limit=LIMIT_SAMPLE)]
        longest = max(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]) + 1
        return max(self.max_new_tokens, 2 * longest)

    def sft_examples(
        self,
        n: int | None = None,
        *,
        seed: int = 0,
        imperfect: float | None = None,
        split: str = "train",
    ) -> list[WorkedSolution]:
        """``n`` supervised examples (default: one per problem of ``split``).

        Problems are taken in a seeded shuffled order (cycling if ``n`` is
        larger than the split); a share ``imperfect`` of the responses is flawed.
        """
        rng = random.Random(f"sft:{self.key_prefix}:{seed}")
        pool = self.problems(split)
        n = len(pool) if n is None else n
        out: list[WorkedSolution] = []
        order: list[Problem] = []
        while len(out) < n:
            if not order:
                order = list(pool)
                rng.shuffle(order)
            problem = order.pop()
            flaw = self.draw_flaw(rng, imperfect)
            response = self.worked_solution(problem, flaw, rng)
            out.append(WorkedSolution(self.format_prompt(problem), response, flaw, problem))
        return out


def _parse_range(value: Sequence[int] | int, name: str) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    lo, hi = (int(v) for v in value)
    if lo > hi:
        raise ValueError(f"{name}: empty range {value}")
    return lo, hi


def countdown_prompt(numbers: Sequence[int], target: int) -> str:
    """The question of a countdown problem (also ``countdown_search``'s)."""
    return f"Use {' '.join(map(str, numbers))} to make {target}."


def countdown_key(numbers: Sequence[int], target: int) -> str:
    """A countdown problem's identity, numbers sorted: shared by ``countdown_search``, so the
    two tasks hold out the same problems."""
    return f"countdown:{','.join(map(str, sorted(numbers)))}:{target}"


@register_task("countdown")
class CountdownTask(SyntheticTask):
    """Make the target from the numbers with + - * / (each number at most once).

    Options: ``num_numbers`` (3, or a range like ``(3, 4)``), ``number_range``
    (default ``(1, 30)``), ``target_range`` (default ``(1, 100)``), ``ops``
    (default ``"+-*/"``), ``exact_use`` (the verifier requires every number used
    exactly once), ``free`` (the level of filler words in the worked solutions, 0 = none:
    :mod:`pivotrl.tasks.free`). Every problem is solvable: its target is the value of a
    random expression over its numbers, with positive integer intermediates.

    Prompt ``Use 3 5 7 to make 22.``; answer ``{"numbers": [3, 5, 7], "target": 22}``;
    worked solution ``<think>5*3=15;15+7=22</think><answer>5*3+7</answer>``, with ``free``
    ``<think>Well so: 5*3=15; Indeed: 15+7=22</think><answer>5*3+7</answer>`` (the
    problems, prompts and everything but the slots of filler words are the same).
    """

    name = key_prefix = "countdown"
    default_flaw_weights = {"wrong_step": 1 / 3, "wrong_answer": 2 / 3}
    free_separators = ";"  # a slot of fillers goes after each (and at the think block's start)
    instruction = (
        "Combine the numbers with + - * / and parentheses, each number at most once, to make "
        "the target. Think step by step inside <think> </think>, then give the expression "
        "inside <answer> </answer>."
    )

    def __init__(
        self,
        *,
        num_numbers: int | Sequence[int] = 3,
        number_range: Sequence[int] = (1, 30),
        target_range: Sequence[int] = (1, 100),
        ops: str = "+-*/",
        exact_use: bool = False,
        free: int = 0,
        **options: Any,
    ):
        super().__init__(**options)
        self.free = check_level(free)
        self.num_numbers = _parse_range(num_numbers, "num_numbers")
        if self.num_numbers[0] < 2:
            raise ValueError("countdown needs at least 2 numbers")
        self.number_range = _parse_range(number_range, "number_range")
        self.target_range = _parse_range(target_range, "target_range")
        if not ops or set(ops) - set(_PREC):
            raise ValueError(f"ops must be a non-empty subset of '+-*/', got {ops!r}")
        self.ops = ops
        self.exact_use = exact_use
        self.verifier = lazy_verifier("pivotrl.rewards", "countdown_reward", exact_use=exact_use)
        if self.free and "max_new_tokens" not in vars(type(self)):  # countdown_free sets its own
            # room for the longest slot before each of the steps (one fewer than the numbers)
            self.max_new_tokens = self.max_new_tokens + (self.num_numbers[1] - 1) * longest_slot(self.free)

    def generate(self, rng: random.Random) -> Problem | None:
        k = rng.randint(*self.num_numbers)
        numbers = [rng.randint(*self.number_range) for _ in range(k)]
        program = random_program(rng, numbers, self.ops, min_value=1)
        if program is None:
            return None
        target = program.value
        if not self.target_range[0] <= target <= self.target_range[1]:
            return None
        return self.make_problem(numbers, program)

    def make_problem(self, numbers: Sequence[int], program: Program) -> Problem:
        target = program.value
        vals = program.values()
        assert vals is not None
        return Problem(
            prompt=countdown_prompt(numbers, target),
            answer={"numbers": list(numbers), "target": target},
            meta={
                "key": countdown_key(numbers, target),
                "expression": program.text(),
                "solution": layout(program.equations(vals), program.text()),
                "program": program.to_meta(),
            },
        )

    # -- worked solutions with free choices ------------------------------------------
    def solution(self, problem: Problem) -> str:
        """The correct worked solution; with ``free``, slots of fillers drawn from the problem's key."""
        text = super().solution(problem)
        if not self.free:
            return text
        return insert_fillers(text, random.Random(f"free:{self.key(problem)}"), self.free, self.free_separators)

    def _flawed(self, problem: Problem, flaw: str, rng: random.Random) -> str | None:
        fillers = fork(rng) if self.free else None
        text = self._flawed_trace(problem, flaw, rng)
        if text is None or fillers is None:
            return text
        return insert_fillers(text, fillers, self.free, self.free_separators)

    @property
    def marks(self) -> tuple[str, ...]:
        """``("reachable",)``, and ``"free"`` with the option ``free``: see :meth:`token_marks`."""
        return ("free", "reachable") if self.free else ("reachable",)

    def token_marks(self, pieces: list[str], problem: Problem) -> dict[str, list[bool]]:
        """Marks of each token of a response (any text: a worked solution, a policy's sample,
        one cut off or malformed), its tokens decoding to ``pieces``.

        ``"free"`` (only with the option ``free``): the token writes filler characters and
        nothing else: in the think block (from ``<think>`` to ``</think>``, or to the end when
        not closed), a run of letters other than ``x``/``X``, spaces and ``:`` that holds a
        letter (:func:`pivotrl.tasks.free.free_characters`; in a worked solution, exactly the
        characters of its slots). A token that also writes anything else, or nothing (an
        empty piece), is not free.

        ``"reachable"``: whether the target can still be made from the *state* the token is
        written in, the multiset of numbers the response has left:

        - it starts as the problem's numbers;
        - a step of the think block is what the trace checks read as one
          (:func:`pivotrl.rewards.trace.pool_steps`: ``a op b=r``, or any ``LHS=RHS`` whose sides
          are arithmetic); when it completes, at the last character of its written result,
          the literals of its left side leave the state and the *written* value ``r`` joins
          it, right or wrong (as :func:`~pivotrl.rewards.trace.search_trace_validity` counts);
        - a token is written in the state after every step that completed before its first
          character: all the tokens of a step, the one that ends its result included, share
          the state before the step; the next token has the state after it;
        - a step that uses a number the state does not hold (or holds fewer times), or whose
          sides do not evaluate, makes the state *dead*: unreachable for the rest of the
          think block (countdown_search: of its attempt);
        - text that is not yet a step (a step cut off before its result) changes nothing;
        - tokens before ``<think>`` (or all of them, without one) have the first state;
          tokens after the think block (``</think>``, the answer, ``<eos>``) have the state
          it ended in;
        - a state is reachable when the target is in it or a sequence of legal moves on its
          whole positive numbers writes it (:func:`pivotrl.tasks.moves.can_reach`; countdown:
          ``+ - * /`` with a whole result of at least 1 and no upper bound, the generator's
          rule; a written 0, negative number or fraction stays in the state but combines
          with nothing).
        """
        return marks.token_marks(pieces, problem.answer["numbers"], problem.answer["target"],
                                 max_value=None, attempts=False, free=bool(self.free))

    def _flawed_trace(self, problem: Problem, flaw: str, rng: random.Random) -> str | None:
        program = Program.from_meta(problem.meta["program"])
        target = problem.answer["target"]
        if flaw == "wrong_answer":
            # an honest trace of another expression that misses the target
            for _ in range(30):
                other = random_program(rng, problem.answer["numbers"], self.ops, min_value=1)
                if other is not None and other.value != target:
                    vals = other.values()
                    assert vals is not None
                    return layout(other.equations(vals), other.text())
            return None
        # wrong_step: one result is off (and carried on); the answer is still the right expression
        for _ in range(30):
            k = rng.randrange(len(program.steps))
            delta = rng.choice([-3, -2, -1, 1, 2, 3])
            vals = program.values({k: delta})
            if vals is not None and all(v >= 1 for v in vals):
                return layout(program.equations(vals), program.text())
        return None


@register_task("countdown_free")
class CountdownFreeTask(CountdownTask):
    """``countdown`` (3 numbers) whose worked solutions carry filler words: ``free`` 6 by default.

    Its problems, held-out split and prompts are countdown's (the same problem keys and
    draws: it holds out exactly the problems countdown holds out), and so are its worked
    solutions but for two slots of 1 to 6 filler words each (:mod:`pivotrl.tasks.free`)::

        <think>just Now okay hmm so: 30-13=17; Clearly perhaps: 26+17=43</think><answer>26+30-13</answer>

    A worked solution is about 69 tokens long (``<eos>`` included), 58% of them filler
    characters, and the fillers' choices hold 2 x (log 6 + 3.5 log 32) = 27.8 nats against
    countdown's few decisive ones.
    """

    name = "countdown_free"
    #: The longest worked solution is 134 tokens (countdown's 35, ``<eos>`` included, and two
    #: slots of six 7-letter words, 49 + 50 characters): a margin of 26.
    max_new_tokens = 160

    def __init__(self, *, free: int = 6, **options: Any):
        super().__init__(free=free, **options)


@register_task("arithmetic")
class ArithmeticTask(SyntheticTask):
    """Evaluate a multi-step integer expression.

    Options: ``num_operands`` (default ``(3, 4)``), ``number_range`` (default
    ``(1, 20)``), ``ops`` (default ``"+-*"``; ``/`` is used only where exact),
    ``max_value`` (bound on every intermediate, default 999). Intermediates are
    non-negative.

    Prompt ``Compute 3+4*2-5.``; answer ``6`` (an int); worked solution
    ``<think>4*2=8;3+8=11;11-5=6</think><answer>6</answer>``.
    """

    name = key_prefix = "arithmetic"
    instruction = (
        "Compute the value. Think step by step inside <think> </think>, then give the number "
        "inside <answer> </answer>."
    )

    def __init__(
        self,
        *,
        num_operands: int | Sequence[int] = (3, 4),
        number_range: Sequence[int] = (1, 20),
        ops: str = "+-*",
        max_value: int = 999,
        **options: Any,
    ):
        super().__init__(**options)
        self.num_operands = _parse_range(num_operands, "num_operands")
        if self.num_operands[0] < 2:
            raise ValueError("arithmetic needs at least 2 operands")
        self.number_range = _parse_range(number_range, "number_range")
        if self.number_range[0] < 0:
            raise ValueError("arithmetic number_range must be non-negative")
        if not ops or set(ops) - set(_PREC):
            raise ValueError(f"ops must be a non-empty subset of '+-*/', got {ops!r}")
        self.ops = ops
        self.max_value = max_value
        self.verifier = lazy_verifier("pivotrl.rewards", "arithmetic_reward")

    def generate(self, rng: random.Random) -> Problem | None:
        k = rng.randint(*self.num_operands)
        numbers = [rng.randint(*self.number_range) for _ in range(k)]
        program = random_program(rng, numbers, self.ops, min_value=0, max_value=self.max_value)
        if program is None:
            return None
        vals = program.values()
        assert vals is not None
        expression = program.text()
        return Problem(
            prompt=f"Compute {expression}.",
            answer=program.value,
            meta={
                "key": f"arithmetic:{expression}",
                "expression": expression,
                "solution": layout(program.equations(vals), program.value),
                "program": program.to_meta(),
            },
        )

    def _flawed(self, problem: Problem, flaw: str, rng: random.Random) -> str | None:
        program = Program.from_meta(problem.meta["program"])
        answer = problem.answer
        delta = rng.choice([-3, -2, -1, 1, 2, 3])
        if flaw == "wrong_answer":
            vals = program.values()
            assert vals is not None
            wrong = answer + delta if answer + delta >= 0 else answer - delta
            return layout(program.equations(vals), wrong)
        for _ in range(30):
            k = rng.randrange(len(program.steps))
            vals = program.values({k: rng.choice([-3, -2, -1, 1, 2, 3])})
            if vals is not None and all(v >= 0 for v in vals) and vals[-1] != answer:
                return layout(program.equations(vals), vals[-1])
        return None


@register_task("add_sub")
class AddSubTask(ArithmeticTask):
    """Two-digit addition and subtraction (``Compute 27+76.``; answer ``103``): arithmetic's problems with
    two operands from 10 to 99 and ``+-``, and 1000 held-out problems (the held-out part of this problem
    space holds about 1,200). SmolLM2-135M-Instruct solves few of them as it comes and about half
    after a short warm start on the worked solutions (docs/EXPERIMENTS.md, "A real language model").
    """

    name = "add_sub"
    max_new_tokens = 48

    def __init__(self, *, num_operands: int | Sequence[int] = 2, number_range: Sequence[int] = (10, 99),
                 ops: str = "+-", test_size: int = 1000, **options: Any):
        super().__init__(num_operands=num_operands, number_range=number_range, ops=ops, test_size=test_size,
                         **options)


@register_task("linear")
class LinearTask(SyntheticTask):
    """Solve ``a*x+b=c`` for an integer ``x``.

    Options: ``a_range`` (default ``(2, 12)``), ``b_range`` (default
    ``(-50, 50)``, 0 excluded), ``x_range`` (default ``(-20, 20)``).

    Prompt ``Solve 3*x+5=20.``; answer ``5`` (an int); worked solution
    ``<think>20-5=15;15/3=5</think><answer>5</answer>``.
    """

    name = key_prefix = "linear"
    instruction = (
        "Find x. Think step by step inside <think> </think>, then give the value of x "
        "inside <answer> </answer>."
    )

    def __init__(
        self,
        *,
        a_range: Sequence[int] = (2, 12),
        b_range: Sequence[int] = (-50, 50),
        x_range: Sequence[int] = (-20, 20),
        **options: Any,
    ):
        super().__init__(**options)
        self.a_range = _parse_range(a_range, "a_range")
        self.b_range = _parse_range(b_range, "b_range")
        self.x_range = _parse_range(x_range, "x_range")
        if self.a_range[0] == self.a_range[1] == 0:
            raise ValueError("a_range must allow a non-zero a")
        self.verifier = lazy_verifier("pivotrl.rewards", "arithmetic_reward")

    def generate(self, rng: random.Random) -> Problem | None:
        a, b, x = rng.randint(*self.a_range), rng.randint(*self.b_range), rng.randint(*self.x_range)
        if a == 0 or b == 0:
            return None
        c = a * x + b
        sign = "+" if b > 0 else "-"
        return Problem(
            prompt=f"Solve {a}*x{sign}{abs(b)}={c}.",
            answer=x,
            meta={
                "key": f"linear:{a}:{b}:{c}",
                "coefficients": {"a": a, "b": b, "c": c},
                "solution": layout(self._steps(a, b, c, c - b, x), x),
            },
        )

    @staticmethod
    def _steps(a: int, b: int, c: int, rhs: int, x: int) -> list[str]:
        first = f"{c}-{b}={rhs}" if b > 0 else f"{c}+{-b}={rhs}"
        return [first, f"{rhs}/{a}={x}"]

    def _flawed(self, problem: Problem, flaw: str, rng: random.Random) -> str | None:
        co = problem.meta["coefficients"]
        a, b, c = co["a"], co["b"], co["c"]
        x = problem.answer
        k = rng.choice([-2, -1, 1, 2])
        if flaw == "wrong_answer":
            return layout(self._steps(a, b, c, c - b, x), x + k)
        if rng.random() < 0.5:  # the subtraction slips (by a multiple of a, so x stays whole)
            return layout(self._steps(a, b, c, c - b + a * k, x + k), x + k)
        return layout(self._steps(a, b, c, c - b, x + k), x + k)  # the division slips
