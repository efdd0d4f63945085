"""A small, self-contained tour of the estimators on a toy batch (`pivotrl demo`)."""

from __future__ import annotations

import torch
from rich.console import Console
from rich.table import Table

from pivotrl.algorithms import ESTIMATORS, TokenBatch, compute_advantages, estimator_diagnostics


def toy_batch(seed: int = 0) -> TokenBatch:
    """Two prompts x 4 responses of up to 12 tokens; token 3 of every response is a high-entropy fork."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([12, 9, 12, 7, 10, 12, 8, 11])
    mask = torch.arange(12).unsqueeze(0) < lengths.unsqueeze(1)
    entropies = torch.rand(8, 12, generator=g) * 0.5
    entropies[:, 3] += 2.5
    old = -torch.rand(8, 12, generator=g)
    return TokenBatch(
        rewards=torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
        group_index=torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]),
        response_mask=mask,
        old_logprobs=old,
        ref_logprobs=old - 0.3 * torch.rand(8, 12, generator=g),
        entropies=entropies,
        # V̂ before the fork from branches sampled there (pivot_mc): group 0 half right, group 1 all right
        pivot_values=torch.where(torch.arange(12) == 3, torch.tensor([0.5] * 4 + [1.0] * 4).unsqueeze(1), torch.nan),
    )


def run_demo(console: Console | None = None) -> dict[str, dict[str, float]]:
    """Print, per estimator, the credit given at the fork vs elsewhere; return the numbers."""
    console = console or Console()
    batch = toy_batch()
    fork = torch.zeros_like(batch.response_mask)
    fork[:, 3] = True
    mixed = batch.group_index == 0
    table = Table(title="Token credit on a toy batch (group 0: rewards 1,0,0,1; group 1: all correct)")
    for column in ("estimator", "|A| at fork", "|A| elsewhere", "fork/else", "|A| all-correct group"):
        table.add_column(column, justify="right" if column != "estimator" else "left")
    results: dict[str, dict[str, float]] = {}
    for name in ESTIMATORS:
        adv = compute_advantages(name, batch).abs()
        rest = batch.response_mask & ~fork
        in_mixed = mixed.unsqueeze(1)
        at_fork = float(adv[fork & in_mixed].mean())
        elsewhere = float(adv[rest & in_mixed].mean())
        agree = float(adv[batch.response_mask & ~in_mixed].mean())
        ratio = at_fork / elsewhere if elsewhere > 0 else float("inf")
        results[name] = {"fork": at_fork, "elsewhere": elsewhere, "all_correct": agree}
        table.add_row(name, f"{at_fork:.3f}", f"{elsewhere:.3f}", f"{ratio:.2f}", f"{agree:.3f}")
    console.print(table)
    diag = estimator_diagnostics(batch, compute_advantages("erpo", batch))
    console.print(f"pivot fraction (entropy z > 1): {diag['pivots/frac']:.2f}; "
                  f"zero-variance groups: {diag['groups/zero_var_frac']:.2f}")
    console.print("GRPO spreads credit evenly and gives an all-correct group nothing; ERPO moves it to the "
                  "fork; EP-GRPO still learns from the all-correct group.")
    return results
