"""Where in a response does the credit land? Reads `pivotrl credit` runs on countdown_search or countdown.

    python scripts/credit_by_move.py runs/credit-search-shipped/credit.json [more credit.json ...]

Every scored position is put in one class by the text before it (its response's own tokens, so
any tokenizer's pieces). On countdown_search:
- "first move, attempt 1": choosing the operands and operator of the first step of
  the first attempt (the search's first fork);
- "first move, later attempt": the same in every later attempt;
- "later move": the operands and operator of an attempt's second or later step;
- "result": writing a step's result and what follows it (`,`, ` x`, the new line);
- "answer": after `</think>`; "other": the opening tag.

On countdown (`<think>5*3=15;15+7=22</think><answer>5*3+7</answer>`): "step N: operands and
operator" (from the step's first character to its `=`), "step N: result" (its result's digits and
the `;` after them), "answer" (after `</think>`), "other" (the opening tag).

Prints, per class, the positions, the mean |A*| with a 95% bootstrap interval over
responses, the share of all |A*| it holds, the share of the summed A*² − se² (an unbiased
estimate of the squared true advantage: Monte-Carlo noise removed), and each estimator's mean |A| there
divided by its mean |A| over all positions (1 = no emphasis). `pivotrl credit
--positions N` draws the same number of positions from every entropy decile, and the
deciles hold equal numbers of tokens, so the classes are compared on equal weights.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

SEARCH_CLASSES = ["first move, attempt 1", "first move, later attempt", "later move", "result", "answer", "other"]
COUNTDOWN_CLASSES = [f"step {n}: {part}" for n in (1, 2, 3) for part in ("operands and operator", "result")] + [
    "answer", "other"]
ESTIMATORS = ["grpo", "high_entropy", "gtpo", "erpo", "ep_grpo"]


def countdown_class(tokens: list[str], t: int) -> str:
    """The class of position t of a countdown response given as token strings."""
    before = "".join(tokens[:t])
    if not before.startswith("<think>"):
        return "other"
    if "</think>" in before:
        return "answer"
    steps = before.removeprefix("<think>").split(";")
    step = min(len(steps), 3)
    return f"step {step}: {'result' if '=' in steps[-1] else 'operands and operator'}"


def move_class(tokens: list[str], t: int) -> str:
    """The class of position t of a countdown_search response given as token strings."""
    before = "".join(tokens[:t])
    if not before.startswith("<think>"):
        return "other"
    if "</think>" in before:
        return "answer"
    think = before.removeprefix("<think>")
    line = think.split("\n")[-1]
    if "=" in line.split(",")[-1]:
        return "result"
    if "," in line:
        return "later move"
    return "first move, attempt 1" if "\n" not in think else "first move, later attempt"


def bootstrap_mean(values: np.ndarray, groups: np.ndarray, resamples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95% interval of the mean of `values`, resampling the responses they belong to."""
    rng = np.random.default_rng(seed)
    ids = np.unique(groups)
    by_group = {g: values[groups == g] for g in ids}
    means = []
    for _ in range(resamples):
        picked = [by_group[g] for g in rng.choice(ids, size=len(ids))]
        joined = np.concatenate(picked)
        if len(joined):
            means.append(joined.mean())
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def report(path: Path) -> str:
    data = json.loads(path.read_text())
    tokens = [r["tokens"] for r in data["responses"]]
    pos = data["positions"]
    search = data["settings"]["task"] == "countdown_search"
    classes, classify = (SEARCH_CLASSES, move_class) if search else (COUNTDOWN_CLASSES, countdown_class)
    cls = np.array([classify(tokens[p["response"]], p["t"]) for p in pos])
    star = np.abs(np.array([p["advantage_true"] for p in pos]))
    squared = star**2 - np.array([p["se"] for p in pos]) ** 2
    resp = np.array([p["response"] for p in pos])
    entropy = np.array([p["entropy"] for p in pos])
    names = [e for e in ESTIMATORS if e in pos[0]["advantages"]]
    adv = {e: np.abs(np.array([p["advantages"][e] for p in pos])) for e in names}
    s = data["settings"]
    lines = [f"{path}: model {s['model']}, {len(tokens)} responses, {len(pos)} positions, k={s['k']}", "",
             "| class | positions | mean entropy | mean \\|A*\\| (95% CI) | share of Σ\\|A*\\| | share of Σ(A*² − se²) | "
             + " | ".join(f"{e} emphasis" for e in names) + " |",
             "|---|---:|---:|---:|---:|---:|" + "---:|" * len(names)]
    for c in classes:
        here = cls == c
        if not here.any():
            continue
        low, high = bootstrap_mean(star[here], resp[here])
        emphasis = [adv[e][here].mean() / adv[e].mean() if adv[e].mean() > 0 else float("nan") for e in names]
        lines.append(f"| {c} | {int(here.sum())} | {entropy[here].mean():.3f} | {star[here].mean():.3f} "
                     f"({low:.3f} to {high:.3f}) | {star[here].sum() / star.sum():.2f} | "
                     f"{squared[here].sum() / squared.sum():.2f} | "
                     + " | ".join(f"{x:.2f}" for x in emphasis) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print("\n\n".join(report(Path(p)) for p in sys.argv[1:]))
