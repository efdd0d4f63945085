"""`pivotrl credit`: do the estimators put their credit on the tokens that decide the outcome?

The command samples responses to held-out prompts, computes every registered estimator's
token advantages A on them (ERPO's ablations too, if asked), and measures how well A matches
the true advantage A*(t) = V(t+1) - V(t) of each token, V(t) the Monte-Carlo value of the
response's prefix o_<t: rank correlation (over all tokens and within responses), sign
agreement, the share of |A| on the tokens of largest |A*|, and mean |A*| by entropy decile
of the policy at the token, each with a 95% bootstrap interval over responses.

This module runs the measurement and assembles credit.json; the work is in three others:

- `pivotrl.analysis.values`: the ground truth V and A*, the only part that samples continuations;
- `pivotrl.analysis.credit_stats`: the metrics, bootstrap intervals and entropy deciles;
- `pivotrl.analysis.credit_report`: the writers (credit.json, report.md, two PNG plots, tokens.html).

ALGORITHMS.md, section "Credit ground truth", defines every metric.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pivotrl.algorithms import ESTIMATORS, TokenBatch, compute_advantages, estimator_requirements
from pivotrl.algorithms.batch import optional_fields
from pivotrl.analysis.compare import ABLATIONS
from pivotrl.analysis.credit_report import write_outputs
from pivotrl.analysis.credit_stats import (
    METRICS,
    bootstrap_ci,
    entropy_decile_table,
    entropy_deciles,
    estimator_metrics,
    free_token_table,
    select_positions,
    top_mass_share,
    top_weights,
    triplet,
)
from pivotrl.analysis.values import ValueTable, estimate_values, needed_values, true_advantages
from pivotrl.progress import Phases
from pivotrl.rewards.safe import safe_score
from pivotrl.rollout import Rollout, RolloutEngine
from pivotrl.rollout.branching import branch_and_value
from pivotrl.rollout.forward import response_logprobs
from pivotrl.rollout.marks import MARK_FIELDS, TokenPieces, rollout_marks

#: ERPO's ablations (ALGORITHMS.md): compare's three, plus the process term switched off.
ERPO_ABLATIONS: dict[str, dict[str, Any]] = {
    **{name: kwargs for name, kwargs in ABLATIONS.items() if name != "full"}, "no_process": {"eta": 0.0}}


# -- the estimators scored -----------------------------------------------------------------------------


def scored_estimators(ablations: bool = False) -> dict[str, tuple[str, dict[str, Any]]]:
    """label -> (estimator, hyperparameters): every registered estimator, plus ERPO's ablations if asked."""
    out: dict[str, tuple[str, dict[str, Any]]] = {name: (name, {}) for name in ESTIMATORS}
    if ablations:
        out.update({f"erpo:{name}": ("erpo", kwargs) for name, kwargs in ERPO_ABLATIONS.items()})
    return out


def estimator_advantages(batch: TokenBatch, ablations: bool = False) -> dict[str, Tensor]:
    """Every scored estimator's (N,T) advantages on the batch (see scored_estimators), but those that read a
    field the batch does not have (the oracles on a task without token marks)."""
    present = {name for name in optional_fields(batch) if getattr(batch, name) is not None}
    return {label: compute_advantages(name, batch, **kwargs)
            for label, (name, kwargs) in scored_estimators(ablations).items()
            if estimator_requirements(name, **kwargs) <= present}


# -- the whole measurement ----------------------------------------------------------------------------

#: The key-value cache one generate call of the continuations may hold, and its most rows.
CACHE_BUDGET_BYTES = 2 * 2**30
MOST_BATCH_ROWS = 4096


def rows_that_fit(model: torch.nn.Module, sequence_length: int, budget_bytes: int = CACHE_BUDGET_BYTES) -> int:
    """Continuation rows per generate call whose key-value cache over `sequence_length` tokens fits
    `budget_bytes`, at most MOST_BATCH_ROWS (SmolLM2-135M in float32 caches 45 KiB a token: 4096 rows
    of its countdown prompts and responses overran 24 GiB, 256 did not)."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    element = next(model.parameters()).element_size()
    per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * element
    return max(1, min(MOST_BATCH_ROWS, budget_bytes // (per_token * sequence_length)))


def check_options(*, group_size: int, k: int, max_new_tokens: int, temperature: float,
                  positions_per_decile: int | None, ablations: bool, batch_rows: int, bootstrap: int,
                  html_estimators: tuple[str, ...]) -> None:
    """ValueError naming the first bad setting of run_credit (cheap: call it before loading anything)."""
    for name, value, least in (("group size", group_size, 1), ("k", k, 2), ("max_new_tokens", max_new_tokens, 1),
                               ("batch rows", batch_rows, 1), ("bootstrap resamples", bootstrap, 1)):
        if value < least:
            raise ValueError(f"{name} must be >= {least}, got {value}")
    if positions_per_decile is not None and positions_per_decile < 1:
        raise ValueError(f"--positions (per entropy decile) must be >= 1, got {positions_per_decile}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (V is an expectation over sampling), got {temperature}")
    known = scored_estimators(ablations)
    unknown = [name for name in html_estimators if name not in known]
    if unknown:
        raise ValueError(f"unknown estimator(s) for the HTML page: {', '.join(unknown)}; known: {', '.join(known)}")


def run_credit(model: torch.nn.Module, tokenizer: Any, engine: RolloutEngine, task: Any, problems: list[Any],
               prompts: list[str], output_dir: Path, *, model_name: str = "", task_name: str = "",
               ref_model: torch.nn.Module | None = None, ref_name: str | None = None, group_size: int = 8,
               k: int = 32, max_new_tokens: int = 34, temperature: float = 1.0,
               positions_per_decile: int | None = None, ablations: bool = False, seed: int = 0,
               batch_rows: int | None = None, bootstrap: int = 1000, html_estimators: tuple[str, ...] = ("grpo", "erpo"),
               pivots: int = 2, branches: int = 4, spacing: int = 4, phases: Phases | None = None) -> dict[str, Any]:
    """Sample, estimate A*, score every estimator against it; write credit.json, report.md, plots, tokens.html.

    pivot_mc's branches (`pivots` per response, `branches` each, `spacing` apart) are sampled with
    their own generator, independently of the K continuations that estimate A*.

    `batch_rows` continuation rows go to each generate call (default: `rows_that_fit`).
    `phases` shows the progress of each phase and logs its seconds (default: nothing shown).
    Returns the content of credit.json.
    """
    phases = phases or Phases()
    check_options(group_size=group_size, k=k, max_new_tokens=max_new_tokens, temperature=temperature,
                  positions_per_decile=positions_per_decile, ablations=ablations, batch_rows=1 if batch_rows is None else batch_rows,
                  bootstrap=bootstrap, html_estimators=html_estimators)
    if not problems:
        raise ValueError("no problems to sample")
    marked = {MARK_FIELDS[mark] for mark in task.marks}
    for label in html_estimators:
        name, kwargs = scored_estimators(ablations)[label]
        lacking = estimator_requirements(name, **kwargs) & set(MARK_FIELDS.values()) - marked
        if lacking:
            raise ValueError(f"--html-estimators {label}: it reads {', '.join(sorted(lacking))}, token marks that "
                             f"task {task_name or task.name!r} does not give")
    clock = {"start": time.perf_counter()}
    output_dir.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    answers = [p.answer for p in problems for _ in range(group_size)]

    def score(row: int, text: str) -> float:
        return safe_score(task.verifier, text, answers[row])

    with phases.phase(f"sample {len(problems)} prompts x {group_size} responses, score, forward"):
        rollout = engine.generate(prompts, group_size, max_new_tokens=max_new_tokens, temperature=temperature,
                                  generator=generator)
        rewards = torch.tensor([score(i, t) for i, t in enumerate(rollout.texts)], dtype=torch.float32)
        mask = rollout.response_mask
        with torch.no_grad():
            logprobs, entropies = response_logprobs(model, rollout, temperature=temperature)
            ref_lp = (response_logprobs(ref_model, rollout, temperature=temperature)[0] if ref_model is not None
                      else logprobs)
    with phases.phase(f"pivot_mc's branches ({pivots} pivots x {branches} per response)"):
        values, found, _ = branch_and_value(
            engine, rollout, entropies, rewards.to(logprobs.device),
            lambda parents, texts, _lengths: torch.tensor([score(int(p), t)
                                                           for p, t in zip(parents, texts, strict=True)]),
            pivots=pivots, spacing=spacing, branches=branches, max_new_tokens=max_new_tokens, temperature=temperature,
            top_p=1.0, generator=torch.Generator().manual_seed(seed + 1))
    marks = rollout_marks(rollout, TokenPieces(tokenizer),
                          lambda pieces, row: task.token_marks(pieces, problems[row // group_size])) if marked else {}
    batch = TokenBatch(rewards.to(logprobs.device), rollout.group_index.to(logprobs.device), mask, logprobs, ref_lp,
                       entropies, pivot_values=values, **marks)
    advantages = {name: adv.double().cpu() for name, adv in estimator_advantages(batch, ablations).items()}
    deciles = entropy_deciles(entropies, mask)
    positions = select_positions(mask, deciles, positions_per_decile, generator)
    clock["sampled"] = time.perf_counter()
    needed = needed_values(positions, mask.shape[1], mask.shape[0])
    if batch_rows is None:
        batch_rows = rows_that_fit(model, rollout.prompt_ids.shape[1] + max_new_tokens)
    with phases.phase(f"continuations (K={k})", unit="rows") as update:
        table = estimate_values(engine, rollout, rewards, score, needed, k=k, max_new_tokens=max_new_tokens,
                                temperature=temperature, batch_rows=batch_rows, generator=generator,
                                progress=update)
    clock["estimated"] = time.perf_counter()
    star, star_se = true_advantages(table, positions)
    settings = {
        "temperature": temperature, "max_new_tokens": max_new_tokens, "k": k, "task": task_name, "model": model_name,
        "ref": ref_name if ref_model is not None else "the policy itself (ERPO's process term is 0)",
        "num_prompts": len(problems), "group_size": group_size, "seed": seed,
        "positions_per_decile": positions_per_decile, "ablations": ablations, "bootstrap": bootstrap,
        "batch_rows": batch_rows, "split": "test", "threads": torch.get_num_threads(),
        "pivot_mc": {"pivots": pivots, "branches": branches, "spacing": spacing,
                     "branch_tokens": found.tokens if found else 0, "seed": seed + 1}}
    with phases.phase(f"metrics ({bootstrap} bootstrap resamples)"):
        result = assemble_result(rollout, tokenizer, problems, rewards, entropies.double().cpu(),
                                 logprobs.double().cpu(), deciles, positions, table, star, star_se, advantages,
                                 settings=settings, rng=np.random.default_rng(seed), free=marks.get("free_mask"))
    clock["done"] = time.perf_counter()
    result["summary"].update({
        "prefixes": table.prefixes, "continuations": table.continuations,
        "wall_time_s": {"sample_and_forward": clock["sampled"] - clock["start"],
                        "continuations": clock["estimated"] - clock["sampled"],
                        "metrics": clock["done"] - clock["estimated"], "total": clock["done"] - clock["start"]}})
    with phases.phase("write credit.json, report.md, plots, tokens.html"):
        write_outputs(result, output_dir, html_estimators)
    return result


def assemble_result(rollout: Rollout, tokenizer: Any, problems: list[Any], rewards: Tensor, entropies: Tensor,
                    logprobs: Tensor, deciles: Tensor, positions: Tensor, table: ValueTable, star: Tensor,
                    star_se: Tensor, advantages: dict[str, Tensor], *, settings: dict[str, Any],
                    rng: np.random.Generator, free: Tensor | None = None) -> dict[str, Any]:
    """The content of credit.json: settings, responses, positions, per-estimator metrics, entropy deciles,
    and with the task's free marks (`free`, (N,T)) each position's "free" flag and the "free_tokens" table.

    Each position also carries `logprob`, log π(o_t | o_<t) at the sampling temperature: with
    rewards in [0,1], |A*(t)| <= 1 - π(o_t) (A*(t) = Σ_{a≠o_t} π(a)·(Q(o_t) − Q(a))), the
    `bound_mean` of each entropy decile.
    """
    mask = rollout.response_mask.cpu()
    lengths = mask.sum(dim=1)
    group = rollout.group_size
    responses = []
    for i in range(mask.shape[0]):
        ids = rollout.response_ids[i, : int(lengths[i])].tolist()
        prompt_ids = rollout.prompt_ids[i][rollout.prompt_mask[i]].tolist()
        responses.append({
            "prompt": tokenizer.decode(prompt_ids, skip_special_tokens=True), "prompt_ids": prompt_ids,
            "answer": problems[i // group].answer, "response_ids": ids, "reward": float(rewards[i]),
            "group": i // group, "text": rollout.texts[i], "truncated": bool(rollout.truncated[i]),
            "tokens": [tokenizer.decode([t], skip_special_tokens=False) for t in ids],
            "entropies": [round(float(h), 6) for h in entropies[i, : int(lengths[i])]],
        })
    rows, ts = positions[:, 0], positions[:, 1]
    names = list(advantages)
    adv = np.stack([advantages[name][rows, ts].numpy() for name in names]) if names else np.zeros((0, len(rows)))
    star_np, se_np = star.numpy(), star_se.numpy()
    run_lengths = np.bincount(rows.numpy(), minlength=mask.shape[0])
    run_lengths = run_lengths[run_lengths > 0]
    position_rows = []
    for j, (i, t) in enumerate(zip(rows.tolist(), ts.tolist(), strict=True)):
        position_rows.append({
            "response": i, "t": t, "token_id": responses[i]["response_ids"][t], "token": responses[i]["tokens"][t],
            "entropy": float(entropies[i, t]), "logprob": float(logprobs[i, t]), "decile": int(deciles[i, t]),
            "v_before": float(table.values[i, t]), "v_after": float(table.values[i, t + 1]),
            "se_before": float(table.se[i, t]), "se_after": float(table.se[i, t + 1]),
            "advantage_true": float(star_np[j]), "se": float(se_np[j]),
            "advantages": {name: float(adv[e, j]) for e, name in enumerate(names)},
            **({"free": bool(free[i, t] > 0)} if free is not None else {}),
        })
    point = estimator_metrics(adv, star_np, se_np, run_lengths)
    resamples = settings["bootstrap"]
    low, high = bootstrap_ci(lambda idx, lens: estimator_metrics(adv[:, idx], star_np[idx], se_np[idx], lens),
                             run_lengths, resamples, rng)
    estimators = {name: {metric: triplet(low[e, m], point[e, m], high[e, m]) for m, metric in enumerate(METRICS)}
                  for e, name in enumerate(names)}
    valid_h = entropies[mask].numpy()
    by_entropy = entropy_decile_table(star_np, se_np, 1 - logprobs[rows, ts].exp().numpy(), deciles[rows, ts].numpy(),
                                      valid_h, deciles[mask].numpy(), run_lengths, resamples, rng)
    oracle = top_mass_share(star_np, top_weights(star_np)) if len(star_np) else math.nan
    summary = {
        "responses": len(responses), "tokens": int(lengths.sum()), "positions": len(position_rows),
        "accuracy": float((rewards >= 1.0).float().mean()), "mean_length": float(lengths.float().mean()),
        "entropy_mean": float(valid_h.mean()) if len(valid_h) else None,
        "se_mean": float(se_np.mean()) if len(se_np) else None,
        "se_median": float(np.median(se_np)) if len(se_np) else None,
        "se_p90": float(np.quantile(se_np, 0.9)) if len(se_np) else None,
        "top10_mass_of_true": None if not math.isfinite(oracle) else oracle,
    }
    result = {"settings": settings, "summary": summary, "responses": responses, "positions": position_rows,
              "estimators": estimators, "entropy_deciles": by_entropy}
    if free is not None:
        free_cpu = free.cpu() > 0
        result["free_tokens"] = free_token_table(
            {name: advantages[name][mask].abs().numpy() for name in names}, free_cpu[mask].numpy(),
            lengths[lengths > 0].numpy(), star_np, se_np, free_cpu[rows, ts].numpy(), run_lengths, resamples, rng)
    return result
