"""The one held-out evaluation: pass@1 over k samples, unbiased pass@k, maj@k, length, trace validity.

Also the mean of each count the task reads off a response (:meth:`Task.response_stats`,
e.g. ``mean_attempts`` for ``countdown_search``). :func:`evaluate_policy` serves every
caller, each passing its own settings: ``pivotrl eval``, ``pivotrl pretrain``'s measurement
(through :func:`evaluate_heldout`) and the trainer's periodic evaluation (``eval.*``).
The module loads torch only when it evaluates, so the command line can read its defaults
before checking its options.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pivotrl.rewards import extract_answer, extract_math_answer, format_reward
from pivotrl.rewards.safe import safe_score
from pivotrl.tasks.base import Problem, Task

if TYPE_CHECKING:
    from pivotrl.rollout import Rollout, RolloutEngine

#: What "held-out accuracy" means unless a command is told otherwise, in ``pivotrl eval`` and in
#: ``pivotrl pretrain``'s measurement alike: the first HELDOUT_PROBLEMS problems of the task's test
#: split, one response each sampled at temperature 1 from a generator seeded with 0, HELDOUT_BATCH
#: responses generated at once (the batch decides which random draws each response gets), at most
#: ``task.max_new_tokens`` new tokens (34; countdown_search 224).
HELDOUT_PROBLEMS = 1000
HELDOUT_BATCH = 256


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k)/C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def answer_key(text: str) -> str | None:
    """The final answer a majority vote counts: <answer> content, else the math extraction."""
    answer = extract_answer(text)
    if answer is None:
        answer = extract_math_answer(text)
    return None if answer is None else " ".join(answer.split())


def majority_correct(texts: list[str], scores: list[float]) -> float:
    """Score of the most frequent final answer (ties: the one seen first); 0 with no answers."""
    keys = [answer_key(t) for t in texts]
    counts = Counter(k for k in keys if k is not None)
    if not counts:
        return 0.0
    top = max(counts.values())
    winner = next(k for k in keys if k is not None and counts[k] == top)
    return float(scores[keys.index(winner)] >= 1.0)


def evaluate_policy(
    engine: RolloutEngine,
    task: Task,
    problems: list[Problem],
    *,
    prompts: list[str],
    max_new_tokens: int,
    samples_per_problem: int = 1,
    temperature: float = 1.0,
    batch_size: int = HELDOUT_BATCH,
    seed: int = 0,
    samples_path: str | Path | None = None,
    num_examples: int = 0,
    progress: Callable[[int, int], None] | None = None,
    on_batch: Callable[[Rollout, list[Problem]], None] | None = None,
) -> dict[str, Any]:
    """Sample k completions per problem and score them; optionally write every sample as jsonl.

    Returns accuracy (pass@1 averaged over the k samples), pass@k, maj@k, mean_length,
    format (share of samples in the think/answer layout), trace_validity_correct (the
    task's :meth:`~pivotrl.tasks.Task.trace_validity` averaged over correct samples),
    ``mean_<name>`` for each of the task's :meth:`~pivotrl.tasks.Task.response_stats`
    (over all samples) and, with num_examples > 0, the first samples as
    {"prompt", "response", "score"}.
    `progress(done, total)` is called after each batch with the number of problems scored;
    `on_batch(rollout, problems)` with each batch's samples (row r answers ``problems[rollout.group_index[r]]``).
    """
    if len(prompts) != len(problems):
        raise ValueError(f"{len(prompts)} prompts for {len(problems)} problems")
    if samples_per_problem < 1:
        raise ValueError(f"samples_per_problem must be >= 1, got {samples_per_problem}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")
    import torch

    k = samples_per_problem
    generator = torch.Generator().manual_seed(seed)
    per_batch = max(1, batch_size // k)
    correct, pass_k, maj_k, lengths, validity = [], [], [], [], []
    formatted = 0.0
    stat_sums: dict[str, float] = {}
    examples: list[dict[str, Any]] = []
    sink = None
    if samples_path is not None:
        Path(samples_path).parent.mkdir(parents=True, exist_ok=True)
        sink = open(samples_path, "w")  # noqa: SIM115 - closed in finally
    try:
        for start in range(0, len(problems), per_batch):
            chunk = problems[start : start + per_batch]
            rollout = engine.generate(prompts[start : start + per_batch], k, max_new_tokens=max_new_tokens,
                                      temperature=temperature, generator=generator)
            if on_batch is not None:
                on_batch(rollout, chunk)
            lens = rollout.response_mask.sum(dim=1).tolist()
            for j, problem in enumerate(chunk):
                texts = rollout.texts[j * k : (j + 1) * k]
                scores = [safe_score(task.verifier, t, problem.answer) for t in texts]
                n_right = sum(s >= 1.0 for s in scores)
                correct.append(n_right / k)
                pass_k.append(pass_at_k(k, n_right, k))
                maj_k.append(majority_correct(texts, scores))
                lengths.extend(lens[j * k : (j + 1) * k])
                for t, s in zip(texts, scores, strict=True):
                    formatted += format_reward(t)
                    for name, value in task.response_stats(t).items():
                        stat_sums[name] = stat_sums.get(name, 0.0) + value
                    v = task.trace_validity(t, problem) if s >= 1.0 else None
                    if v is not None:
                        validity.append(v)
                    if len(examples) < num_examples:
                        examples.append({"prompt": problem.prompt, "response": t, "score": s})
                if sink is not None:
                    for g, (t, s) in enumerate(zip(texts, scores, strict=True)):
                        sink.write(json.dumps({"problem": start + j, "sample": g, "prompt": problem.prompt,
                                               "answer": problem.answer, "completion": t, "reward": s,
                                               "length": lens[j * k + g]}) + "\n")
            if progress is not None:
                progress(start + len(chunk), len(problems))
    finally:
        if sink is not None:
            sink.close()
    n = max(len(problems), 1)
    return {
        "accuracy": sum(correct) / n,
        f"pass@{k}": sum(pass_k) / n,
        f"maj@{k}": sum(maj_k) / n,
        "mean_length": sum(lengths) / max(len(lengths), 1),
        "format": formatted / max(len(lengths), 1),
        "trace_validity_correct": sum(validity) / len(validity) if validity else None,
        **{f"mean_{name}": total / max(len(lengths), 1) for name, total in stat_sums.items()},
        "num_problems": len(problems),
        "samples_per_problem": k,
        **({"examples": examples} if num_examples > 0 else {}),
    }


def evaluate_heldout(
    model: Any,
    tokenizer: Any,
    task: Task,
    *,
    n: int = HELDOUT_PROBLEMS,
    temperature: float = 1.0,
    seed: int = 0,
    batch_size: int = HELDOUT_BATCH,
    max_new_tokens: int | None = None,
    chat: bool = False,
    num_examples: int = 0,
    on_batch: Callable[[Rollout, list[Problem]], None] | None = None,
) -> dict[str, Any]:
    """:func:`evaluate_policy` of `model` (the HF engine) on the first `n` test problems of `task`, one
    sample each: with the defaults, what ``pivotrl eval`` reports as held-out accuracy.

    ``max_new_tokens`` None: the task's; ``temperature`` 0: greedy. Sampling draws from a
    generator seeded with ``seed``, leaving the global RNG alone. ``on_batch``: as evaluate_policy's.
    """
    from pivotrl.rollout.hf import HFEngine

    problems = list(task.problems("test", limit=n))
    if not problems:
        raise ValueError(f"task {task.name!r} has no test problems")
    prompts = [task.format_prompt(p, tokenizer=tokenizer, chat=chat) for p in problems]
    return evaluate_policy(HFEngine(model, tokenizer), task, problems, prompts=prompts, temperature=temperature,
                           max_new_tokens=max_new_tokens or task.max_new_tokens, batch_size=batch_size, seed=seed,
                           num_examples=num_examples, on_batch=on_batch)
