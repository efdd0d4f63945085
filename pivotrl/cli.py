"""The `pivotrl` command line."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from pivotrl.cli_errors import OneLineErrors, fail, user_errors, warn
from pivotrl.evaluation import (  # torch-free: read before any option is checked
    HELDOUT_BATCH,
    HELDOUT_PROBLEMS,
)
from pivotrl.modeling.prompt_form import prompt_form
from pivotrl.tasks.loaders import MAX_ROW_CHARS

DTYPE_HELP = "The weights' dtype: float32, bfloat16 or float16 (bfloat16 is fast only on a CPU with AVX512-BF16 or AMX)"
CHAT_HELP = ("Prompts through the tokenizer's chat template (--chat) or plain (--no-chat); default: the form the model "
             "was trained in, where pivotrl recorded it (a warm start, a run's checkpoint), else plain")
ENGINE_HELP = "Rollout engine: hf (transformers), or vllm (vLLM on the CPU or one GPU; docs/INTEGRATIONS.md)"

app = typer.Typer(cls=OneLineErrors, no_args_is_help=True, add_completion=False, help=__doc__)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"pivotrl {version('pivotrl')}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print pivotrl's version and exit.")] = False,
) -> None:
    """pivotrl: token-level credit assignment for RLVR."""


@app.command()
def demo() -> None:
    """Show how each estimator assigns credit on a small toy batch."""
    from pivotrl.demo import run_demo

    run_demo()


@app.command()
def pretrain(
    task: str = typer.Option("countdown", help="Whose worked solutions: countdown (--model tiny), countdown_search (--model tiny-search) or countdown_free (--model tiny-free)."),
    output_dir: str | None = typer.Option(None, help="Where to save the checkpoint (default: outputs/<the shipped folder's name>); a folder that holds a model is refused unless --overwrite."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Move a model already in --output-dir aside (to FOLDER.old-DATE-TIME) and save there; needed to regenerate a shipped policy."),
    seed: int | None = typer.Option(None, help="Seed of the weights and the data order (default: the task's recipe, 0)."),
    steps: int | None = typer.Option(None, min=1, help="Optimizer steps (default: the task's recipe)."),
    minutes: float | None = typer.Option(None, help="Also stop after this many minutes (> 0; not reproducible)."),
    batch_size: int | None = typer.Option(None, min=1, help="Sequences per step (default: the task's recipe)."),
    lr: float | None = typer.Option(None, help="Peak learning rate (> 0), cosine decay after warm-up (default: the task's recipe)."),
    threads: int | None = typer.Option(None, min=1, help="torch threads, fixed for reproducible weights (default: the task's recipe, 1)."),
    imperfect: float | None = typer.Option(None, min=0.0, max=1.0, help="Share of deliberately flawed worked solutions (default: the task's recipe)."),
    evaluate: bool = typer.Option(True, help="Measure held-out accuracy after training."),
    eval_only: bool = typer.Option(False, "--eval-only", help="Only measure --model (default: the policy shipped for --task): held-out accuracy as `pivotrl eval --model M --task T` reports it."),
    model: str | None = typer.Option(None, help="A pretrained model to warm-start (smollm2-135m, a .gguf file, a folder), or with --eval-only the checkpoint folder, or tiny / tiny-search / tiny-free, to measure."),
    eval_n: int = typer.Option(HELDOUT_PROBLEMS, min=1, help="The first N held-out problems to measure on (eval's -n)."),
    temperature: float = typer.Option(1.0, min=0.0, help="Sampling temperature of the measurement (0 = greedy)."),
    eval_seed: int = typer.Option(0, help="Seed of the measurement's sampling (eval's --seed)."),
    max_new_tokens: int | None = typer.Option(None, min=1, help="Longest response of the measurement (default: the task's, as eval: 34, countdown_search 224, countdown_free 160)."),
    adapter: str | None = typer.Option(None, help="With --model: rebuild the warm start from a kept copy of its adapter/ folder (seconds, not the training), its weights checked against the digest recorded when it was trained."),
) -> None:
    """Warm up a tiny policy on worked solutions (the shipped checkpoints' recipes, one per --task), or
    with --model a pretrained model (LoRA fine-tune with TRL, merged: e.g. --model smollm2-135m --task add_sub).

    The measurement (after training, or --eval-only) is `pivotrl eval`'s held-out accuracy with its
    defaults: the first --eval-n problems of the test split, one sample each, seed 0, 256 at once,
    at most the task's response length, on the CPU with the recipe's threads (1).
    """
    from pathlib import Path

    from pivotrl.modeling.tiny import TINY_MODELS, tiny_policy_path
    from pivotrl.pretrain import recipe, run_pretrain_command, shipped_policy_path

    if minutes is not None and minutes <= 0:
        fail(f"--minutes must be > 0 (a time limit), got {minutes}")
    if lr is not None and lr <= 0:
        fail(f"--lr must be > 0, got {lr}")
    if eval_only and (output_dir is not None or overwrite):
        fail("--eval-only saves nothing: --output-dir and --overwrite do not apply (measure a folder with --model)")
    if adapter is not None and (model is None or eval_only):
        fail("--adapter rebuilds a pretrained model's warm start: give --model (and not --eval-only)")
    if model is not None and not eval_only:
        from pivotrl.modeling.tiny import TINY_MODELS

        if model in TINY_MODELS or model == "tiny-random":
            fail(f"--model {model}: a tiny policy is pretrained from a fresh model (leave --model out), or "
                 "measured with --eval-only")
        from pivotrl.warm_start import run_warm_start_command, warm_start_recipe

        if adapter is not None and any(v is not None for v in (seed, steps, batch_size, lr)):
            fail("--adapter rebuilds a warm start already trained: --seed, --steps, --batch-size and --lr do not apply")
        if adapter is not None and not Path(adapter).is_dir():
            fail(f"--adapter {adapter}: no such folder")
        with user_errors():
            config = warm_start_recipe(model, task, seed=seed, steps=steps, batch_size=batch_size, lr=lr,
                                       threads=threads)
            run_warm_start_command(config=config, output_dir=Path(output_dir) if output_dir else None,
                                   overwrite=overwrite, evaluate=evaluate, eval_n=eval_n, temperature=temperature,
                                   eval_seed=eval_seed, max_new_tokens=max_new_tokens,
                                   adapter=Path(adapter) if adapter else None)
        return
    with user_errors():
        config = recipe(task, seed=seed, steps=steps, minutes=minutes, batch_size=batch_size, lr=lr,
                        threads=threads, imperfect=imperfect)
    model_path = None
    if model is not None:
        model_path = tiny_policy_path(model) if model in TINY_MODELS else Path(model)
        if not (model_path / "config.json").is_file():
            fail(f"--model {model}: no checkpoint there (no config.json)")
    out = Path(output_dir) if output_dir else Path("outputs") / shipped_policy_path(task).name
    with user_errors():
        from pivotrl.train.run_folder import claim_model_folder

        lock = None if eval_only else claim_model_folder(out, overwrite=overwrite, say=typer.echo)
        try:
            run_pretrain_command(
                output_dir=out, config=config, evaluate=evaluate, eval_only=eval_only,
                model_path=model_path, eval_n=eval_n, temperature=temperature, eval_seed=eval_seed,
                max_new_tokens=max_new_tokens,
            )
        finally:
            if lock is not None:
                lock.release()


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             options_metavar="[OPTIONS] [KEY=VALUE]...")
def train(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="A recipe: a YAML file, or a shipped recipe by name (grpo, search, quick, ...; default: default)")] = None,
    output_dir: Annotated[Path | None, typer.Option("--output-dir", "-o", help="Run folder (overrides output_dir)")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the newest checkpoint in the run folder")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Move a run already in the folder aside (to FOLDER.old-DATE-TIME) and start over")] = False,
) -> None:
    """Train a policy with RLVR; extra arguments are dotted overrides (train.max_steps=4).

    --resume without --config continues with the run folder's own config.yaml; the overrides (and a
    --config) may then change only what run_folder.SAFE_ON_RESUME lists (train.max_steps, ...).
    """
    from pivotrl.errors import TrainingAborted
    from pivotrl.train import run_folder
    from pivotrl.train.config import load_config
    from pivotrl.train.recipes import default_config_path
    from pivotrl.train.trainer import Trainer

    overrides = list(ctx.args)
    if output_dir is not None:
        overrides.append(f"output_dir={output_dir}")
    with user_errors(TrainingAborted):
        cfg = None
        if resume and config is None:  # the run's own config, not the default recipe
            cfg = run_folder.resume_config(run_folder.output_dir_of(overrides, default_config_path()), overrides)
        if cfg is None:
            cfg = load_config(config if config is not None else default_config_path(), overrides)
        Trainer(cfg, resume=resume, overwrite=overwrite).run()


@app.command("eval")
def eval_command(
    ctx: typer.Context,
    model: Annotated[str, typer.Option("--model", help="'tiny', 'tiny-search', 'tiny-free', a checkpoint folder or a hub id")] = "tiny",
    task: Annotated[str | None, typer.Option("--task", help="Task name (countdown, gsm8k, math500, ...)")] = None,
    data: Annotated[Path | None, typer.Option("--data", help="A jsonl/parquet file of problems instead of --task")] = None,
    question_field: Annotated[str, typer.Option(help="Question field of --data")] = "question",
    answer_field: Annotated[str, typer.Option(help="Answer field of --data")] = "answer",
    verifier: Annotated[str, typer.Option(help="Verifier of --data (math, countdown, arithmetic)")] = "math",
    num_problems: Annotated[int, typer.Option("--num-problems", "-n", min=1, help="First N held-out problems (only those are built)")] = HELDOUT_PROBLEMS,
    k: Annotated[int, typer.Option("-k", min=1, help="Samples per problem")] = 1,
    temperature: Annotated[float, typer.Option(min=0.0, help="Sampling temperature (0: greedy)")] = 1.0,
    max_new_tokens: Annotated[int | None, typer.Option(min=1, help="Longest response (default: the task's for the model's tokenizer: Task.response_limit)")] = None,
    batch_size: Annotated[int, typer.Option(min=1, help="Responses generated at once (it decides which random draws each gets)")] = HELDOUT_BATCH,
    max_chars: Annotated[int, typer.Option(min=1, help="Skip (and count) rows of --data longer than this many characters")] = MAX_ROW_CHARS,
    chat: Annotated[bool | None, typer.Option("--chat/--no-chat", help=CHAT_HELP)] = None,
    seed: Annotated[int, typer.Option(help="Sampling seed")] = 0,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N")] = "auto",
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP)] = "float32",
    engine: Annotated[str, typer.Option(help=ENGINE_HELP)] = "hf",
    threads: Annotated[int, typer.Option(min=1, help="torch threads (CPU); 1 is fastest on a shared machine (docs/PERFORMANCE.md)")] = 1,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write every sample to this jsonl file, and a log of the phases beside it (SAMPLES.log.txt); default: no files")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing --output file (and its log)")] = False,
) -> None:
    """Evaluate a policy: pass@1 averaged over k samples, pass@k, maj@k, mean length.

    The defaults measure what `pivotrl pretrain --eval-only` reports as held-out accuracy: the first
    1000 problems of the test split, one sample each at T=1 with seed 0, 256 at once, the task's
    longest response (the same numbers on the same device and thread count). The result goes to
    stdout as JSON; with -o FILE every sample goes to FILE (its path in the JSON's samples_file).
    """
    import json

    if (task is None) == (data is None):
        fail("give exactly one of --task NAME or --data FILE")
    if temperature == 0 and k > 1:
        fail(f"--temperature 0 is greedy, so the -k {k} samples of a problem would be copies of one "
             "(pass@k = pass@1); use -k 1, or a temperature > 0")
    import torch

    torch.set_num_threads(threads)
    with user_errors():
        from pivotrl.modeling.devices import check_device
        from pivotrl.progress import Phases
        from pivotrl.rollout.engines import check_engine
        from pivotrl.tasks import get_task
        from pivotrl.train.run_folder import check_output_file

        check_device(device, "--device")
        check_engine(engine, device)
        samples_path, log_path = output, None
        if output is not None:
            log_path = eval_log_path(output)
            for path, what in ((output, "--output"), (log_path, "its log")):
                if path.is_file() and not overwrite:
                    fail(f"{what} {path} exists; pass --overwrite to replace it, or give another --output")
                check_output_file(path, what)
        the_task = get_task(task) if task is not None else get_task(
            "file", path=str(data), question_field=question_field, answer_field=answer_field, verifier=verifier,
            max_chars=max_chars)
        with Phases("eval", progress_console(), settings=ctx.params) as phases:
            with phases.phase(f"build the first {num_problems} held-out problems"):
                problems = the_task.problems("test", limit=num_problems)
            with phases.phase(f"load {model}"):
                from pivotrl.evaluation import evaluate_policy
                from pivotrl.modeling.policy import load_policy
                from pivotrl.rollout import make_engine

                policy, tokenizer = load_policy(model, device=device, dtype=dtype)
                options = {"seed": seed} if engine == "vllm" else {}
                rollout_engine = make_engine(engine, policy, tokenizer, **options)
            if log_path is not None:
                phases.log_to(log_path)  # from here on there is work to log (a refusal above leaves no file)
            chat = prompt_form(model, chat)
            length = max_new_tokens or the_task.response_limit(tokenizer)
            prompts = [the_task.format_prompt(p, tokenizer, chat=chat) for p in problems]
            with phases.phase("evaluating", unit="problems") as update:
                result = evaluate_policy(rollout_engine, the_task, problems, prompts=prompts, samples_per_problem=k,
                                         temperature=temperature, max_new_tokens=length, batch_size=batch_size,
                                         seed=seed, samples_path=samples_path, progress=update)
            result["chat"], result["max_new_tokens"] = chat, length
            result["skipped_rows"] = problems.skipped
            if samples_path is not None:
                result["samples_file"] = str(samples_path)
            phases.done(f"accuracy {result['accuracy']:.4f} on {result['num_problems']} problems x {k}, "
                        f"at most {length} tokens, {'chat' if chat else 'plain'} prompts" + (f"; samples in {samples_path}" if samples_path else ""))
    typer.echo(json.dumps(result, indent=2))


def eval_log_path(samples: Path) -> Path:
    """Where `eval` logs its phases: beside its samples file (eval_samples.jsonl -> eval_samples.log.txt)."""
    return samples.with_name(f"{samples.stem if samples.suffix else samples.name}.log.txt")


def progress_console():
    """Where the side commands (analyze, eval, credit) show progress: stderr, so stdout keeps their result."""
    from rich.console import Console

    return Console(stderr=True)


@app.command()
def export(
    run_dir: Annotated[Path, typer.Argument(help="A run folder (its newest checkpoint) or a checkpoint folder", show_default=False)],
    output_dir: Annotated[Path, typer.Option("--output-dir", "-o", help="Where the model goes: a new or empty folder", show_default=False)],
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Move what --output-dir holds aside (to FOLDER.old-DATE-TIME) and write there")] = False,
) -> None:
    """Write a run's policy as a plain Hugging Face model folder: a LoRA run's adapter merged into its base
    (W + alpha/r·B A), with the tokenizer and the prompt form the run trained in; `--model DIR` loads it.
    """
    from pivotrl.export import export_model

    with user_errors():
        source = export_model(run_dir, output_dir, overwrite=overwrite, say=typer.echo)
    typer.echo(f"exported {source} to {output_dir}: --model {output_dir}")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
             options_metavar="[OPTIONS] [KEY=VALUE]...")
def compare(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Base recipe: a YAML file, or a shipped recipe by name (default: default)")] = None,
    methods: Annotated[str, typer.Option(help="Comma-separated methods (estimators, or dapo, gspo, tepo, mpo)")] = "grpo,erpo",
    seeds: Annotated[str, typer.Option(help="Seeds per method: a count N (seeds 0 to N-1), or seeds and ranges (1-3, 0,2; seed 1 alone: 1-1) for a comparison split across machines")] = "3",
    output_dir: Annotated[Path, typer.Option("--output-dir", "-o", help="Folder of the runs and the report")] = Path("runs/compare"),
    ablate: Annotated[str | None, typer.Option(help="Ablate erpo or ep_grpo: full, no gate, no buckets, no anchor")] = None,
    jobs: Annotated[int, typer.Option(min=1, help="Runs trained side by side, one process each")] = 1,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Run again (moving the old run aside) each run in the folder made with another config")] = False,
    set_: Annotated[list[str] | None, typer.Option("--set", help="METHOD:KEY=VALUE, one method's own override (repeatable), e.g. grpo:rollout.group_size=16 to match a branching method's token budget")] = None,
) -> None:
    """Train several methods with everything else equal, then write report.md and plots; extra
    arguments are dotted overrides applied to every run (train.max_steps=60 eval.num_problems=500).

    A run already in the folder is reused (finished) or resumed (unfinished) only when its saved
    config equals the one this command would launch; otherwise compare refuses, naming the keys.
    """
    from pivotrl.analysis.compare import run_comparison
    from pivotrl.errors import TrainingAborted

    with user_errors(TrainingAborted):
        report = run_comparison(config, [m.strip() for m in methods.split(",") if m.strip()], seeds, output_dir,
                                ablate=ablate, extra=list(ctx.args), jobs=jobs, overwrite=overwrite,
                                sets=set_ or [], warn=warn)
    typer.echo(f"report: {report}")


@app.command()
def report(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run folders (each with metrics.jsonl)")],
    output_dir: Annotated[Path, typer.Option("--output-dir", "-o", help="Where report.md and the plots go")] = Path("runs/report"),
    baseline: Annotated[str, typer.Option(help="Method whose final accuracy the others race to")] = "grpo",
) -> None:
    """The plots and table of `compare` for existing run folders (from any machine or engine)."""
    from pivotrl.analysis.report import report_warnings, write_report
    from pivotrl.analysis.runs import read_run
    from pivotrl.train.run_folder import check_report_dir, lock_folder

    with user_errors():
        runs = [read_run(p) for p in run_dirs]
        check_report_dir(output_dir)
        with lock_folder(output_dir, "--output-dir"):
            path = write_report(runs, output_dir, baseline=baseline, title="pivotrl report")
    for message in report_warnings(runs):
        warn(message)
    typer.echo(f"report: {path}")


@app.command()
def analyze(
    ctx: typer.Context,
    model: Annotated[str, typer.Option("--model", help="'tiny', 'tiny-search', 'tiny-free', a checkpoint folder or a hub id")] = "tiny",
    task: Annotated[str, typer.Option("--task", help="Task name")] = "countdown",
    estimator: Annotated[str, typer.Option(help="Estimator whose token credit is shown next to GRPO's")] = "erpo",
    ref: Annotated[str | None, typer.Option(help="Reference model for erpo's process term (default: the policy)")] = None,
    num_problems: Annotated[int, typer.Option("--num-problems", "-n", min=1, help="Held-out problems sampled")] = 64,
    group_size: Annotated[int, typer.Option(min=1, help="Samples per problem")] = 8,
    top_percent: Annotated[float, typer.Option(help="k: perturb the top-k% and bottom-k% entropy tokens (0 < k < 50)")] = 10.0,
    perturbations: Annotated[int, typer.Option(min=1, help="Perturbed positions per side")] = 200,
    max_new_tokens: Annotated[int | None, typer.Option(min=1, help="Longest response (default: the task's for the model's tokenizer: Task.response_limit)")] = None,
    seed: Annotated[int, typer.Option(help="Sampling seed")] = 0,
    engine: Annotated[str, typer.Option(help=ENGINE_HELP)] = "hf",
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP)] = "float32",
    chat: Annotated[bool | None, typer.Option("--chat/--no-chat", help=CHAT_HELP)] = None,
    threads: Annotated[int, typer.Option(min=1, help="torch threads (CPU); 1 is fastest on a shared machine (docs/PERFORMANCE.md)")] = 1,
    output_dir: Annotated[Path, typer.Option("--output-dir", "-o", help="Where entropy.png, tokens.html, pivots.json and log.txt go")] = Path("runs/analyze"),
) -> None:
    """Pivot analysis of a policy: entropy histogram, token heat-map, perturbation test at forks.

    Progress goes to stderr (a bar on a terminal, a line per phase otherwise), the seconds of each
    phase to OUTPUT_DIR/log.txt, the result (also in pivots.json) to stdout.
    """
    import json

    if not 0 < top_percent < 50:
        fail(f"--top-percent must be between 0 and 50 (the top and bottom k% may not overlap), got {top_percent}")
    import torch

    from pivotrl.algorithms import estimator_requirements
    from pivotrl.analysis.pivots import analyze_policy
    from pivotrl.tasks import get_task

    torch.set_num_threads(threads)
    with user_errors():
        estimator_requirements(estimator)  # an unknown name fails here, not after sampling
        the_task = get_task(task)
        with _side_run("analyze", ctx, output_dir, the_task, num_problems, model, ref, engine, dtype) as (
                phases, problems, policy, tokenizer, ref_model, rollout_engine):
            result = analyze_policy(policy, tokenizer, rollout_engine, the_task, problems,
                                    [the_task.format_prompt(p, tokenizer, chat=prompt_form(model, chat))
                                     for p in problems], output_dir,
                                    estimator=estimator,
                                    group_size=group_size,
                                    max_new_tokens=max_new_tokens or the_task.response_limit(tokenizer),
                                    top_percent=top_percent, num_perturbations=perturbations, seed=seed,
                                    ref_model=ref_model, phases=phases)
            phases.done(f"pivots.json, entropy.png, tokens.html in {output_dir}")
    typer.echo(json.dumps(result, indent=2))


@contextmanager
def _side_run(command: str, ctx: typer.Context, output_dir: Path, task, num_problems: int, model: str,
              ref: str | None, engine: str, dtype: str):
    """analyze's and credit's set-up: the output folder checked and locked, the phases shown and logged to
    OUTPUT_DIR/log.txt; then, each a phase, the first held-out problems, the policy, its reference (a frozen
    copy of `ref`, or None) and a rollout engine around the policy. Yields (phases, and those five)."""
    from pivotrl.modeling.policy import frozen_copy, load_policy
    from pivotrl.progress import Phases
    from pivotrl.rollout import make_engine
    from pivotrl.rollout.engines import check_engine
    from pivotrl.train.run_folder import check_report_dir, lock_folder

    check_engine(engine)
    check_report_dir(output_dir)
    with lock_folder(output_dir, "--output-dir"), \
            Phases(command, progress_console(), output_dir / "log.txt", settings=ctx.params) as phases:
        with phases.phase(f"build the first {num_problems} held-out problems"):
            problems = task.problems("test", limit=num_problems)
        with phases.phase(f"load {model}" + (f" and the reference {ref}" if ref else "")):
            policy, tokenizer = load_policy(model, dtype=dtype)
            ref_model = frozen_copy(load_policy(ref, dtype=dtype)[0]) if ref else None
            rollout_engine = make_engine(engine, policy, tokenizer)
        yield phases, problems, policy, tokenizer, ref_model, rollout_engine


@app.command()
def credit(
    ctx: typer.Context,
    model: Annotated[str, typer.Option("--model", help="'tiny', a checkpoint folder or a hub id")] = "tiny",
    ref: Annotated[str | None, typer.Option(help="Reference model for ℓ^ref (default: the policy itself)")] = None,
    task: Annotated[str, typer.Option("--task", help="Task name")] = "countdown",
    num_problems: Annotated[int, typer.Option("--num-problems", "-n", min=1, help="Held-out prompts sampled")] = 8,
    group_size: Annotated[int, typer.Option("--group-size", "-g", min=1, help="Responses per prompt")] = 8,
    k: Annotated[int, typer.Option("--continuations", "-k", min=2, help="Monte-Carlo continuations per prefix")] = 32,
    positions: Annotated[int | None, typer.Option(min=1, help="Estimate A* at up to this many positions per entropy decile (default: every position)")] = None,
    ablations: Annotated[bool, typer.Option("--ablations", help="Also score ERPO's ablations")] = False,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (the training temperature)")] = 1.0,
    max_new_tokens: Annotated[int | None, typer.Option(min=1, help="Longest response (default: the task's for the model's tokenizer: Task.response_limit)")] = None,
    batch_size: Annotated[int | None, typer.Option(min=1, help="Continuation rows per generate call (default: as many as 2 GiB of key-value cache holds, at most 4096)")] = None,
    bootstrap: Annotated[int, typer.Option(min=1, help="Bootstrap resamples for the 95% intervals")] = 1000,
    html_estimators: Annotated[str, typer.Option(help="Comma-separated estimators shown in tokens.html")] = "grpo,erpo",
    seed: Annotated[int, typer.Option(help="Sampling seed")] = 0,
    threads: Annotated[int, typer.Option(min=1, help="torch threads (CPU); 1 is fastest on a shared machine (docs/PERFORMANCE.md)")] = 1,
    engine: Annotated[str, typer.Option(help=ENGINE_HELP)] = "hf",
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP)] = "float32",
    chat: Annotated[bool | None, typer.Option("--chat/--no-chat", help=CHAT_HELP)] = None,
    pivots: Annotated[int, typer.Option(min=1, help="pivot_mc: pivots per response")] = 2,
    branches: Annotated[int, typer.Option(min=1, help="pivot_mc: branches sampled at each pivot (independent of -k)")] = 4,
    output_dir: Annotated[Path, typer.Option("--output-dir", "-o", help="Where credit.json, report.md, plots, tokens.html and log.txt go")] = Path("runs/credit"),
) -> None:
    """Token advantages of every estimator against Monte-Carlo ground truth A* = V(t+1) - V(t).

    Progress goes to stderr (a bar on a terminal, a line per phase otherwise), the seconds of each
    phase to OUTPUT_DIR/log.txt.
    """
    import torch

    from pivotrl.analysis.credit import check_options, run_credit
    from pivotrl.tasks import get_task

    shown = tuple(e.strip() for e in html_estimators.split(",") if e.strip())
    torch.set_num_threads(threads)
    with user_errors():
        the_task = get_task(task)
        check_options(group_size=group_size, k=k, max_new_tokens=max_new_tokens or 1, temperature=temperature,
                      positions_per_decile=positions, ablations=ablations, batch_rows=1 if batch_size is None else batch_size,
                      bootstrap=bootstrap, html_estimators=shown)
        with _side_run("credit", ctx, output_dir, the_task, num_problems, model, ref, engine, dtype) as (
                phases, problems, policy, tokenizer, ref_model, rollout_engine):
            max_new_tokens = max_new_tokens or the_task.response_limit(tokenizer)
            result = run_credit(policy, tokenizer, rollout_engine, the_task, problems,
                                [the_task.format_prompt(p, tokenizer, chat=prompt_form(model, chat))
                                 for p in problems], output_dir,
                                model_name=model,
                                task_name=task, ref_model=ref_model, ref_name=ref, group_size=group_size, k=k,
                                max_new_tokens=max_new_tokens, temperature=temperature, positions_per_decile=positions,
                                ablations=ablations, seed=seed, batch_rows=batch_size, bootstrap=bootstrap,
                                html_estimators=shown, pivots=pivots, branches=branches, phases=phases)
            phases.done(f"{result['summary']['positions']} positions; report in {output_dir / 'report.md'}")
    wall = result["summary"]["wall_time_s"]["total"]
    typer.echo(f"credit: {result['summary']['positions']} positions in {wall:.0f} s; report: {output_dir / 'report.md'}")


if __name__ == "__main__":
    app()
