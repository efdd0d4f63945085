"""`pivotrl compare`: the same budget, data and seeds for several methods, one variable at a time."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from pivotrl.algorithms import ESTIMATORS

# method name -> config overrides on top of the user's recipe (everything else stays equal)
PRESETS: dict[str, list[str]] = {
    "dapo": ["algorithm.estimator=grpo", "algorithm.policy_loss=ppo", "algorithm.loss_agg_mode=token-mean",
             "algorithm.loss_kwargs={eps_low: 0.2, eps_high: 0.28}", "rollout.dynamic_sampling=true",
             "rollout.overlong_shaping=true"],
    "gspo": ["algorithm.estimator=grpo", "algorithm.policy_loss=gspo",
             "algorithm.loss_kwargs={eps_low: 3.0e-4, eps_high: 4.0e-4}"],
    "tepo": ["algorithm.estimator=grpo", "algorithm.policy_loss=tepo",
             "algorithm.loss_kwargs={eps_low: 0.2, eps_high: 0.28, beta_kl: 0.05}"],
    "mpo": ["algorithm.estimator=grpo", "algorithm.policy_loss=mpo", "algorithm.loss_kwargs={block_size: 5}"],
    # ERPO's two components alone, the paper's own ablation (--ablate erpo runs its other switches)
    "erpo_gate_only": ["algorithm.estimator=erpo", "algorithm.policy_loss=ppo", "algorithm.estimator_kwargs={eta: 0.0}"],
    "erpo_process_only": ["algorithm.estimator=erpo", "algorithm.policy_loss=ppo",
                          "algorithm.estimator_kwargs={gate: false}"],
    # branching as configs/pivot_mc.yaml; change it with --set pivot_mc:rollout.branch.branches=2 and the like
    "pivot_mc": ["algorithm.estimator=pivot_mc", "algorithm.policy_loss=ppo", "rollout.branch.pivots=2",
                 "rollout.branch.spacing=4", "rollout.branch.branches=4"],
}
ABLATIONS = {"full": {}, "no_gate": {"gate": False}, "no_buckets": {"buckets": False}, "no_anchor": {"anchor": False}}


def method_overrides(method: str) -> list[str]:
    """The overrides that turn the base recipe into `method` (an estimator name or a preset)."""
    if method in PRESETS:
        return list(PRESETS[method])
    if method in ESTIMATORS:
        return [f"algorithm.estimator={method}", "algorithm.policy_loss=ppo"]
    known = ", ".join(sorted({*ESTIMATORS, *PRESETS}))
    raise ValueError(f"unknown method {method!r}; known: {known}")


def parse_sets(sets: list[str], methods: list[str]) -> dict[str, list[str]]:
    """`--set METHOD:KEY=VALUE` options as {method: [KEY=VALUE, ...]}, for the methods compared."""
    out: dict[str, list[str]] = {}
    for item in sets:
        method, sep, override = item.partition(":")
        if not sep or "=" not in override:
            raise ValueError(f"--set takes METHOD:KEY=VALUE (e.g. grpo:rollout.group_size=16), got {item!r}")
        if method not in methods:
            raise ValueError(f"--set {item!r}: {method!r} is not among the compared methods ({', '.join(methods)})")
        out.setdefault(method, []).append(override)
    return out


def seed_list(seeds: int | str) -> list[int]:
    """--seeds: a count N (seeds 0 to N-1), or seeds and ranges ("1-3", "0,2"; seed 1 alone "1-1"), for runs split
    across machines."""
    text = str(seeds).strip()
    if text.isdigit():
        if int(text) < 1:
            raise ValueError(f"--seeds must be >= 1, got {text}")
        return list(range(int(text)))
    chosen: list[int] = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()) or (dash and int(high) < int(low)):
            raise ValueError(f"--seeds takes a count (4) or seeds and ranges (1-3 or 0,2), got {text!r}")
        chosen += range(int(low), int(high if dash else low) + 1)
    if len(set(chosen)) < len(chosen):
        raise ValueError(f"--seeds names a seed twice: {text!r}")
    return chosen


def plan_runs(methods: list[str], seeds: int | str, ablate: str | None = None,
              sets: dict[str, list[str]] | None = None) -> list[tuple[str, int, list[str]]]:
    """(label, seed, overrides) for every run of the comparison (`seeds` as seed_list reads it); `sets` adds a
    method's own overrides."""
    seeds = seed_list(seeds)
    if not methods:
        raise ValueError("--methods names no method; give a comma-separated list such as grpo,erpo")
    sets = sets or {}
    variants: list[tuple[str, list[str]]] = []
    if ablate is not None:
        if ablate not in ("erpo", "ep_grpo"):
            raise ValueError(f"--ablate takes erpo or ep_grpo, got {ablate!r}")
        for name, kwargs in ABLATIONS.items():
            flat = ", ".join(f"{k}: {str(v).lower()}" for k, v in kwargs.items())
            variants.append((f"{ablate}:{name}", [f"algorithm.estimator={ablate}", f"algorithm.estimator_kwargs={{{flat}}}"]))
        if "grpo" in methods:
            variants.insert(0, ("grpo", method_overrides("grpo")))
    else:
        variants = [(m, [*method_overrides(m), *sets.get(m, [])]) for m in methods]
    return [(label, seed, overrides) for label, overrides in variants for seed in seeds]


def run_comparison(config: Path | None, methods: list[str], seeds: int | str, output_dir: Path, *,
                   ablate: str | None = None, extra: list[str] = (), jobs: int = 1, overwrite: bool = False,
                   sets: list[str] = (),
                   console: Console | None = None, warn: Callable[[str], None] | None = None) -> Path:
    """Train every (method, seed) not yet finished (resuming unfinished ones), then write the report.

    A run already in the folder, finished or not, is reused only when its saved config.yaml equals
    the config compare would launch for it (except output_dir and log.*); otherwise ConfigError
    names the runs and the keys that differ, or, with `overwrite`, the run is moved aside and run
    again. The output folder is locked for the whole comparison. Every config is checked before
    any run starts. jobs > 1 trains that many runs side by side in separate processes (set
    train.num_threads so that jobs x threads does not exceed the cores). `warn` receives what makes
    the comparison meaningless or unfair (see report_warnings); by default it is printed.
    """
    from pivotrl.analysis.report import report_warnings, write_report
    from pivotrl.analysis.runs import read_run
    from pivotrl.errors import ConfigError, TrainingInterrupted
    from pivotrl.train import run_folder
    from pivotrl.train.checks import check_run
    from pivotrl.train.config import load_config
    from pivotrl.train.recipes import default_config_path

    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    console = console or Console()
    method_sets = parse_sets(list(sets), methods)
    plan = plan_runs(methods, seeds, ablate, method_sets)
    base = config if config is not None else default_config_path()
    configs = []
    for label, seed, overrides in plan:
        run_dir = output_dir / "runs" / f"{label.replace(':', '-')}-seed{seed}"
        cfg = load_config(base, [*extra, *overrides, f"train.seed={seed}", f"output_dir={run_dir}"])
        check_run(cfg)
        configs.append((label, seed, run_dir, cfg))
    updates = {label: cfg.train.ppo_epochs * cfg.train.num_minibatches for label, _, _, cfg in configs}
    if len(set(updates.values())) > 1:
        counts = ", ".join(f"{label}: {n}" for label, n in updates.items())
        raise ValueError(f"methods must get the same number of optimizer updates per rollout "
                         f"(train.ppo_epochs x train.num_minibatches), got {counts}")
    found = run_folder.run_contents(output_dir)
    if found:
        raise ConfigError(f"--output-dir {output_dir} holds a training run ({', '.join(found)}); "
                          "give compare a folder of its own")
    with run_folder.claim_folder(output_dir, "--output-dir"):
        pending, mismatched = [], []
        for i, (label, seed, run_dir, cfg) in enumerate(configs, 1):
            state, why = _existing_run(run_dir, cfg)
            if state == "other" and not overwrite:
                mismatched.append(f"{run_dir.name} ({why})")
            elif state == "finished":
                console.print(f"[{i}/{len(plan)}] {label} seed {seed}: done already ({run_dir})")
            else:
                mode = {"other": "overwrite", "unfinished": "resume"}.get(state)
                pending.append((f"[{i}/{len(plan)}] {label} seed {seed} -> {run_dir}", cfg, mode))
        if mismatched:
            raise ConfigError(
                f"compare: {len(mismatched)} run(s) in {output_dir / 'runs'} were made with another config than "
                f"this command's: {'; '.join(mismatched)}; run them again with --overwrite (the old runs are moved "
                "aside, not deleted), or pick another --output-dir")
        try:
            _train_all(pending, jobs, console)
        except (KeyboardInterrupt, TrainingInterrupted):
            raise TrainingInterrupted("interrupted: rerun the same compare command to continue (finished runs are "
                                      "kept; unfinished ones resume from their newest checkpoint)") from None
        records = [read_run(run_dir, label=label) for label, _, run_dir, _ in configs]
        notes = _notes(base, extra, ablate, method_sets)
        varied = tuple(o.partition("=")[0] for overrides in method_sets.values() for o in overrides)
        report = write_report(records, output_dir, title="pivotrl compare", notes=notes, by_design=varied)
    for message in report_warnings(records, varied):
        (warn or (lambda m: console.print(f"[yellow]warning:[/] {m}", soft_wrap=True)))(message)
    return report


def _existing_run(run_dir: Path, cfg: Any) -> tuple[str, str]:
    """What `run_dir` holds for a run of `cfg`: ('none', ''), ('unfinished', '') or ('finished', '')
    for a run of this very config, or ('other', why) for a run of another config."""
    from pivotrl.train import run_folder
    from pivotrl.train.config import config_differences, describe_differences

    if not run_folder.run_contents(run_dir):
        return "none", ""
    saved = run_folder.saved_config(run_dir)
    if saved is None:
        return "other", "no config.yaml"
    diffs = config_differences(saved, cfg, ignore=run_folder.NOT_IDENTITY)
    if diffs:
        return "other", describe_differences(diffs, old="run", new="now")
    return ("finished" if (run_dir / "summary.json").is_file() else "unfinished"), ""


def _train_all(pending: list[tuple[str, Any, str | None]], jobs: int, console: Console) -> None:
    """Train the pending (message, config, mode) runs, `jobs` at a time."""
    if jobs == 1:
        for message, cfg, mode in pending:
            console.print(message)
            _train(cfg, mode, console)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # a fresh process per run: a finished run's worker held its memory (8 GB for a 135M model) until the last run ended
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                             max_tasks_per_child=1) as pool:
        futures = []
        for message, cfg, mode in pending:
            console.print(message)
            futures.append(pool.submit(_train, cfg, mode))
        for future in futures:
            future.result()  # re-raises a run's error here


def _train(cfg: Any, mode: str | None = None, console: Console | None = None) -> None:
    """One run to its end (top level, so a worker process can run it): a new one (mode None), an
    unfinished one resumed from its newest checkpoint ('resume'), or one that moves the run in its
    folder aside first ('overwrite')."""
    from pivotrl.train.trainer import Trainer

    Trainer(cfg, resume=mode == "resume", overwrite=mode == "overwrite", console=console or Console()).run()


def _notes(base: Path, extra: list[str], ablate: str | None, sets: dict[str, list[str]] | None = None) -> str:
    parts: list[Any] = [f"Recipe `{base}`" + (f" with `{' '.join(extra)}`" if extra else "") + "; every run differs "
                        "from the others only in the method (and the seed)" + (", and in:" if sets else ".")]
    parts += [f"{m}: `{' '.join(o)}`;" for m, o in (sets or {}).items()]
    if ablate:
        parts.append(f"Ablation of {ablate}: full, no gate (gate=false), no buckets (buckets=false), "
                     "no anchor (anchor=false).")
    return " ".join(parts)
