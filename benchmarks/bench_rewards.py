"""Verifier throughput: completions per second for math_reward (serial and batch) and the rest.

    python benchmarks/bench_rewards.py [--workers N] [--limit ROWS] [--timeout 2.0]

math_reward is timed on the reference solutions of GSM8K test and MATH-500
(gsm8k_test.jsonl and math500.jsonl, from the folder the tasks read:
$PIVOTRL_BENCHMARKS, else ../shared/data/benchmarks relative to the current
directory or the repository; without them the script says where it looked
and exits with status 1), against
their own answers ("right") and against the next row's answer ("wrong"). A
right answer that is the identical string (or an equal plain number) is
decided without math-verify, so the "right" rows mostly time that shortcut;
the "via math-verify" rows send every pair to the workers (no shortcut, no
cache). Every measurement starts with fresh workers, up and idle before the
clock starts (empty parse caches), and an empty verdict cache.

Besides wall-clock rates, which depend on what else the machine runs, the
table gives the CPU time per item (this process plus its math-verify
workers, during the call only): on an otherwise idle machine a batch over
W workers on C >= W cores approaches W / (CPU time per item). On Linux it is
read from /proc around the call; elsewhere it is the CPU of the processes
reaped after the call, less an estimate of what starting and stopping them
costs (noisier).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import time
from collections.abc import Callable
from pathlib import Path

from pivotrl.rewards import (
    arithmetic_reward,
    countdown_reward,
    extract_math_answer,
    format_reward,
    math_reward,
    math_reward_batch,
    render_completion,
    shutdown_math_workers,
    trace_validity,
)
from pivotrl.rewards.math import clear_math_cache
from pivotrl.rewards.math_pool import configure_pool, default_pool_size, get_pool
from pivotrl.tasks.loaders import benchmarks_dir

DATA_FILES = ("gsm8k_test.jsonl", "math500.jsonl")


def find_data() -> Path:
    """The benchmark folder holding DATA_FILES; SystemExit with one line saying where it looked."""
    try:
        data = benchmarks_dir()
    except FileNotFoundError as error:
        raise SystemExit(f"bench_rewards.py: no benchmark data: {error}") from None
    missing = [name for name in DATA_FILES if not (data / name).is_file()]
    if missing:
        raise SystemExit(
            f"bench_rewards.py: no benchmark data: {', '.join(missing)} not in {data} "
            "(set $PIVOTRL_BENCHMARKS to the folder holding them)"
        )
    return data


def load_pairs(data: Path, limit: int | None) -> dict[str, tuple[list[str], list[str]]]:
    """Return {name: (solutions, answers)} for GSM8K test and MATH-500."""

    def rows(name: str) -> list[dict]:
        with (data / name).open(encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()][:limit]

    gsm8k = rows("gsm8k_test.jsonl")
    math500 = rows("math500.jsonl")
    return {
        "GSM8K test": (
            [r["answer"] for r in gsm8k],
            [r["answer"].rsplit("####", 1)[1].strip() for r in gsm8k],
        ),
        "MATH-500": ([r["solution"] for r in math500], [r["answer"] for r in math500]),
    }


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _children(pid: int) -> list[int]:
    """The live children of every thread of ``pid`` (Linux /proc)."""
    children = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            children += [int(child) for child in path.read_text().split()]
        except OSError:  # the thread ended meanwhile
            continue
    return children


def _process_cpu(pid: int) -> float:
    """CPU seconds of ``pid``, its reaped children, and its live descendants (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # it exited meanwhile; its parent's count has it once reaped
        return 0.0
    own = sum(int(field) for field in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return own + sum(_process_cpu(child) for child in _children(pid))


def _tree_cpu() -> float:
    """CPU seconds of this process and every process below it, live or reaped."""
    live = sum(_process_cpu(child) for child in _children(os.getpid()))
    return time.process_time() + _children_cpu() + live


def _start_pool(workers: int | None) -> None:
    """Fresh workers, all ready and idle, and an empty verdict cache."""
    configure_pool(workers)
    pool = get_pool()
    # The pool starts its workers on its first call: call it until every
    # worker is up (all([]) is True before that), then once more, so that each
    # has answered before the clock starts.
    while not (pool.workers and all(worker.ready for worker in pool.workers)):
        pool.verify([("1", "1")] * 2 * pool.size, 30.0)
    pool.verify([("1", "1")] * 2 * pool.size, 30.0)
    clear_math_cache()


class Meter:
    """Times a callable on fresh workers: (items per second, CPU milliseconds per item)."""

    def __init__(self, workers: int | None) -> None:
        self.workers = workers
        self.exact = Path(f"/proc/{os.getpid()}/task").is_dir()
        self.pool_cost = 0.0
        if not self.exact:
            # What starting, warming and stopping a pool costs, to subtract.
            costs = []
            for _ in range(2):
                before = _children_cpu()
                _start_pool(workers)
                shutdown_math_workers()
                costs.append(_children_cpu() - before)
            self.pool_cost = min(costs)

    def __call__(self, fn: Callable[[], object], count: int) -> tuple[float, float]:
        before_children = _children_cpu()
        _start_pool(self.workers)
        before = _tree_cpu() if self.exact else time.process_time()
        start = time.perf_counter()
        fn()
        wall = time.perf_counter() - start
        if self.exact:
            cpu = _tree_cpu() - before
            shutdown_math_workers()
        else:
            own = time.process_time() - before
            shutdown_math_workers()
            cpu = own + max(0.0, _children_cpu() - before_children - self.pool_cost)
        return count / wall, 1000 * cpu / count


def countdown_completions(n: int, seed: int = 0) -> tuple[list[str], list[dict]]:
    """Canonical countdown completions, half of them right."""
    rng = random.Random(seed)
    completions, tasks = [], []
    for i in range(n):
        a, b, c = (rng.randint(1, 99) for _ in range(3))
        target = a * b + c if i % 2 == 0 else a * b + c + 1
        think = f"{a}*{b}={a * b};{a * b}+{c}={a * b + c}"
        completions.append(render_completion(think, f"{a}*{b}+{c}"))
        tasks.append({"numbers": [c, a, b], "target": target})
    return completions, tasks


def main() -> None:
    """Print a table of completions per second and CPU time per completion."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=None, help="math-verify worker processes")
    parser.add_argument("--limit", type=int, default=None, help="rows per benchmark file")
    parser.add_argument("--timeout", type=float, default=2.0, help="math_reward timeout_s")
    args = parser.parse_args()
    timeout_s = args.timeout

    data = find_data()
    meter = Meter(args.workers)
    workers = args.workers or default_pool_size()
    print(
        f"cpus={os.cpu_count()} workers={workers} timeout_s={timeout_s} "
        f"load average={os.getloadavg()[0]:.1f}"
    )
    print(f"{'verifier':<42} {'items':>6} {'per second':>11} {'cpu ms/item':>12}")

    def show(label: str, count: int, measured: tuple[float, float]) -> None:
        print(f"{label:<42} {count:>6} {measured[0]:>11.1f} {measured[1]:>12.3f}")

    for name, (solutions, answers) in load_pairs(data, args.limit).items():
        for label, refs in (("right", answers), ("wrong", answers[1:] + answers[:1])):
            pairs = list(zip(solutions, refs, strict=True))
            extracted = [(extract_math_answer(s) or "", a) for s, a in pairs]
            n = len(pairs)
            show(
                f"math_reward, serial: {name} {label}",
                n,
                meter(lambda p=pairs: [math_reward(s, a, timeout_s=timeout_s) for s, a in p], n),
            )
            show(
                f"math_reward_batch: {name} {label}",
                n,
                meter(
                    lambda r=refs, s=solutions: math_reward_batch(s, r, timeout_s),
                    n,
                ),
            )
            show(
                f"  via math-verify, batch: {name} {label}",
                n,
                meter(lambda e=extracted: get_pool().verify(e, timeout_s), n),
            )

    completions, tasks = countdown_completions(20_000)
    # The same traces with the value as the answer, for the arithmetic verifier.
    numeric = [
        c[: c.index("<answer>")] + f"<answer>{t['target']}</answer>"
        for c, t in zip(completions, tasks, strict=True)
    ]
    n = len(completions)
    pure = {
        "countdown_reward": lambda: [
            countdown_reward(c, t) for c, t in zip(completions, tasks, strict=True)
        ],
        "arithmetic_reward": lambda: [
            arithmetic_reward(c, t["target"]) for c, t in zip(numeric, tasks, strict=True)
        ],
        "format_reward": lambda: [format_reward(c) for c in completions],
        "trace_validity": lambda: [trace_validity(c) for c in completions],
    }
    for label, fn in pure.items():
        start, cpu = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        show(label, n, (n / wall, 1000 * cpu / n))


if __name__ == "__main__":
    main()
