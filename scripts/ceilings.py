"""The tables and plots of docs/EXPERIMENTS.md, "Ceilings": methods and oracles against GRPO, paired by seed.

    .venv/bin/python scripts/ceilings.py runs/ceil_free [more compare folders] -o docs/experiments/ceilings/free \
        [--baseline grpo] [--ceiling grpo_oracle] [--holm erpo,high_entropy,pivot_mc] [--pooled]

Reads every run of the `pivotrl compare` folders given (their runs/ subfolders, or their records kept by
scripts/keep_runs.py), and with --figures FILE the runs known only by their figures (a JSON file: the
step of their last evaluation, where the figures come from, and per run its label, seed, held-out accuracy
before and after, and generated tokens), whose folders are gone: they count in every test, take the held-out
plot's two points, and leave the dynamics to the runs that have them. A folder given as
PATH@TAG holds runs made under other settings than the rest (say two updates per rollout): its
methods are labelled METHOD@TAG and compared with the baseline's runs in that folder, BASELINE@TAG
(name them so in --holm). Writes into -o:
table.md (per method: seeds, final held-out accuracy with its 95% t-interval, the paired difference
with the baseline, its p-value (Holm-adjusted over the labels given to --holm), the sd of the per-seed
differences and the smallest difference the test detects (α = 0.05, power 0.8; at Holm's first step
for the labels corrected together), the same difference at the first evaluation, generated tokens per run,
mean credit/free_share, and with --ceiling the share of the ceiling's gain each method recovers, where
the ceiling's interval stands above 0; with --pooled, every difference is the difference of the arms' means
with the runs' sd pooled over every arm instead of paired by seed, for a family whose arms have few seeds),
dynamics.md (per method, the mean over seeds of the first and the last five steps' generated tokens, response length, token
entropy, the decisive tokens' entropy and the share of tokens free where the task marks them, and the share of
sampled groups whose rewards all agree), summary.json (both, as numbers), accuracy.png (held-out accuracy over training, mean over
seeds with their range as a band; beside it, where the runs log it, the accuracy of every sampled response over training)
and, when the runs log free vs decisive entropy, entropy.png.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from pivotrl.analysis.paired import (  # noqa: E402
    detectable_difference,
    holm,
    paired_difference,
    pooled_detectable_difference,
    pooled_difference,
)
from pivotrl.analysis.report import mean_ci95  # noqa: E402
from pivotrl.analysis.runs import RunRecord, read_run  # noqa: E402


def split_tag(folder: str) -> tuple[Path, str]:
    """PATH@TAG -> (PATH, "@TAG"); a plain PATH -> (PATH, "")."""
    path, at, tag = folder.rpartition("@")
    return (Path(path), f"@{tag}") if at and tag else (Path(folder), "")


def baseline_of(label: str, baseline: str) -> str:
    """The runs `label` is compared with: the baseline's runs made under the same tag."""
    return baseline + label[label.index("@"):] if "@" in label else baseline


def read_folders(folders: list[str]) -> dict[str, list[RunRecord]]:
    """Finished runs by method label (the compare folder's run names: METHOD-seedN, tagged METHOD@TAG)."""
    runs: dict[str, list[RunRecord]] = defaultdict(list)
    for folder in folders:
        path, tag = split_tag(folder)
        for run in sorted((path / "runs").iterdir()):
            if not (run / "summary.json").is_file():
                print(f"skipping {run}: not finished", file=sys.stderr)
                continue
            label = run.name.rsplit("-seed", 1)[0] + tag
            runs[label].append(read_run(run, label=label))
    return runs


def read_figures(path: Path) -> dict[str, list[RunRecord]]:
    """Runs known only by their figures (see the module's docstring), as records without metrics."""
    try:
        data = json.loads(path.read_text())
        step, rows = int(data["step"]), data["runs"]
        runs: dict[str, list[RunRecord]] = defaultdict(list)
        for r in rows:
            summary = {"heldout_accuracy_before": float(r["before"]), "heldout_accuracy_after": float(r["after"]),
                       "tokens_generated": float(r["tokens"])}
            evals = {0: {"accuracy": summary["heldout_accuracy_before"]}, step: {"accuracy": summary["heldout_accuracy_after"]}}
            runs[r["label"]].append(RunRecord(path, r["label"], int(r["seed"]), [], evals, summary))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SystemExit(f"--figures {path}: {type(err).__name__}: {err}; expected {{\"step\": N, \"source\": ..., "
                         f"\"runs\": [{{\"label\", \"seed\", \"before\", \"after\", \"tokens\"}}, ...]}}") from None
    return runs


def finite_mean(values) -> float:
    """The mean of the finite values (nan when none is): a run known only by its figures has no dynamics."""
    kept = [v for v in values if math.isfinite(v)]
    return statistics.fmean(kept) if kept else math.nan


def per_run(run: RunRecord) -> dict[str, float]:
    steps = run.metrics
    shares = [m["credit/free_share"] for m in steps if isinstance(m.get("credit/free_share"), float)
              and math.isfinite(m["credit/free_share"])]
    early = min((s for s in run.evals if s > 0), default=None)
    return {"before": run.summary["heldout_accuracy_before"], "after": run.summary["heldout_accuracy_after"],
            "early": run.evals[early]["accuracy"] if early is not None else math.nan, "early_step": early,
            "tokens": run.summary.get("tokens_generated", sum(m.get("rollout/tokens_generated", 0.0) for m in steps)),
            "free_share": statistics.fmean(shares) if shares else math.nan,
            "length": run.summary.get("mean_length_after", math.nan)}


DYNAMICS = {"rollout/tokens_generated": "tokens generated a step", "response_length/mean": "response length (tokens)",
            "entropy/mean": "token entropy (nats)", "entropy/decisive_mean": "decisive tokens' entropy", "tokens/free_frac": "share of tokens free",
            "rollout/agreeing_frac": "sampled groups that agree"}


def agreeing_frac(run: RunRecord) -> list[float]:
    """Per step, the share of sampled groups whose rewards all agree. Steps logged before its metric: under
    dynamic sampling the groups kept are those whose rewards differ, so 1 − kept / sampled; otherwise the
    batch's own share."""
    rollout = run.config.get("rollout", {})
    shares = []
    for m in run.metrics:
        if "rollout/agreeing_frac" in m:
            shares.append(m["rollout/agreeing_frac"])
        elif rollout.get("dynamic_sampling") and m.get("rollout/sampled_groups"):
            shares.append(1 - m["rollout/rows"] / rollout["group_size"] / m["rollout/sampled_groups"])
        elif "groups/zero_var_frac" in m:
            shares.append(m["groups/zero_var_frac"])
    return shares


def first_and_last(run: RunRecord, key: str, steps: int = 5) -> tuple[float, float]:
    """The mean of a logged metric over a run's first and last few steps (nan when it is not logged)."""
    values = agreeing_frac(run) if key == "rollout/agreeing_frac" else run.series(key)[1]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values[:steps]), statistics.fmean(values[-steps:])


def dynamics(runs: dict[str, list[RunRecord]]) -> dict[str, dict[str, list[float]]]:
    """Per method and metric: [first steps, last steps], each the mean over seeds."""
    out: dict[str, dict[str, list[float]]] = {}
    for label, rs in runs.items():
        pairs = {key: [first_and_last(r, key) for r in rs] for key in DYNAMICS}
        out[label] = {key: [finite_mean(p[0] for p in ps), finite_mean(p[1] for p in ps)]
                      for key, ps in pairs.items()}
    return out


def dynamics_markdown(rows: dict[str, dict[str, list[float]]]) -> str:
    formats = {"rollout/tokens_generated": ",.0f", "response_length/mean": ".1f"}
    head = ["method"] + [f"{name}, first -> last 5 steps" for name in DYNAMICS.values()]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * len(DYNAMICS)]
    for label, metrics in rows.items():
        cells = ["–" if math.isnan(a) else f"{a:{formats.get(key, '.3f')}} -> {b:{formats.get(key, '.3f')}}"
                 for key, (a, b) in metrics.items()]
        lines.append("| " + " | ".join([label, *cells]) + " |")
    return "\n".join(lines) + "\n"


def difference(values: dict[str, dict[int, dict]], label: str, baseline: str, key: str, pooled: bool) -> dict:
    """label − baseline in `key`: paired by seed, or with the sd pooled over every arm (`pooled`)."""
    method, base = ({s: v[key] for s, v in values[name].items()} for name in (label, baseline))
    if pooled:
        arms = [[v[key] for v in by_seed.values()] for by_seed in values.values()]
        d = pooled_difference(list(method.values()), list(base.values()), arms)
        return {"mean": d.mean, "low": d.low, "high": d.high, "p": d.p_value, "sd": d.sd, "seeds": d.seeds,
                "baseline_seeds": d.baseline_seeds, "df": d.df}
    d = paired_difference(method, base)
    return {"mean": d.mean, "low": d.low, "high": d.high, "p": d.p_value, "sd": d.sd, "seeds": d.seeds}


def compare(runs: dict[str, list[RunRecord]], baseline: str, ceiling: str | None,
            holm_over: list[str], pooled: bool = False) -> dict[str, dict]:
    values = {label: {r.seed: per_run(r) for r in rs} for label, rs in runs.items()}
    missing = sorted({baseline_of(label, baseline) for label in values} - set(values))
    if missing:
        raise SystemExit(f"no finished {', '.join(missing)} runs in the folders given")
    out: dict[str, dict] = {}
    for label, by_seed in values.items():
        finals = [v["after"] for v in by_seed.values()]
        mean, half = mean_ci95(finals)
        row = {"seeds": len(by_seed), "before": statistics.fmean(v["before"] for v in by_seed.values()),
               "after": mean, "after_ci95": half, "length": finite_mean(v["length"] for v in by_seed.values()),
               "tokens": statistics.fmean(v["tokens"] for v in by_seed.values()),
               "free_share": finite_mean(v["free_share"] for v in by_seed.values())}
        if label != baseline_of(label, baseline):
            diff = difference(values, label, baseline_of(label, baseline), "after", pooled)
            row.update(diff=diff["mean"], diff_low=diff["low"], diff_high=diff["high"], p=diff["p"],
                       sd_diff=diff["sd"], paired_seeds=diff["seeds"], test=diff)
            early_steps = {v["early_step"] for name in (label, baseline_of(label, baseline)) for v in values[name].values()}
            if len(early_steps) == 1:  # a first evaluation compared only at one step
                early = difference(values, label, baseline_of(label, baseline), "early", pooled)
                row.update(early_step=early_steps.pop(), early_diff=early["mean"], early_low=early["low"],
                           early_high=early["high"])
            else:
                row.update(early_step=None, early_diff=math.nan, early_low=math.nan, early_high=math.nan)
        out[label] = row
    others = [label for label in out if label != baseline_of(label, baseline)]
    corrected = holm({label: out[label]["p"] for label in others if label in holm_over})
    for label in others:  # Holm's correction over the methods named; each other label is its own question
        tests = len(corrected) if label in corrected else 1
        out[label]["p_adjusted"] = corrected.get(label, out[label]["p"])
        test = out[label].pop("test")
        out[label]["mde"] = (pooled_detectable_difference(test["sd"], test["seeds"], test["baseline_seeds"], test["df"],
                                                          tests=tests)
                             if pooled else detectable_difference(test["sd"], test["seeds"], tests=tests))
    # a share of a gain is read only when the ceiling's interval stands above 0; else the column says "–"
    if ceiling is not None and ceiling in out and out[ceiling]["diff_low"] > 0:
        for label in others:
            out[label]["share_of_ceiling"] = out[label]["diff"] / out[ceiling]["diff"]
    return out


def markdown(rows: dict[str, dict], baseline: str, ceiling: str | None, pooled: bool = False) -> str:
    how, spread = ("pooled", "pooled sd of a run") if pooled else ("paired", "sd of the differences")
    head = ["method", "seeds", "held-out acc. before", "after (mean ± 95% CI)", f"after − {baseline}'s, {how} (95% CI)",
            "p", f"{spread}; MDE", f"first evaluation − baseline's, {how} (95% CI)", "generated tokens per run",
            "credit/free_share", "mean length after"]
    if ceiling:
        head.append(f"share of {ceiling}'s gain")
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for label, r in rows.items():
        if label == baseline_of(label, baseline):
            diff, p, mde, early = "–", "–", "–", "–"
        else:
            diff = f"{r['diff']:+.3f} ({r['diff_low']:+.3f} to {r['diff_high']:+.3f})"
            p = f"{r['p_adjusted']:.3f}" + (" (Holm)" if r["p_adjusted"] != r["p"] else "")
            mde = f"{r['sd_diff']:.3f}; {r['mde']:.3f}"
            early = (f"step {r['early_step']}: {r['early_diff']:+.3f} ({r['early_low']:+.3f} to {r['early_high']:+.3f})"
                     if r["early_step"] is not None else "–")
        spread = f"± {r['after_ci95']:.3f}" if r["seeds"] > 1 else "(one seed)"
        cells = [label, str(r["seeds"]), f"{r['before']:.3f}", f"{r['after']:.3f} {spread}", diff, p,
                 mde, early,
                 f"{r['tokens']:,.0f}", "–" if math.isnan(r["free_share"]) else f"{r['free_share']:.3f}",
                 "–" if math.isnan(r["length"]) else f"{r['length']:.1f}"]
        if ceiling:
            share = r.get("share_of_ceiling")
            cells.append("–" if share is None or label == ceiling else f"{share:+.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    if any("@" in label for label in rows):
        lines.append(f"\nMETHOD@TAG: runs made under other settings, compared with {baseline}@TAG's.")
    return "\n".join(lines) + "\n"


def plot_accuracy(runs: dict[str, list[RunRecord]], path: Path, title: str) -> None:
    """Held-out accuracy at each evaluation (mean over seeds, the band their range), and where the runs log it,
    the accuracy over every sampled response (`rollout/sampled_accuracy`, dynamic sampling) over training,
    a 5-step running mean (mean over seeds, the band their range)."""
    sampled = any(r.series("rollout/sampled_accuracy")[1] for rs in runs.values() for r in rs)
    fig, axes = plt.subplots(1, 2 if sampled else 1, figsize=(12 if sampled else 7, 4.2), dpi=120, squeeze=False)
    held, train = axes[0][0], axes[0][-1]
    for i, (label, rs) in enumerate(runs.items()):
        colour = f"C{i}"
        steps = sorted(set.intersection(*[set(r.evals) for r in rs]))
        values = [[r.evals[s]["accuracy"] for r in rs] for s in steps]
        held.plot(steps, [statistics.fmean(v) for v in values], marker="o", markersize=3, color=colour,
                  label=f"{label} ({len(rs)} seed{'s' if len(rs) > 1 else ''})")
        held.fill_between(steps, [min(v) for v in values], [max(v) for v in values], color=colour, alpha=0.15)
        if sampled:
            series = [dict(zip(*r.series("rollout/sampled_accuracy"), strict=True)) for r in rs]
            series = [x for x in series if x]  # runs known only by their figures have none
            if not series:
                continue
            common = sorted(set.intersection(*[set(x) for x in series]))
            smooth = [[statistics.fmean(x[t] for t in common[max(0, k - 4): k + 1]) for k in range(len(common))]
                      for x in series]
            train.plot(common, [statistics.fmean(col) for col in zip(*smooth, strict=True)], color=colour, label=label)
            train.fill_between(common, [min(col) for col in zip(*smooth, strict=True)],
                               [max(col) for col in zip(*smooth, strict=True)], color=colour, alpha=0.15)
    held.set_ylabel("held-out accuracy (mean over seeds; band: their range)")
    held.set_title(title, fontsize=10)
    if sampled:
        train.set_ylabel("accuracy of all sampled responses (5-step mean)")
        train.set_title("training: every response sampled, dynamic sampling's refills included", fontsize=10)
    for ax in axes[0]:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_entropy(runs: dict[str, list[RunRecord]], path: Path, title: str) -> bool:
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    drawn = False
    for i, (label, rs) in enumerate(runs.items()):
        colour = f"C{i}"
        for key, style in (("entropy/free_mean", "-"), ("entropy/decisive_mean", "--")):
            series = [dict(zip(*r.series(key), strict=True)) for r in rs]
            steps = sorted(set.intersection(*[set(s) for s in series])) if series else []
            if not steps:
                continue
            drawn = True
            ax.plot(steps, [statistics.fmean(s[t] for s in series) for t in steps], style, color=colour,
                    label=f"{label}: {key.split('/')[1].removesuffix('_mean')}")
    if drawn:
        ax.set_xlabel("step")
        ax.set_ylabel("mean token entropy (nats), mean over seeds")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(path)
    plt.close(fig)
    return drawn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", help="pivotrl compare output folders; PATH@TAG for runs made under "
                        "other settings, compared with that folder's own baseline runs")
    parser.add_argument("-o", "--output-dir", type=Path, required=True)
    parser.add_argument("--baseline", default="grpo")
    parser.add_argument("--ceiling", default=None, help="the oracle whose gain the methods' gains are shares of")
    parser.add_argument("--holm", default="", help="comma-separated labels compared with the baseline as several "
                        "tests, corrected together (Holm); any other label is its own question")
    parser.add_argument("--pooled", action="store_true", help="differences of the arms' means with the runs' sd "
                        "pooled over every arm (for arms with few seeds), instead of paired by seed")
    parser.add_argument("--figures", type=Path, action="append", default=[], help="a JSON file of runs known only "
                        "by their figures (their folders gone); repeatable")
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    if not args.folders and not args.figures:
        parser.error("give a compare folder or --figures")
    for folder in args.folders:
        if not (split_tag(folder)[0] / "runs").is_dir():
            parser.error(f"{split_tag(folder)[0]} is not a pivotrl compare folder (no runs/)")
    runs = read_folders(args.folders)
    for path in args.figures:
        for label, records in read_figures(path).items():
            runs[label].extend(records)
    for label, records in runs.items():
        seeds = [r.seed for r in records]
        if len(set(seeds)) < len(seeds):
            parser.error(f"{label}: a seed given twice ({sorted(seeds)}), in {sorted({str(r.path) for r in records})}")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    rows = compare(runs, args.baseline, args.ceiling, [m for m in args.holm.split(",") if m], args.pooled)
    table = markdown(rows, args.baseline, args.ceiling, args.pooled)
    trends = dynamics(runs)
    trends_table = dynamics_markdown(trends)
    (args.output_dir / "table.md").write_text(table)
    (args.output_dir / "dynamics.md").write_text(trends_table)
    for label, row in rows.items():
        row["dynamics"] = trends[label]
    (args.output_dir / "summary.json").write_text(json.dumps(rows, indent=1))
    plot_accuracy(runs, args.output_dir / "accuracy.png", args.title or "held-out accuracy")
    plot_entropy(runs, args.output_dir / "entropy.png",
                 ": ".join(filter(None, [args.title, "free (—) vs decisive (--) entropy"])))
    print(table)
    print(trends_table)


if __name__ == "__main__":
    main()
