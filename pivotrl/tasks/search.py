"""``countdown_search``: countdown answered by a written search.

The problem is countdown's (``Use 8 3 5 2 to make 26.``, four numbers by
default, every problem solvable), but the worked solution is a search: each
attempt combines the numbers step by step until the latest result is the
target; an attempt that ends elsewhere is given up with `` x`` and the next
one starts on a new line. The answer is the expression of the last attempt::

    <think>8+3=11,11*2=22,22+5=27 x
    8*3=24,24+2=26</think><answer>8*3+2</answer>

A step writes its larger operand first (``13-7``, never ``7-13``), and only
moves whose results are whole numbers in ``[1, max_value]`` are made (no
``*1`` or ``/1``). The layout (``,`` between steps, a line per attempt, the
`` x`` marker) is defined in :mod:`pivotrl.rewards.trace`, which also checks
every step of every attempt (:func:`~pivotrl.rewards.trace.search_trace_validity`).

The worked solutions are drawn from a guided random search, so the first
choice is genuinely uncertain: at each step the searcher takes, with
probability ``guide`` (first step, middle steps, last step), a move from
which the target can still be reached, and otherwise any legal move. With
the default ``(0.3, 0.5, 0.9)`` a good first move is taken 30% of the time
(plus the random moves that happen to be good), the last step is nearly
always seen, and the worked searches make about 3 attempts on average.
A correct search succeeds within ``max_attempts``; the
two flaws of :meth:`worked_solution` are ``"wrong_step"`` (arithmetic slips:
a result off by 1 to 3, carried on, so the search may recover, give up or
"hit" the target with a wrong expression) and ``"wrong_answer"`` (every
attempt fails and the searcher answers with the last one).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pivotrl.rewards.countdown import countdown_reward
from pivotrl.rewards.trace import (
    ABANDON_MARKER,
    ATTEMPT_SEPARATOR,
    STEP_SEPARATOR,
    search_attempts,
    search_trace_validity,
)
from pivotrl.tasks import marks
from pivotrl.tasks.base import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    Problem,
    ProblemList,
    lazy_verifier,
    register_task,
)
from pivotrl.tasks.free import check_level, fork, insert_fillers, longest_slot
from pivotrl.tasks.moves import legal_moves, reachable, winning_moves
from pivotrl.tasks.synthetic import (
    FLAWS,
    Program,
    SyntheticTask,
    _parse_range,
    countdown_key,
    countdown_prompt,
)


@dataclass(frozen=True)
class Attempt:
    """One attempt: its written steps, the expression it built, and how it ended."""

    steps: tuple[str, ...]
    expression: str
    hit: bool  # the last written result is the target (maybe through a slip)
    slips: int

    def line(self) -> str:
        text = STEP_SEPARATOR.join(self.steps)
        return text if self.hit else f"{text} {ABANDON_MARKER}"


@dataclass(frozen=True)
class SearchTrace:
    """A worked search: the response text and what it contains."""

    text: str
    attempts: int
    slips: int
    solved: bool  # the answer expression really makes the target


@register_task("countdown_search")
class CountdownSearchTask(SyntheticTask):
    """Countdown whose worked solutions search: attempts that fail, then one that hits.

    Options: ``num_numbers`` (default 4; 3 to 5, or a range), ``number_range``
    (default ``(1, 10)``), ``target_range`` (default ``(10, 50)``; the target
    is drawn uniformly, and a draw that cannot be made, or equals one of the
    numbers, is drawn again), ``max_value`` (largest intermediate result a
    worked step writes, default 100), ``max_attempts`` (default 6), ``guide``
    (the probabilities of a winning move at the first, middle and last step,
    default ``(0.3, 0.5, 0.9)``), ``slip_rate`` (per step, in ``"wrong_step"``
    traces, default 0.1), ``exact_use`` (the verifier requires every number) and ``free``
    (the level of filler words in the worked searches, 0 = none: :mod:`pivotrl.tasks.free`;
    a slot goes before every step, and :attr:`max_new_tokens` grows by the longest slot for
    each step of ``max_attempts`` attempts)::

        <think>Okay: 8+3=11, hmm Now: 11*2=22, fine: 22+5=27 x
        So: 8*3=24, right also: 24+2=26</think><answer>8*3+2</answer>

    A problem's identity is countdown's (``countdown:2,3,5,8:26`` with the
    numbers sorted), so a problem held out here is held out in ``countdown``
    too. Prompt ``Use 8 3 5 2 to make 26.``; answer
    ``{"numbers": [8, 3, 5, 2], "target": 26}`` (countdown's verifier).
    """

    name = key_prefix = "countdown_search"
    max_new_tokens = 224  # configs/search.yaml's rollout length: the longest pretraining trace is about 170 tokens
    default_flaw_weights = {"wrong_step": 0.5, "wrong_answer": 0.5}
    free_separators = STEP_SEPARATOR + ATTEMPT_SEPARATOR  # a slot of fillers goes after each
    instruction = (
        "Combine the numbers with + - * /, each number at most once, to make the target. "
        "Search inside <think> </think>: one attempt per line, steps separated by commas, "
        "an attempt that misses ends with x. Then give the expression inside <answer> </answer>."
    )

    def __init__(
        self,
        *,
        num_numbers: int | Sequence[int] = 4,
        number_range: Sequence[int] = (1, 10),
        target_range: Sequence[int] = (10, 50),
        max_value: int = 100,
        max_attempts: int = 6,
        guide: Sequence[float] = (0.3, 0.5, 0.9),
        slip_rate: float = 0.1,
        exact_use: bool = False,
        free: int = 0,
        **options: Any,
    ):
        super().__init__(**options)
        self.free = check_level(free)
        self.num_numbers = _parse_range(num_numbers, "num_numbers")
        if not 3 <= self.num_numbers[0] <= self.num_numbers[1] <= 5:
            raise ValueError(f"countdown_search takes 3 to 5 numbers, got {num_numbers}")
        self.number_range = _parse_range(number_range, "number_range")
        self.target_range = _parse_range(target_range, "target_range")
        if self.number_range[0] < 1 or self.target_range[0] < 1:
            raise ValueError("countdown_search numbers and targets must be positive")
        if max_value < self.target_range[1]:
            raise ValueError(f"max_value {max_value} is below the largest target {self.target_range[1]}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.guide = tuple(float(g) for g in guide)
        if len(self.guide) != 3 or not all(0.0 <= g <= 1.0 for g in self.guide):
            raise ValueError(f"guide must be three probabilities (first, middle, last step), got {guide}")
        if not 0.0 < slip_rate <= 1.0:
            raise ValueError(f"slip_rate must be in (0, 1], got {slip_rate}")
        self.max_value = int(max_value)
        self.max_attempts = int(max_attempts)
        if self.free:  # room for the longest slot before every step of every attempt
            steps = self.max_attempts * (self.num_numbers[1] - 1)
            self.max_new_tokens = self.max_new_tokens + steps * longest_slot(self.free)
        self.slip_rate = float(slip_rate)
        self.exact_use = exact_use
        self.verifier = lazy_verifier("pivotrl.rewards", "countdown_reward", exact_use=exact_use)

    # -- problems ---------------------------------------------------------------
    def solvable(self, numbers: Sequence[int], target: int) -> bool:
        """Whether some sequence of legal moves over ``numbers`` writes ``target``."""
        return any(
            value == target or (len(after) > 1 and target in reachable(after, self.max_value))
            for *_, value, after in legal_moves(tuple(sorted(numbers)), self.max_value)
        )

    def _generate_split(self, split: str, limit: int | None = None) -> ProblemList:
        self._loading = split
        try:
            return super()._generate_split(split, limit)
        finally:
            self._loading = None

    def generate(self, rng: random.Random) -> Problem | None:
        k = rng.randint(*self.num_numbers)
        numbers = [rng.randint(*self.number_range) for _ in range(k)]
        target = rng.randint(*self.target_range)
        if target in numbers:
            return None
        problem = self.make_problem(numbers, target)
        loading = getattr(self, "_loading", None)
        if loading is not None and self.is_heldout(problem) != (loading == "test"):
            return None  # the other split's: skip the search for a solution
        return problem if self.solvable(numbers, target) else None

    def make_problem(self, numbers: Sequence[int], target: int) -> Problem:
        return Problem(
            prompt=countdown_prompt(numbers, target),
            answer={"numbers": list(numbers), "target": target},
            meta={"key": countdown_key(numbers, target)},
        )

    # -- the search -----------------------------------------------------------------
    def attempt(
        self,
        rng: random.Random,
        numbers: Sequence[int],
        target: int,
        slip_rate: float = 0.0,
        guide: Sequence[float] | None = None,
    ) -> Attempt:
        """One attempt: guided random moves until the target is written or one value is left.

        ``guide`` (default: the task's) gives the probability of a winning move at
        the first, middle and last step. With ``slip_rate`` > 0 a written result is
        off by 1 to 3 with that probability, and the attempt goes on from the
        written value.
        """
        guide = self.guide if guide is None else guide
        written = list(numbers)  # the value each slot holds as written (slips included)
        pool = list(range(len(numbers)))  # the slots not used yet
        steps: list[tuple[int, str, int]] = []
        lines: list[str] = []
        slips = 0
        while len(pool) > 1:
            state = tuple(sorted(written[s] for s in pool))
            moves = legal_moves(state, self.max_value)
            if not moves:
                break
            good = winning_moves(state, target, self.max_value)
            stage = 0 if not steps else 2 if len(pool) == 2 else 1
            a, op, b, value, _ = (
                rng.choice(good) if good and rng.random() < guide[stage] else rng.choice(moves)
            )
            left = next(s for s in pool if written[s] == a)
            right = next(s for s in pool if s != left and written[s] == b)
            if slip_rate and rng.random() < slip_rate:
                true_value, value = value, max(1, value + rng.choice((-3, -2, -1, 1, 2, 3)))
                slips += value != true_value
            steps.append((left, op, right))
            lines.append(f"{a}{op}{b}={value}")
            pool.remove(left)
            pool.remove(right)
            pool.append(len(written))
            written.append(value)
            if value == target:
                break
        expression = Program(tuple(numbers), tuple(steps)).text()
        return Attempt(tuple(lines), expression, bool(steps) and written[-1] == target, slips)

    def search(
        self,
        problem: Problem,
        rng: random.Random,
        *,
        slip_rate: float = 0.0,
        give_up: bool = False,
        guide: Sequence[float] | None = None,
        max_attempts: int | None = None,
    ) -> SearchTrace:
        """Attempts until one writes the target or ``max_attempts`` (default: the task's) are used.

        An attempt identical to an earlier one is drawn again (up to 10 draws);
        with ``give_up`` an attempt that hits is drawn again too (up to 30 draws),
        so the search normally fails every attempt and answers with the last one.
        """
        numbers, target = problem.answer["numbers"], problem.answer["target"]
        limit = self.max_attempts if max_attempts is None else max_attempts
        attempts: list[Attempt] = []
        seen: set[tuple[str, ...]] = set()
        while len(attempts) < limit and not (attempts and attempts[-1].hit):
            for draw in range(30):
                attempt = self.attempt(rng, numbers, target, slip_rate, guide)
                if (give_up and attempt.hit) or (attempt.steps in seen and draw < 9):
                    continue
                break
            seen.add(attempt.steps)
            attempts.append(attempt)
        think = ATTEMPT_SEPARATOR.join(a.line() for a in attempts)
        answer = attempts[-1].expression
        return SearchTrace(
            text=f"{THINK_OPEN}{think}{THINK_CLOSE}{ANSWER_OPEN}{answer}{ANSWER_CLOSE}",
            attempts=len(attempts),
            slips=sum(a.slips for a in attempts),
            solved=countdown_reward(answer, problem.answer) == 1.0,
        )

    # -- worked solutions ---------------------------------------------------------------
    def solution(self, problem: Problem) -> str:
        """A correct search (fixed by the problem's key)."""
        return self.worked_solution(problem, None, random.Random(f"solution:{self.key(problem)}"))

    def worked_solution(
        self, problem: Problem, flaw: str | None = None, rng: random.Random | None = None
    ) -> str:
        """A search drawn with ``rng``: correct (``flaw=None``), with slips, or given up.

        Correct: no slip, and it finds the target within ``max_attempts`` (drawn
        again until it does, at most 50 times, then a single attempt that always
        takes a winning move). ``"wrong_step"``: at least one slip (the answer may
        or may not be right). ``"wrong_answer"``: the answer misses the target.
        A flaw that 30 (10) draws do not produce is replaced by the other one,
        and that by a correct search. With ``free``, slots of fillers drawn from a
        generator forked from ``rng`` (the search itself is the one drawn without).
        """
        if flaw is not None and flaw not in FLAWS:
            raise ValueError(f"unknown flaw {flaw!r}; known: {FLAWS}")
        rng = rng or random.Random(f"search:{flaw}:{self.key(problem)}")
        if not self.free:
            return self._search_solution(problem, flaw, rng)
        fillers = fork(rng)
        return insert_fillers(self._search_solution(problem, flaw, rng), fillers, self.free, self.free_separators)

    def _search_solution(self, problem: Problem, flaw: str | None, rng: random.Random) -> str:
        if flaw is not None:
            other = FLAWS[1 - FLAWS.index(flaw)]
            text = self._flawed(problem, flaw, rng) or self._flawed(problem, other, rng)
            if text is not None:
                return text
        for _ in range(50):
            trace = self.search(problem, rng)
            if trace.solved:
                return trace.text
        # one attempt that always takes a winning move (every problem has one)
        return self.search(problem, rng, guide=(1.0, 1.0, 1.0), max_attempts=1).text

    def _flawed(self, problem: Problem, flaw: str, rng: random.Random) -> str | None:
        if flaw == "wrong_step":
            for _ in range(30):
                trace = self.search(problem, rng, slip_rate=self.slip_rate)
                if trace.slips:
                    return trace.text
            return None
        for _ in range(10):
            trace = self.search(problem, rng, give_up=True)
            if not trace.solved:
                return trace.text
        return None

    # -- what a response contains ---------------------------------------------------------
    def response_stats(self, completion: str) -> dict[str, float]:
        """``{"attempts": n}``: the attempts written in the think part (also when cut off)."""
        return {"attempts": float(len(search_attempts(completion)))}

    def trace_validity(self, completion: str, problem: Problem) -> float | None:
        """The share of written steps that are true and use available numbers (every attempt)."""
        return search_trace_validity(completion, problem.answer["numbers"])

    @property
    def marks(self) -> tuple[str, ...]:
        """``("reachable",)``, and ``"free"`` with the option ``free``: see :meth:`token_marks`."""
        return ("free", "reachable") if self.free else ("reachable",)

    def token_marks(self, pieces: list[str], problem: Problem) -> dict[str, list[bool]]:
        """``"reachable"`` for every token and, with ``free``, ``"free"``: countdown's rules
        (:meth:`pivotrl.tasks.CountdownTask.token_marks`) with two differences. The moves are
        this task's (a result is at most ``max_value``). Every line of the think block is an
        attempt: the token after a newline (the one after `` x``) is written in the state of
        all the problem's numbers again, a dead state included; the newline itself still has
        the state its attempt ended in.
        """
        return marks.token_marks(pieces, problem.answer["numbers"], problem.answer["target"],
                                 max_value=self.max_value, attempts=True, free=bool(self.free))
