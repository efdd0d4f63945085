"""Plots and a markdown table comparing methods over seeds (`pivotrl report`, and `compare`'s output)."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from pivotrl.analysis.runs import RunRecord  # noqa: E402

# two-sided 95% Student t quantiles by degrees of freedom (1..30); normal beyond
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]

ENTROPY_WINDOW = 10  # the table's entropy: mean over a run's last this many steps

PLOTS = {
    "accuracy": ("held-out accuracy (pass@1)", "fraction of problems solved"),
    "entropy/mean": ("policy entropy", "mean token entropy (nats)"),
    "response_length/mean": ("response length", "mean response length (tokens)"),
    "clip/frac": ("clip fraction", "fraction of tokens clipped"),
}


def mean_ci95(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (0 for a single value)."""
    if not values:
        return math.nan, math.nan
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    t = _T95[len(values) - 2] if len(values) - 1 <= len(_T95) else 1.96
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


def difference_ci95(values: list[float], baseline: list[float]) -> tuple[float, float]:
    """mean(values) - mean(baseline) and the half-width of its 95% Welch t-interval (NaN below 2 each)."""
    if len(values) < 2 or len(baseline) < 2:
        return (statistics.fmean(values) - statistics.fmean(baseline) if values and baseline else math.nan), math.nan
    va, vb = statistics.variance(values) / len(values), statistics.variance(baseline) / len(baseline)
    diff = statistics.fmean(values) - statistics.fmean(baseline)
    if va + vb == 0:
        return diff, 0.0
    df = (va + vb) ** 2 / (va**2 / (len(values) - 1) + vb**2 / (len(baseline) - 1))  # Welch-Satterthwaite
    t = _T95[max(int(df), 1) - 1] if df <= len(_T95) else 1.96  # whole df rounded down: the wider interval
    return diff, t * math.sqrt(va + vb)


def by_method(runs: list[RunRecord]) -> dict[str, list[RunRecord]]:
    """Runs grouped by method label, in first-seen order."""
    groups: dict[str, list[RunRecord]] = defaultdict(list)
    for run in runs:
        groups[run.method].append(run)
    return dict(groups)


def eval_curve(run: RunRecord) -> tuple[list[int], list[float]]:
    """(steps, held-out accuracy) from a run's evaluations."""
    steps = sorted(run.evals)
    return steps, [float(run.evals[s]["accuracy"]) for s in steps]


def _aligned(curves: list[tuple[list[int], list[float]]]) -> tuple[list[int], list[list[float]]]:
    """Steps present in every curve, and the values of each curve there."""
    common = sorted(set.intersection(*(set(s) for s, _ in curves))) if curves else []
    table = [[dict(zip(s, v, strict=True))[step] for s, v in curves] for step in common]
    return common, table


def plot_metric(groups: dict[str, list[RunRecord]], key: str, path: Path) -> Path:
    """One PNG: the mean over seeds per method (line) and the min-max band over seeds."""
    fig = metric_figure(groups, key)
    fig.savefig(path)
    plt.close(fig)
    return path


def metric_figure(groups: dict[str, list[RunRecord]], key: str) -> plt.Figure:
    """The figure of plot_metric. Every plotted quantity is >= 0, so the y axis never shows
    negative values, and its ticks are the values themselves (no '+4.635' offset)."""
    title, ylabel = PLOTS[key]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for method, runs in groups.items():
        curves = [eval_curve(r) if key == "accuracy" else r.series(key) for r in runs]
        curves = [c for c in curves if c[0]]
        if not curves:
            continue
        steps, table = _aligned(curves)
        if not steps:
            continue
        mean = [statistics.fmean(row) for row in table]
        line, = ax.plot(steps, mean, label=f"{method} (n={len(curves)})", linewidth=1.6,
                        marker="o" if len(steps) <= 12 else None, markersize=3)
        if len(curves) > 1:
            ax.fill_between(steps, [min(r) for r in table], [max(r) for r in table], color=line.get_color(), alpha=0.18)
    ax.set_title(f"{title} vs training step\n(line: mean over seeds; band: min to max over seeds)", fontsize=10)
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    ax.ticklabel_format(axis="y", useOffset=False)
    bottom, top = ax.get_ylim()
    ax.set_ylim(max(bottom, 0.0), top if top > max(bottom, 0.0) else 1.0)
    fig.tight_layout()
    return fig


def method_rows(groups: dict[str, list[RunRecord]], baseline: str = "grpo") -> list[dict[str, Any]]:
    """One row per method: final accuracy ± 95% CI, steps to the baseline's final accuracy, and more."""
    finals = {m: [r.summary.get("heldout_accuracy_after", _last_eval(r, "accuracy")) for r in runs]
              for m, runs in groups.items()}
    base = groups.get(baseline)
    base_finals = [v for v in finals[baseline] if v is not None] if base else []
    base_final = statistics.fmean(base_finals) if base_finals else None  # None: the baseline was never evaluated
    rows = []
    gains: dict[str, list[float]] = {}
    for method, runs in groups.items():
        acc = [v for v in finals[method] if v is not None]
        mean, half = mean_ci95(acc)
        row: dict[str, Any] = {"method": method, "seeds": len(runs), "accuracy": mean, "ci95": half,
                               "finals": len(acc)}
        row["before"] = _mean([r.summary.get("heldout_accuracy_before") for r in runs])
        gains[method] = [float(r.summary["heldout_accuracy_after"]) - float(r.summary["heldout_accuracy_before"])
                         for r in runs if r.summary.get("heldout_accuracy_after") is not None
                         and r.summary.get("heldout_accuracy_before") is not None]
        row["gain"], row["gain_ci95"] = mean_ci95(gains[method])
        row["mean_length"] = _mean([r.summary.get("mean_length_after", _last_eval(r, "mean_length")) for r in runs])
        row["trace_validity"] = _mean([_last_eval(r, "trace_validity_correct") for r in runs])
        row["entropy"] = _mean([_mean(r.series("entropy/mean")[1][-ENTROPY_WINDOW:]) for r in runs])
        stat_keys = sorted({k for r in runs for k in (r.evals[max(r.evals)] if r.evals else {})
                            if k.startswith("mean_") and k != "mean_length"})
        row["task_stats"] = {k: _mean([_last_eval(r, k) for r in runs]) for k in stat_keys}
        k_keys = sorted({k for r in runs for e in r.evals.values() for k in e if k.startswith("pass@")})
        row["pass@k"] = {k: _mean([_last_eval(r, k) for r in runs]) for k in k_keys}
        row["wall_time_s"] = _mean([r.summary.get("wall_time_s") for r in runs])
        row["tokens"] = _mean([generated_tokens(r) for r in runs])
        row["branch_tokens"] = _mean([sum(r.series("rollout/branch_tokens")[1]) for r in runs])
        row["steps_to_baseline"] = None
        if base_final is not None:
            steps, table = _aligned([eval_curve(r) for r in runs if r.evals])
            hit = [s for s, vals in zip(steps, table, strict=True) if statistics.fmean(vals) >= base_final and s > 0]
            row["steps_to_baseline"] = hit[0] if hit else None
        rows.append(row)
    for row in rows:  # the gain over each run's own start, against the baseline's (seeds may start apart)
        row["gain_vs_baseline"] = difference_ci95(gains[row["method"]], gains[baseline]) if base else (math.nan, math.nan)
    return rows


def generated_tokens(run: RunRecord) -> float | None:
    """Every token the run sampled (rollout/tokens_generated summed over its steps; branches included)."""
    steps, values = run.series("rollout/tokens_generated")
    return sum(values) if steps and len(steps) == len(run.metrics) else None


def _last_eval(run: RunRecord, key: str) -> Any:
    return run.evals[max(run.evals)].get(key) if run.evals else None


def _mean(values: list[Any]) -> float | None:
    good = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return statistics.fmean(good) if good else None


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def markdown_table(rows: list[dict[str, Any]], baseline: str = "grpo") -> str:
    """The comparison table as markdown."""
    k_keys = sorted({k for r in rows for k in r["pass@k"]})
    stat_keys = sorted({k for r in rows for k in r["task_stats"]})
    has_baseline = any(r["method"] == baseline for r in rows)
    head = ["method", "seeds", "held-out acc. before", "final held-out acc. (mean ± 95% CI)",
            "gain: after − before (mean ± 95% CI)",
            *([f"gain − {baseline}'s gain (95% Welch CI)"] if has_baseline else []),
            *([f"steps to {baseline}'s final acc."] if has_baseline else []), "mean length (tokens)",
            *[k.removeprefix("mean_").replace("_", " ") + " per response" for k in stat_keys],
            "trace validity (correct)", f"entropy, last {ENTROPY_WINDOW} steps (nats)", *k_keys,
            "generated tokens per run (branches)", "wall time (s)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        spread = f"± {_fmt(r['ci95'])}" if r["finals"] > 1 else f"(n={r['finals']}, no interval)"
        gain_spread = f"± {_fmt(r['gain_ci95'])}" if r["finals"] > 1 else "(n=1)"
        diff, half = r["gain_vs_baseline"]
        versus = "–" if r["method"] == baseline else (
            f"{diff:+.3f} ({diff - half:+.3f} to {diff + half:+.3f})" if math.isfinite(half) else f"{_fmt(diff, '+.3f')} (no interval)")
        cells = [r["method"], str(r["seeds"]), _fmt(r["before"]), f"{_fmt(r['accuracy'])} {spread}",
                 f"{_fmt(r['gain'], '+.3f')} {gain_spread}", *([versus] if has_baseline else []),
                 *([_fmt(r["steps_to_baseline"], "d") if r["steps_to_baseline"] is not None else "not reached"]
                   if has_baseline else []),
                 _fmt(r["mean_length"], ".1f"), *[_fmt(r["task_stats"].get(k), ".2f") for k in stat_keys],
                 _fmt(r["trace_validity"]), _fmt(r["entropy"]),
                 *[_fmt(r["pass@k"].get(k)) for k in k_keys],
                 f"{_fmt(r['tokens'], ',.0f')} ({_fmt(r['branch_tokens'], ',.0f')})", _fmt(r["wall_time_s"], ".0f")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def eval_sizes(runs: list[RunRecord]) -> list[tuple[Any, Any]]:
    """The distinct (problems, samples per problem) of the runs' evaluations."""
    return sorted({(e.get("num_problems"), e.get("samples_per_problem")) for r in runs for e in r.evals.values()},
                  key=str)


def report_warnings(runs: list[RunRecord], by_design: tuple[str, ...] = ()) -> list[str]:
    """What makes a comparison of these runs meaningless or unfair, one sentence each.

    `by_design`: settings (dotted prefixes) the comparison varies on purpose besides the
    method, such as a group size set for one method to match a token budget."""
    warnings = []
    sizes = eval_sizes(runs)
    if len(sizes) > 1:
        listed = "; ".join(f"{n} problems x {k} sample(s)" for n, k in sizes)
        warnings.append(f"the runs were evaluated on different numbers of problems ({listed}): their accuracies "
                        "are not comparable; evaluate every run on the same problems")
    budgets = {m: _mean([generated_tokens(r) for r in rs]) for m, rs in by_method(runs).items()}
    known = {m: b for m, b in budgets.items() if b}
    if known and max(known.values()) > 1.1 * min(known.values()):
        listed = ", ".join(f"{m} {b:,.0f}" for m, b in known.items())
        warnings.append(f"the methods sampled unequal numbers of tokens per run ({listed}; branches included): "
                        "hold them to one budget (e.g. `compare --set grpo:rollout.group_size=...`) before "
                        "reading a difference as better credit")
    other = {k: v for k, v in config_spread(runs).items() if not _under(k, (*BY_DESIGN, *by_design))}
    if other:
        listed = "; ".join(f"{k}: {' / '.join(sorted({_value(x) for x in values}))}" for k, values in other.items())
        warnings.append(f"the runs differ in more than the method and the seed ({listed}): their results are "
                        "not comparable; each run's own settings are listed under Runs")
    rewards = [v for r in runs for v in r.series("reward/mean")[1]]
    if rewards and all(v == 0 for v in rewards):
        warnings.append("every reward of every run is 0 (no sampled response was ever right): no method got a "
                        "learning signal, so the comparison shows nothing; start from a policy that is sometimes "
                        "right (e.g. model.name_or_path=tiny) or use an easier task")
    return warnings


#: Settings in which the runs of one comparison differ by design: the method and the seed.
BY_DESIGN = ("algorithm", "rollout.branch", "rollout.dynamic_sampling", "rollout.max_resample_rounds", "rollout.overlong_shaping",
             "rollout.overlong_cache", "train.seed", "label")
#: Settings that change nothing a run computes (where it is, how it logs, saves, its CPU threads, and
#: whether it reused its evaluation before training).
NOT_COMPARED = ("output_dir", "log", "checkpoint", "train.num_threads", "eval.reuse_before")


def _under(key: str, prefixes: tuple[str, ...]) -> bool:
    return any(key == p or key.startswith(f"{p}.") for p in prefixes)


def config_spread(runs: list[RunRecord]) -> dict[str, list[Any]]:
    """Each setting (dotted key, NOT_COMPARED left out) whose value is not the same in every run's
    own config.yaml -> its value in each of the runs that have one (None where a run does not set it)."""
    from pivotrl.train.config import flat_config

    flats = [flat_config(r.config) for r in runs if r.config]
    keys = sorted({k for f in flats for k in f if not _under(k, NOT_COMPARED)})
    spread = {}
    for key in keys:
        values = [f.get(key) for f in flats]
        if any(v != values[0] for v in values):
            spread[key] = values
    return spread


def _value(value: Any) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value)


def _setting(key: str, value: Any) -> str:
    return f"{key}={_value(value)}"


#: The settings the report names when every run shares them (the rest are in each config.yaml).
HEADLINE = ("model.name_or_path", "task.name", "train.max_steps", "train.lr", "rollout.prompts_per_step",
            "rollout.group_size", "rollout.temperature", "eval.num_problems", "eval.samples_per_problem")


def _shared_settings(runs: list[RunRecord], spread: dict[str, list[Any]]) -> str:
    from pivotrl.train.config import flat_config

    configured = [flat_config(r.config) for r in runs if r.config]
    if not configured:
        return ""
    return ", ".join(_setting(k, configured[0][k]) for k in HEADLINE if k in configured[0] and k not in spread)


def write_report(runs: list[RunRecord], output_dir: str | Path, *, baseline: str = "grpo",
                 title: str = "pivotrl comparison", notes: str = "", by_design: tuple[str, ...] = ()) -> Path:
    """Write output_dir/report.md and its PNG plots; returns the report's path."""
    if not runs:
        raise ValueError("no runs to report on")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    groups = by_method(runs)
    rows = method_rows(groups, baseline)
    plots = {key: plot_metric(groups, key, out / f"{key.split('/')[0].replace('@', '_')}.png") for key in PLOTS}
    sizes = ", ".join(f"{n} problems x {k} sample(s)" for n, k in eval_sizes(runs)) or "no evaluations found"
    warnings = "".join(f"**Warning:** {w}.\n\n" for w in report_warnings(runs, by_design))
    text = [f"# {title}\n\n", notes + "\n\n" if notes else "", f"Held-out evaluation: {sizes}.\n\n", warnings,
            "## Results\n\n", markdown_table(rows, baseline), "\n## Curves\n\n"]
    for key, path in plots.items():
        text.append(f"![{PLOTS[key][0]}]({path.name})\n\n")
    text.append("## Runs\n\n")
    spread = config_spread(runs)
    missing = [r for r in runs if not r.config]
    text.append("Each run's settings are the `config.yaml` in its folder"
                + (f" ({len(missing)} run(s) have none)" if missing else "") + ". "
                + (f"The runs differ in {', '.join(f'`{k}`' for k in spread)}; every other setting is the same "
                   "(where, how often and how a run logs and saves, and its CPU threads, are not compared).\n\n"
                   if spread else "All of them are the same (where, how often and how a run logs and saves, and its "
                   "CPU threads, are not compared).\n\n"))
    column = {id(r): i for i, r in enumerate(r for r in runs if r.config)}
    shared = _shared_settings(runs, spread)
    if shared:
        text.append(f"Shared by every run: {shared}.\n\n")
    for r in runs:
        own = ("no config.yaml" if not r.config else
               ", ".join(_setting(k, values[column[id(r)]]) for k, values in spread.items()))
        text.append(f"- {r.method}, seed {r.seed}: `{r.path}`" + (f": {own}" if own else "") + "\n")
    report = out / "report.md"
    report.write_text("".join(text))
    return report
