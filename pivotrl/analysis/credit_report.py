"""The writers of `pivotrl credit`: credit.json, report.md, two PNG plots and tokens.html.

Each writes from the content of credit.json alone (the dict `run_credit` returns).
Only this module of `pivotrl credit` imports matplotlib.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from pivotrl.analysis.credit_stats import METRICS, TOP_SHARE  # noqa: E402
from pivotrl.analysis.pivots import token_html  # noqa: E402


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
              "1 − π(o_t) bounds |A*(t)| for rewards in [0, 1]: "
              "a token the policy was sure of cannot move V much.\n",
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
