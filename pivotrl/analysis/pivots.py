"""`pivotrl analyze`: where are a policy's critical decision pivots, and do they matter?

1. Sample G responses per problem; per-token entropies from one forward.
2. Entropy histogram (PNG) and an HTML page colouring every sampled token by its
   entropy, and by its advantage under a chosen estimator next to GRPO's.
3. Perturbation test with its control: at tokens in the top-k% of entropy and at
   tokens in the bottom-k%, (a) replace the sampled token by another draw from the
   policy (the original token excluded) and regenerate the rest, and (b) at the same
   positions keep the sampled token and regenerate the rest. Each condition counts how
   often the verdict (right / wrong) flips; (b) is the flip rate that regenerating alone
   causes, so the rate attributable to the token is (a) - (b), with a paired 95% interval.
   The difference of the attributable rates, high - low, says how much more a
   trajectory hinges on its high-entropy forks. `pivotrl credit` measures the same
   question without a forced token: the true advantage of every token against
   Monte-Carlo ground truth.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from pivotrl.algorithms import TokenBatch, compute_advantages, estimator_requirements  # noqa: E402
from pivotrl.modeling.policy import lm_parts, positions_from_mask  # noqa: E402
from pivotrl.progress import Phases  # noqa: E402
from pivotrl.rewards.safe import safe_score  # noqa: E402
from pivotrl.rollout import Rollout, RolloutEngine  # noqa: E402
from pivotrl.rollout.forward import response_logprobs  # noqa: E402
from pivotrl.rollout.hf import generator_on  # noqa: E402


def flip_ratio_ci(flips_high: int, n_high: int, flips_low: int, n_low: int) -> tuple[float, float, float]:
    """Ratio of flip rates high/low and its 95% interval (log-ratio delta method, +0.5 to each cell)."""
    if n_high == 0 or n_low == 0:
        return math.nan, math.nan, math.nan
    a, b = flips_high + 0.5, flips_low + 0.5
    n1, n2 = n_high + 1.0, n_low + 1.0
    ratio = (a / n1) / (b / n2)
    se = math.sqrt(1 / a - 1 / n1 + 1 / b - 1 / n2)
    return ratio, ratio * math.exp(-1.96 * se), ratio * math.exp(1.96 * se)


def paired_difference_ci(a: Tensor, b: Tensor) -> tuple[float, float, float]:
    """mean(a - b) of paired 0/1 outcomes and its 95% interval (normal, sd of the differences); NaN if empty."""
    if a.numel() == 0:
        return math.nan, math.nan, math.nan
    d = a.double() - b.double()
    mean = float(d.mean())
    half = 1.96 * float(d.std()) / math.sqrt(d.numel()) if d.numel() > 1 else math.nan
    return mean, mean - half, mean + half


def _colour(value: float, scale: float, diverging: bool) -> str:
    """A CSS background: white to orange for entropy, blue-white-red for advantages."""
    x = max(-1.0, min(1.0, value / scale)) if scale > 0 else 0.0
    if not diverging:
        return f"rgba(255,140,0,{abs(x):.2f})"
    return f"rgba(220,50,50,{x:.2f})" if x >= 0 else f"rgba(40,90,220,{-x:.2f})"


def _piece(p: str) -> str:
    return html.escape(p) if p.strip() else "&middot;" if p == " " else html.escape(repr(p)[1:-1])


def token_html(pieces: list[str], values: list[float | None], scale: float, diverging: bool, label: str) -> str:
    """One row of coloured token spans (class 'tok'), each with its value in data-v and a tooltip.

    A value of None (not measured) gets a grey outline, no colour and no data-v.
    """
    spans = "".join(
        f'<span class="tok" title="{html.escape(label)}: not estimated" style="outline:1px dotted #aaa">{_piece(p)}</span>'
        if v is None else
        f'<span class="tok" data-v="{v:.4f}" title="{html.escape(label)} {v:.3f}" '
        f'style="background:{_colour(v, scale, diverging)}">{_piece(p)}</span>'
        for p, v in zip(pieces, values, strict=True)
    )
    return f'<div class="row"><span class="lab">{html.escape(label)}</span>{spans}</div>'


def write_html(path: Path, rollout: Rollout, tokenizer: Any, entropies: Tensor, adv: Tensor, adv_grpo: Tensor,
               rewards: Tensor, estimator: str, max_responses: int) -> int:
    """The token heat-map page; returns how many responses it shows."""
    mask = rollout.response_mask
    rows = min(max_responses, mask.shape[0])
    h_scale = float(entropies[mask].quantile(0.98)) if mask.any() else 1.0
    a_scale = float(torch.cat([adv[mask], adv_grpo[mask]]).abs().quantile(0.98)) if mask.any() else 1.0
    prompts = tokenizer.batch_decode(rollout.prompt_ids[:rows], skip_special_tokens=True)
    blocks = []
    for i in range(rows):
        n = int(mask[i].sum())
        ids = rollout.response_ids[i, :n].tolist()
        pieces = [tokenizer.decode([t], skip_special_tokens=False) for t in ids]
        blocks.append(
            f'<div class="resp" data-tokens="{n}"><div class="meta">response {i} · reward {float(rewards[i]):.2f} · '
            f"prompt: <code>{html.escape(prompts[i].strip())}</code></div>"
            + token_html(pieces, entropies[i, :n].tolist(), h_scale, False, "entropy")
            + token_html(pieces, adv[i, :n].tolist(), a_scale, True, estimator)
            + token_html(pieces, adv_grpo[i, :n].tolist(), a_scale, True, "grpo")
            + "</div>"
        )
    style = ("body{font-family:sans-serif;margin:2em}.resp{margin:1.2em 0;padding:.5em;border-bottom:1px solid #ddd}"
             ".row{font-family:monospace;white-space:nowrap;margin:2px 0}.tok{padding:1px 1px;border-radius:2px}"
             ".lab{display:inline-block;width:9em;color:#555}.meta{color:#333;margin-bottom:4px}")
    legend = (f"<p>Rows per response: token entropy (orange, full colour at {h_scale:.2f} nats), advantage under "
              f"<b>{html.escape(estimator)}</b> and under <b>grpo</b> (red positive, blue negative, full colour at "
              f"|A| = {a_scale:.2f}). Hover a token for its value.</p>")
    path.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>pivotrl analyze</title>"
                    f"<style>{style}</style></head><body><h1>Token entropy and credit</h1>{legend}"
                    + "".join(blocks) + "</body></html>")
    return rows


def plot_entropy_histogram(entropies: Tensor, path: Path, threshold_high: float, threshold_low: float) -> None:
    """Histogram of valid-token entropies (log count), with the perturbation thresholds marked."""
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.hist(entropies.cpu().numpy(), bins=60, color="tab:orange", alpha=0.85)
    ax.axvline(threshold_high, color="tab:red", linestyle="--", label=f"top-k% threshold ({threshold_high:.2f})")
    ax.axvline(threshold_low, color="tab:blue", linestyle="--", label=f"bottom-k% threshold ({threshold_low:.2f})")
    ax.set_yscale("log")
    ax.set_xlabel("token entropy of the policy (nats)")
    ax.set_ylabel("number of sampled tokens (log scale)")
    ax.set_title("Entropy of the next-token distribution over sampled tokens")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


@torch.no_grad()
def perturb(engine: RolloutEngine, model: torch.nn.Module, rollout: Rollout, positions: Tensor, task: Any, answers: list[Any],
            verdicts: Tensor, *, max_new_tokens: int, temperature: float, generator: torch.Generator,
            keep_token: bool = False) -> Tensor:
    """Flip indicator (K,) for each (row, t) in positions (K,2): another token at t, the rest regenerated.

    keep_token=True is the control: the sampled token stays at t and only the rest is regenerated.
    """
    if positions.numel() == 0:
        return torch.zeros(0, dtype=torch.bool)
    rows, ts = positions[:, 0], positions[:, 1]
    pad = engine.tokenizer.pad_token_id
    width = rollout.prompt_ids.shape[1]
    ids = torch.cat([rollout.prompt_ids[rows], rollout.response_ids[rows]], dim=1)
    attention = torch.cat([rollout.prompt_mask[rows], rollout.response_mask[rows]], dim=1).long()
    original = rollout.response_ids[rows, ts]
    if keep_token:
        replacement = original
    else:
        body, head = lm_parts(model)
        pos = positions_from_mask(attention)
        hidden = body(input_ids=ids, attention_mask=attention, position_ids=pos).last_hidden_state
        at = hidden[torch.arange(len(rows)), width - 1 + ts]
        logits = head(at).float() / max(temperature, 1e-6)
        logits[torch.arange(len(rows)), original] = -math.inf
        replacement = torch.multinomial(torch.softmax(logits, dim=-1), 1,
                                        generator=generator_on(logits.device, generator)).squeeze(1)
    # new prompt = prompt + response[:t] + replacement, left-padded again
    prefix_len = width + ts + 1
    longest = int(prefix_len.max())
    new_ids = torch.full((len(rows), longest), pad, dtype=torch.long, device=ids.device)
    new_mask = torch.zeros_like(new_ids, dtype=torch.bool)
    for k in range(len(rows)):  # one copy per perturbed position (hundreds), not per token
        seq = torch.cat([ids[k, : width + ts[k]], replacement[k : k + 1]])
        seq_mask = torch.cat([attention[k, : width + ts[k]].bool(), torch.ones(1, dtype=torch.bool, device=ids.device)])
        new_ids[k, longest - len(seq):] = seq
        new_mask[k, longest - len(seq):] = seq_mask
    budget = max(1, max_new_tokens - int(ts.min()) - 1)
    cont = engine.generate_from_ids(new_ids, new_mask, 1, max_new_tokens=budget, temperature=temperature,
                                    generator=generator)
    tok = engine.tokenizer
    flips = []
    for k in range(len(rows)):
        head_ids = rollout.response_ids[rows[k], : ts[k]].tolist() + [int(replacement[k])]
        tail = cont.response_ids[k][cont.response_mask[k]].tolist()[: max(0, max_new_tokens - len(head_ids))]
        text = tok.decode(head_ids + tail, skip_special_tokens=True)
        verdict = safe_score(task.verifier, text, answers[int(rows[k])]) >= 1.0
        flips.append(verdict != bool(verdicts[rows[k]]))
    return torch.tensor(flips)


def analyze_policy(model: torch.nn.Module, tokenizer: Any, engine: RolloutEngine, task: Any, problems: list[Any],
                   prompts: list[str], output_dir: Path, *, estimator: str = "erpo", group_size: int = 8,
                   max_new_tokens: int = 34, temperature: float = 1.0, top_percent: float = 10.0,
                   num_perturbations: int = 200, max_html_responses: int = 64, seed: int = 0,
                   ref_model: torch.nn.Module | None = None, phases: Phases | None = None) -> dict[str, Any]:
    """Run the whole pivot analysis and write entropy.png, tokens.html and pivots.json in output_dir.

    `phases` shows the progress of each phase and logs its seconds (default: nothing shown).
    """
    if not 0 < top_percent < 50:
        raise ValueError(f"top_percent must be in (0, 50), got {top_percent}")
    phases = phases or Phases()
    output_dir.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    answers = [p.answer for p in problems for _ in range(group_size)]
    with phases.phase(f"sample {len(problems)} prompts x {group_size} responses, score, forward"):
        rollout = engine.generate(prompts, group_size, max_new_tokens=max_new_tokens, temperature=temperature,
                                  generator=generator)
        rewards = torch.tensor([safe_score(task.verifier, t, a) for t, a in zip(rollout.texts, answers, strict=True)])
        mask = rollout.response_mask
        with torch.no_grad():
            logprobs, entropies = response_logprobs(model, rollout, temperature=temperature)
            ref_lp = (response_logprobs(ref_model, rollout, temperature=temperature)[0] if ref_model is not None
                      else logprobs)
    with phases.phase("advantages, entropy.png, tokens.html"):
        batch = TokenBatch(rewards.to(logprobs.device), rollout.group_index.to(logprobs.device), mask, logprobs,
                           ref_lp if "ref_logprobs" in estimator_requirements(estimator) else None, entropies)
        adv = compute_advantages(estimator, batch)
        adv_grpo = compute_advantages("grpo", batch)
        valid = entropies[mask]
        high_t = float(valid.quantile(1 - top_percent / 100))
        low_t = float(valid.quantile(top_percent / 100))
        plot_entropy_histogram(valid, output_dir / "entropy.png", high_t, low_t)
        shown = write_html(output_dir / "tokens.html", rollout, tokenizer, entropies, adv, adv_grpo, rewards,
                           estimator, max_html_responses)
    verdicts = rewards >= 1.0
    result: dict[str, Any] = {"estimator": estimator, "problems": len(problems), "responses": int(mask.shape[0]),
                              "tokens": int(mask.sum()), "accuracy": float(verdicts.float().mean()),
                              "entropy_mean": float(valid.mean()), "top_percent": top_percent,
                              "threshold_high": high_t, "threshold_low": low_t, "html_responses": shown}
    attributable = {}
    for name, select in (("high", mask & (entropies >= high_t)), ("low", mask & (entropies <= low_t))):
        candidates = select.nonzero()
        pick = torch.randperm(len(candidates), generator=generator)[:num_perturbations]
        conditions = []
        for keep in (False, True):
            what = "kept, the rest regenerated" if keep else "replaced"
            with phases.phase(f"perturb {len(pick)} {name}-entropy tokens: {what}"):
                conditions.append(perturb(engine, model, rollout, candidates[pick], task, answers, verdicts,
                                          max_new_tokens=max_new_tokens, temperature=temperature,
                                          generator=generator, keep_token=keep))
        flips, kept = conditions
        result[f"flips_{name}"] = int(flips.sum())
        result[f"n_{name}"] = int(flips.numel())
        result[f"flip_rate_{name}"] = float(flips.float().mean()) if flips.numel() else math.nan
        result[f"flips_{name}_kept"] = int(kept.sum())
        result[f"flip_rate_{name}_kept"] = float(kept.float().mean()) if kept.numel() else math.nan
        diff, lo, hi = paired_difference_ci(flips, kept)
        attributable[name] = (diff, (hi - lo) / (2 * 1.96))
        result[f"attributable_{name}"] = diff
        result[f"attributable_{name}_ci95"] = [lo, hi]
    ratio, lo, hi = flip_ratio_ci(result["flips_high"], result["n_high"], result["flips_low"], result["n_low"])
    result.update({"flip_ratio": ratio, "flip_ratio_ci95": [lo, hi]})
    (a_high, se_high), (a_low, se_low) = attributable["high"], attributable["low"]
    half = 1.96 * math.sqrt(se_high**2 + se_low**2)
    result.update({"attributable_difference": a_high - a_low,
                   "attributable_difference_ci95": [a_high - a_low - half, a_high - a_low + half]})
    (output_dir / "pivots.json").write_text(json.dumps(result, indent=2))
    return result
