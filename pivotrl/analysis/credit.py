"""`pivotrl credit`: do the estimators put their credit on the tokens that decide the outcome?

The ground truth is the true advantage of every sampled token (the quantity that
Forking Paths, arXiv 2412.07961, and cDPO, arXiv 2411.19943, estimate by
Monte-Carlo continuations): for a response o with T tokens (its EOS included)
and a 0-based position t < T,

    V(t)  = E[R | prompt, o_<t], completing from position t onward with the policy
            at the sampling temperature, within the same token budget;
    A*(t) = V(t+1) - V(t);       V(T) = R exactly.

V(t) is the mean reward of K continuations of the prefix o_<t, with Monte-Carlo
standard error s/sqrt(K) (s: the sample standard deviation of the K rewards); the
standard error of A*(t) is sqrt(se(t)^2 + se(t+1)^2). Every distinct prefix is
estimated once: V(t+1) of one position is V(t) of the next, and responses of one
group that start alike share their prefixes (V(0) is the prompt's value).

The module has three layers: `estimate_values` (the only part that samples),
pure statistics on numpy arrays (`spearman`, `centre_per_response`,
`estimator_metrics`, `bootstrap_ci`, ...), and the writers at the edge
(credit.json, report.md, two PNG plots, tokens.html). ALGORITHMS.md, section
"Credit ground truth", defines every metric.
"""

from __future__ import annotations

import html
import json
import math
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from torch import Tensor  # noqa: E402

from pivotrl.algorithms import ESTIMATORS, TokenBatch, compute_advantages  # noqa: E402
from pivotrl.analysis.compare import ABLATIONS  # noqa: E402
from pivotrl.analysis.credit_stats import (  # noqa: E402
    METRICS,
    TOP_SHARE,
    bootstrap_ci,
    decile_means,
    entropy_deciles,
    estimator_metrics,
    select_positions,
    top_mass_share,
    top_weights,
    triplet,
)
from pivotrl.analysis.pivots import token_html  # noqa: E402
from pivotrl.analysis.values import ValueTable, estimate_values, needed_values, true_advantages  # noqa: E402
from pivotrl.progress import Phases  # noqa: E402
from pivotrl.rewards.safe import safe_score  # noqa: E402
from pivotrl.rollout import Rollout, RolloutEngine  # noqa: E402
from pivotrl.rollout.branching import branch_and_value  # noqa: E402
from pivotrl.rollout.forward import response_logprobs  # noqa: E402

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
    """Every scored estimator's (N,T) advantages on the batch (see scored_estimators)."""
    return {label: compute_advantages(name, batch, **kwargs)
            for label, (name, kwargs) in scored_estimators(ablations).items()}


# -- the whole measurement ----------------------------------------------------------------------------


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


def run_credit(model: torch.nn.Module, tokenizer: Any, engine: RolloutEngine, task: Any, problems: list[Any], prompts: list[str],
               output_dir: Path, *, model_name: str = "", task_name: str = "", ref_model: torch.nn.Module | None = None,
               ref_name: str | None = None, group_size: int = 8, k: int = 32, max_new_tokens: int = 34,
               temperature: float = 1.0, positions_per_decile: int | None = None, ablations: bool = False,
               seed: int = 0, batch_rows: int = 4096, bootstrap: int = 1000,
               html_estimators: tuple[str, ...] = ("grpo", "erpo"), pivots: int = 2, branches: int = 4,
               spacing: int = 4, phases: Phases | None = None) -> dict[str, Any]:
    """Sample, estimate A*, score every estimator against it; write credit.json, report.md, plots, tokens.html.

    pivot_mc's branches (`pivots` per response, `branches` each, `spacing` apart) are sampled with
    their own generator, independently of the K continuations that estimate A*.

    `phases` shows the progress of each phase and logs its seconds (default: nothing shown).
    Returns the content of credit.json.
    """
    phases = phases or Phases()
    check_options(group_size=group_size, k=k, max_new_tokens=max_new_tokens, temperature=temperature,
                  positions_per_decile=positions_per_decile, ablations=ablations, batch_rows=batch_rows,
                  bootstrap=bootstrap, html_estimators=html_estimators)
    if not problems:
        raise ValueError("no problems to sample")
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
    batch = TokenBatch(rewards.to(logprobs.device), rollout.group_index.to(logprobs.device), mask, logprobs, ref_lp,
                       entropies, pivot_values=values)
    advantages = {name: adv.double().cpu() for name, adv in estimator_advantages(batch, ablations).items()}
    deciles = entropy_deciles(entropies, mask)
    positions = select_positions(mask, deciles, positions_per_decile, generator)
    clock["sampled"] = time.perf_counter()
    needed = needed_values(positions, mask.shape[1], mask.shape[0])
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
                                 settings=settings, rng=np.random.default_rng(seed))
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
                    rng: np.random.Generator) -> dict[str, Any]:
    """The content of credit.json: settings, responses, positions, per-estimator metrics, entropy deciles.

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
        responses.append({
            "prompt": tokenizer.decode(rollout.prompt_ids[i][rollout.prompt_mask[i]].tolist(), skip_special_tokens=True),
            "prompt_ids": rollout.prompt_ids[i][rollout.prompt_mask[i]].tolist(),
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
        })
    point = estimator_metrics(adv, star_np, se_np, run_lengths)
    resamples = settings["bootstrap"]
    low, high = bootstrap_ci(lambda idx, lens: estimator_metrics(adv[:, idx], star_np[idx], se_np[idx], lens),
                             run_lengths, resamples, rng)
    estimators = {name: {metric: triplet(low[e, m], point[e, m], high[e, m]) for m, metric in enumerate(METRICS)}
                  for e, name in enumerate(names)}
    position_deciles = deciles[rows, ts].numpy()
    abs_star = np.abs(star_np)
    point_d = decile_means(abs_star, position_deciles)
    low_d, high_d = bootstrap_ci(lambda idx, lens: decile_means(abs_star[idx], position_deciles[idx]),
                                 run_lengths, resamples, rng)
    valid_h = entropies[mask].numpy()
    valid_d = deciles[mask].numpy()
    noise = se_np * math.sqrt(2 / math.pi)
    bound = 1 - logprobs[rows, ts].exp().numpy()
    decile_rows = []
    for d in range(10):
        here = position_deciles == d
        decile_rows.append({
            "decile": d + 1, "entropy_low": float(valid_h[valid_d == d].min()) if (valid_d == d).any() else None,
            "entropy_high": float(valid_h[valid_d == d].max()) if (valid_d == d).any() else None,
            "positions": int(here.sum()), "mean_abs_advantage_true": triplet(low_d[d], point_d[d], high_d[d]),
            "noise_floor": float(noise[here].mean()) if here.any() else None,
            "mean_sq_debiased": float((star_np[here] ** 2 - se_np[here] ** 2).mean()) if here.any() else None,
            "bound_mean": float(bound[here].mean()) if here.any() else None,
        })
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
    return {"settings": settings, "summary": summary, "responses": responses, "positions": position_rows,
            "estimators": estimators,
            "entropy_deciles": {"deciles": decile_rows,
                                "top_bottom_ratio": triplet(low_d[10], point_d[10], high_d[10])}}


# -- writers --------------------------------------------------------------------------------------------


def write_outputs(result: dict[str, Any], output_dir: Path, html_estimators: tuple[str, ...]) -> None:
    """credit.json, report.md, entropy_deciles.png, estimators.png and tokens.html in output_dir."""
    (output_dir / "credit.json").write_text(json.dumps(result, indent=1, default=str))
    plot_deciles(result, output_dir / "entropy_deciles.png")
    plot_estimators(result, output_dir / "estimators.png")
    write_html(result, output_dir / "tokens.html", html_estimators)
    (output_dir / "report.md").write_text(markdown_report(result))


def cell(values: list[float | None], spec: str = ".3f", undefined: str = "undefined") -> str:
    """'0.123 [0.100, 0.150]' from [low, estimate, high]; `undefined` when the estimate is None."""
    low, estimate, high = values
    if estimate is None:
        return undefined
    bounds = ", ".join("–" if v is None else format(v, spec) for v in (low, high))
    return f"{format(estimate, spec)} [{bounds}]"


METRIC_HEADERS = {
    "spearman": "Spearman ρ, all tokens",
    "within_response_spearman": "Spearman ρ within responses",
    "sign_agreement": "sign agreement",
    "sign_agreement_significant": "sign agreement where \\|A*\\| > 1.96 se",
    "top10_mass": "share of \\|A\\| on the top-10% \\|A*\\| tokens",
}


def markdown_report(result: dict[str, Any]) -> str:
    """report.md, a function of credit.json's content alone."""
    s, m = result["settings"], result["summary"]
    positions = ("all positions" if s["positions_per_decile"] is None
                 else f"up to {s['positions_per_decile']} positions per entropy decile")
    wall = m.get("wall_time_s", {})
    lines = [
        "# pivotrl credit\n",
        f"Policy `{s['model']}`, reference: {s['ref']}. Task {s['task']} ({s['split']} split), "
        f"{s['num_prompts']} prompts x {s['group_size']} responses at temperature {s['temperature']}, at most "
        f"{s['max_new_tokens']} new tokens, seed {s['seed']}. Sample accuracy {m['accuracy']:.3f}, mean length "
        f"{m['mean_length']:.1f} tokens.\n",
        f"Ground truth A*(t) = V(t+1) - V(t), V estimated by K = {s['k']} continuations per distinct prefix "
        f"({m.get('prefixes', '?')} prefixes, {m.get('continuations', '?')} continuations), at {positions} "
        f"({m['positions']} of {m['tokens']} tokens). Monte-Carlo standard error of A*: mean "
        f"{_num(m['se_mean'])}, median {_num(m['se_median'])}, 90th percentile {_num(m['se_p90'])}.\n",
    ]
    if wall:
        lines.append(f"Wall time {wall['total']:.0f} s (sampling and forward {wall['sample_and_forward']:.0f} s, "
                     f"continuations {wall['continuations']:.0f} s, metrics {wall['metrics']:.0f} s).\n")
    lines += ["## Estimators against A*\n",
              f"Point estimate [95% bootstrap interval over responses, {s['bootstrap']} resamples].\n",
              "| estimator | " + " | ".join(METRIC_HEADERS[k] for k in METRICS) + " |",
              "|---|" + "---:|" * len(METRICS)]
    for name, metrics in result["estimators"].items():
        lines.append(f"| {name} | " + " | ".join(cell(metrics[k]) for k in METRICS) + " |")
    lines += ["",
              "*undefined*: no value exists, e.g. an estimator that gives every token of a response the same "
              "advantage (GRPO, Dr. GRPO, RLOO) has nothing left once centred per response. "
              "A uniform spread of |A| puts 0.100 of its mass on the top-10% tokens; "
              f"|A*| itself puts {_num(m['top10_mass_of_true'])} there.\n",
              "## Pivots: |A*| by entropy decile\n",
              "| decile | entropy (nats) | positions | mean \\|A*\\| [95% CI] | noise floor | mean A*² − se² "
              "| mean 1 − π(o_t) |",
              "|---:|---|---:|---|---:|---:|---:|"]
    for row in result["entropy_deciles"]["deciles"]:
        span = ("–" if row["entropy_low"] is None
                else f"{row['entropy_low']:.3f}–{row['entropy_high']:.3f}")
        lines.append(f"| {row['decile']} | {span} | {row['positions']} | "
                     f"{cell(row['mean_abs_advantage_true'])} | {_num(row['noise_floor'])} | "
                     f"{_num(row['mean_sq_debiased'], '.4f')} | {_num(row.get('bound_mean'))} |")
    ratio = result["entropy_deciles"]["top_bottom_ratio"]
    lines += ["",
              f"Ratio of mean |A*|, top decile / bottom decile: **{cell(ratio, '.2f')}**.\n",
              "Noise floor: mean of se·√(2/π), the mean |A*| that tokens whose true advantage is 0 would show; "
              "mean A*² − se² is an unbiased estimate of the mean squared true advantage. "
              "1 − π(o_t) bounds |A*(t)| for rewards in [0, 1]: a token the policy was sure of cannot move V much.\n",
              "![mean |A*| by entropy decile](entropy_deciles.png)\n",
              "![estimators against A*](estimators.png)\n"]
    return "\n".join(lines)


def _num(value: float | None, spec: str = ".3f") -> str:
    return "–" if value is None else format(value, spec)


def plot_deciles(result: dict[str, Any], path: Path) -> None:
    """Mean |A*| per entropy decile with 95% CIs, and the noise floor."""
    rows = result["entropy_deciles"]["deciles"]
    x = [r["decile"] for r in rows]
    est = [np.nan if r["mean_abs_advantage_true"][1] is None else r["mean_abs_advantage_true"][1] for r in rows]
    low = [np.nan if r["mean_abs_advantage_true"][0] is None else r["mean_abs_advantage_true"][0] for r in rows]
    high = [np.nan if r["mean_abs_advantage_true"][2] is None else r["mean_abs_advantage_true"][2] for r in rows]
    noise = [np.nan if r["noise_floor"] is None else r["noise_floor"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    err = np.array([np.subtract(est, low), np.subtract(high, est)])
    ax.bar(x, est, color="tab:orange", alpha=0.85, yerr=np.nan_to_num(err), capsize=3, label="mean |A*| (95% CI)")
    ax.plot(x, noise, color="tab:gray", linestyle="--", marker="o", markersize=3, label="noise floor (se·√(2/π))")
    ratio = result["entropy_deciles"]["top_bottom_ratio"]
    title = "|A*| by entropy decile of the sampled token"
    if ratio[1] is not None:
        title += f"\n(top / bottom decile: {cell(ratio, '.2f')})"
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("entropy decile of the policy at the token (1 = lowest)")
    ax.set_ylabel("mean |A*| = |V(t+1) − V(t)|")
    ax.set_xticks(x)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_estimators(result: dict[str, Any], path: Path) -> None:
    """Per estimator: the two Spearman correlations with A* and the top-10% mass share, with 95% CIs."""
    names = list(result["estimators"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 0.45 * len(names) + 1.8), dpi=120, sharey=True)
    y = np.arange(len(names))
    for ax, keys, colours in ((left, ("spearman", "within_response_spearman"), ("tab:blue", "tab:green")),
                              (right, ("top10_mass",), ("tab:purple",))):
        height = 0.8 / len(keys)
        handles = [Patch(color=colour, alpha=0.85, label=METRIC_HEADERS[key].replace("\\", ""))
                   for key, colour in zip(keys, colours, strict=True)]
        for j, (key, colour) in enumerate(zip(keys, colours, strict=True)):
            pos = y - 0.4 + height * (j + 0.5)
            for p, name in zip(pos, names, strict=True):
                low, est, high = result["estimators"][name][key]
                if est is None:
                    ax.text(0, p, " undefined", va="center", fontsize=7, color=colour)
                    continue
                ax.barh(p, est, height=height, color=colour, alpha=0.85,
                        xerr=[[est - (low if low is not None else est)], [(high if high is not None else est) - est]],
                        capsize=2)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.grid(alpha=0.3, axis="x")
        ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.04), ncol=len(keys))
    right.axvline(TOP_SHARE, color="tab:gray", linestyle="--", linewidth=1)
    left.set_yticks(y, names)
    left.invert_yaxis()
    left.set_title("Spearman correlation with A* (95% CI)", fontsize=10)
    right.set_title("share of |A| on the top-10% |A*| tokens\n(dashed: uniform spread)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_html(result: dict[str, Any], path: Path, estimators: tuple[str, ...]) -> None:
    """One block per response: tokens coloured by entropy, by A*, and by each chosen estimator's advantage."""
    by_response: dict[int, dict[int, dict[str, Any]]] = {}
    for pos in result["positions"]:
        by_response.setdefault(pos["response"], {})[pos["t"]] = pos
    stars = [abs(p["advantage_true"]) for p in result["positions"]]
    star_scale = float(np.quantile(stars, 0.98)) if stars else 1.0
    scales = {}
    for name in estimators:
        values = [abs(p["advantages"][name]) for p in result["positions"]]
        scales[name] = float(np.quantile(values, 0.98)) if values else 1.0
    entropies = [h for r in result["responses"] for h in r["entropies"]]
    h_scale = float(np.quantile(entropies, 0.98)) if entropies else 1.0
    blocks = []
    for i, response in enumerate(result["responses"]):
        at = by_response.get(i, {})
        pieces = response["tokens"]
        n = len(pieces)
        star = [at[t]["advantage_true"] if t in at else None for t in range(n)]
        rows = [token_html(pieces, response["entropies"], h_scale, False, "entropy"),
                token_html(pieces, star, star_scale, True, "A*")]
        rows += [token_html(pieces, [at[t]["advantages"][name] if t in at else None for t in range(n)],
                            scales[name], True, name) for name in estimators]
        blocks.append(
            f'<div class="resp" data-tokens="{n}"><div class="meta">response {i} · group {response["group"]} · '
            f'reward {response["reward"]:.2f} · prompt: <code>{html.escape(response["prompt"].strip())}</code></div>'
            + "".join(rows) + "</div>")
    style = ("body{font-family:sans-serif;margin:2em}.resp{margin:1.2em 0;padding:.5em;border-bottom:1px solid #ddd}"
             ".row{font-family:monospace;white-space:nowrap;margin:2px 0}.tok{padding:1px 1px;border-radius:2px}"
             ".lab{display:inline-block;width:9em;color:#555}.meta{color:#333;margin-bottom:4px}")
    s = result["settings"]
    legend = (f"<p>Policy <code>{html.escape(str(s['model']))}</code>, task {html.escape(str(s['task']))}, "
              f"K = {s['k']} continuations per prefix. Rows per response: the policy's entropy (orange, full colour "
              f"at {h_scale:.2f} nats); the true advantage A* = V(t+1) − V(t) (full colour at |A*| = "
              f"{star_scale:.2f}); then each estimator's advantage, each on its own scale (full colour at its "
              "98th percentile of |A|). Red positive, blue negative, grey outline: not estimated. "
              "Hover a token for its value.</p>")
    path.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'><title>pivotrl credit</title>"
                    f"<style>{style}</style></head><body><h1>Credit against Monte-Carlo ground truth</h1>{legend}"
                    + "".join(blocks) + "</body></html>")
