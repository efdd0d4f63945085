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


def plan_runs(methods: list[str], seeds: int, ablate: str | None = None,
              sets: dict[str, list[str]] | None = None) -> list[tuple[str, int, list[str]]]:
    """(label, seed, overrides) for every run of the comparison; `sets` adds a method's own overrides."""
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
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
    return [(label, seed, overrides) for label, overrides in variants for seed in range(seeds)]


def run_comparison(config: Path | None, methods: list[str], seeds: int, output_dir: Path, *,
                   ablate: str | None = None, extra: list[str] = (), jobs: int = 1, sets: list[str] = (),
                   console: Console | None = None, warn: Callable[[str], None] | None = None) -> Path:
    """Train every (method, seed) not yet finished (resuming unfinished ones), then write the report.

    jobs > 1 trains that many runs side by side in separate processes (set train.num_threads
    so that jobs x threads does not exceed the cores). `warn` receives what makes the
    comparison meaningless or unfair (see report_warnings); by default it is printed.
    """
    from pivotrl.analysis.report import report_warnings, write_report
    from pivotrl.analysis.runs import read_run
    from pivotrl.train.config import load_config
    from pivotrl.train.interrupts import TrainingInterrupted
    from pivotrl.train.recipes import default_config_path

    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    console = console or Console()
    method_sets = parse_sets(list(sets), methods)
    plan = plan_runs(methods, seeds, ablate, method_sets)
    base = config if config is not None else default_config_path()
    pending, run_dirs, updates = [], [], {}
    for i, (label, seed, overrides) in enumerate(plan, 1):
        run_dir = output_dir / "runs" / f"{label.replace(':', '-')}-seed{seed}"
        cfg = load_config(base, [*extra, *overrides, f"train.seed={seed}", f"output_dir={run_dir}"])
        updates[label] = cfg.train.ppo_epochs * cfg.train.num_minibatches
        run_dirs.append((label, run_dir))
        if (run_dir / "summary.json").is_file():
            console.print(f"[{i}/{len(plan)}] {label} seed {seed}: done already ({run_dir})")
        else:
            pending.append((f"[{i}/{len(plan)}] {label} seed {seed} -> {run_dir}", cfg))
    if len(set(updates.values())) > 1:
        counts = ", ".join(f"{label}: {n}" for label, n in updates.items())
        raise ValueError(f"methods must get the same number of optimizer updates per rollout "
                         f"(train.ppo_epochs x train.num_minibatches), got {counts}")
    try:
        _train_all(pending, jobs, console)
    except (KeyboardInterrupt, TrainingInterrupted):
        raise TrainingInterrupted("interrupted: rerun the same compare command to continue (finished runs are "
                                  "kept; unfinished ones resume from their newest checkpoint)") from None
    records = [read_run(run_dir, label=label) for label, run_dir in run_dirs]
    notes = _notes(base, extra, ablate, method_sets)
    report = write_report(records, output_dir, title="pivotrl compare", notes=notes)
    for message in report_warnings(records):
        (warn or (lambda m: console.print(f"[yellow]warning:[/] {m}", soft_wrap=True)))(message)
    return report


def _train_all(pending: list[tuple[str, Any]], jobs: int, console: Console) -> None:
    """Train the pending (message, config) runs, `jobs` at a time."""
    if jobs == 1:
        for message, cfg in pending:
            console.print(message)
            _train(cfg, console)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = []
        for message, cfg in pending:
            console.print(message)
            futures.append(pool.submit(_train, cfg))
        for future in futures:
            future.result()  # re-raises a run's error here


def _train(cfg: Any, console: Console | None = None) -> None:
    """One run to its end, resuming an unfinished one from its newest checkpoint (top level, so a
    worker process can run it)."""
    from pivotrl.train.run_folder import run_contents
    from pivotrl.train.trainer import Trainer

    resume = bool(run_contents(Path(cfg.output_dir)))
    Trainer(cfg, resume=resume, console=console or Console()).run()


def _notes(base: Path, extra: list[str], ablate: str | None, sets: dict[str, list[str]] | None = None) -> str:
    parts: list[Any] = [f"Recipe `{base}`" + (f" with `{' '.join(extra)}`" if extra else "") + "; every run differs "
                        "from the others only in the method (and the seed)" + (", and in:" if sets else ".")]
    parts += [f"{m}: `{' '.join(o)}`;" for m, o in (sets or {}).items()]
    if ablate:
        parts.append(f"Ablation of {ablate}: full, no gate (gate=false), no buckets (buckets=false), "
                     "no anchor (anchor=false).")
    return " ".join(parts)
