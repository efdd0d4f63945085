"""Run configuration: one pydantic model per section, loaded from YAML with dotted overrides."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pivotrl.errors import ConfigError
from pivotrl.train.recipes import find_recipe, shipped_recipes


class Section(BaseModel):
    """A config section: unknown keys are errors, every field has a default and a doc."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


class LoRAConfig(Section):
    """LoRA for the RL update (peft): only the adapter's parameters train; the reference policy is the base,
    the adapter switched off (docs/USAGE.md, "LoRA")."""

    r: int = Field(16, ge=1)
    """Rank of each adapter: the update of a weight W (out x in) is s·B A, B out x r, A r x in."""
    alpha: float = Field(32.0, gt=0)
    """Scale of the adapter's output: s = alpha / r."""
    target_modules: str | Annotated[list[str], Field(min_length=1)] = "all-linear"
    """Which linear layers get an adapter: 'all-linear' (every linear layer of the decoder; never the LM head) or their names as peft matches them ([q_proj, v_proj], ...)."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapter's input in the training forwards (ℓ^old and the update's); the engines sample without it, so above 0 it widens rollout/logprob_diff."""


class ModelConfig(Section):
    name_or_path: str = "tiny"
    """'tiny' (the shipped countdown policy), 'tiny-search' (the shipped countdown_search policy), 'tiny-free' (the shipped countdown_free policy), 'tiny-random' (a fresh tiny model, for tests), or a local path / hub id."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """What the policy and the reference model compute in. The weights stay float32 (the master copy AdamW updates and checkpoints hold); bfloat16 / float16 run every forward under torch.autocast, and the vllm engine samples in that dtype."""
    device: str = "auto"
    """'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:1', ..."""
    chat_template: bool | None = None
    """Render prompts with the tokenizer's chat template (true) or the task's plain template (false); None: the form the model was trained in, where pivotrl recorded it (a warm start, a run's checkpoint: modeling/prompt_form.py), else plain."""
    ref_model: str | None = None
    """Reference model: None = the policy's initial weights (kept only when a method needs it; with model.lora the base, the adapter switched off, no copy), 'none' = no reference model, or a path."""
    arch: dict[str, int] = Field(default_factory=dict)
    """Overrides of the tiny architecture for 'tiny-random' (hidden_size, num_hidden_layers, ...)."""
    logprob_chunk_size: int = Field(1024, ge=1)
    """Positions per chunk when computing log-probs and entropies through the LM head."""
    gradient_checkpointing: bool = False
    """Trade compute for memory in the policy's backward (large models)."""
    lora: LoRAConfig | None = None
    """Train a LoRA adapter instead of every weight ({r: 8}, ...; null: every weight trains). Needs peft and a base model a checkpoint can name (not tiny-random)."""


class TaskConfig(Section):
    name: str = "countdown"
    """Registered task name (countdown, arithmetic, linear, gsm8k, math500, aime24, amc23, file, hub)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword options of the task (e.g. num_numbers, path, question_field)."""


class BranchConfig(Section):
    """Branching at the pivots (docs/ALGORITHMS.md, "Branching rollouts"): off while pivots is 0."""

    pivots: int = Field(0, ge=0)
    """m: pivots per response, its highest-entropy tokens (0: no branching)."""
    spacing: int = Field(4, ge=1)
    """Least distance, in tokens, between two pivots of one response."""
    branches: int = Field(4, ge=1)
    """K: continuations sampled from each pivot's prefix."""
    train_on_branches: bool = False
    """Also train on the branches, each pivot's K continuations as one group ([choice], docs/ALGORITHMS.md)."""


class RolloutConfig(Section):
    engine: Literal["hf", "vllm"] = "hf"
    """Generation engine: hf (transformers, any device) or vllm (vLLM on the CPU or one GPU; docs/INTEGRATIONS.md)."""
    prompts_per_step: int = Field(32, ge=1)
    """Prompts sampled per training step."""
    group_size: int = Field(8, ge=1)
    """Responses sampled per prompt (G)."""
    max_new_tokens: int | None = Field(None, ge=1)
    """Longest response, in tokens (L_max); None: the task's limit for the model's tokenizer (Task.response_limit: 34 for countdown with the tiny policies, 78 on SmolLM2)."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """Truncate prompts to this many tokens (None: no limit)."""
    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature (also applied to the log-probs the losses use)."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass."""
    max_logprob_diff: Annotated[float, Field(ge=0)] | Literal["auto"] | None = "auto"
    """Sampler check: abort when rollout/logprob_diff (mean |ℓ^sampler − ℓ^old| over response tokens) stays above this (auto: 0.02 in float32, 0.1 in bfloat16/float16; null: off; see docs/ALGORITHMS.md)."""
    logprob_diff_patience: int = Field(3, ge=1)
    """Sampler check: consecutive steps above rollout.max_logprob_diff before the run aborts."""
    gpu_memory_utilization: float = Field(0.3, gt=0.0, le=1.0)
    """vllm engine: share of the GPU's memory vLLM may take for its weights and KV cache (on the CPU: VLLM_CPU_KVCACHE_SPACE)."""
    enforce_eager: bool | None = None
    """vllm engine: no torch.compile or CUDA graphs (None: eager on the CPU, where it starts in seconds, not minutes)."""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal and sample more prompts to refill."""
    max_resample_rounds: int = Field(3, ge=0)
    """How many extra sampling rounds dynamic sampling may use per step."""
    overlong_shaping: bool = False
    """DAPO overlong shaping: a linear length penalty inside the last `overlong_cache` tokens."""
    overlong_cache: int = Field(8, ge=1)
    """L_cache of the overlong shaping window."""
    branch: BranchConfig = Field(default_factory=BranchConfig)
    """Branching at the pivots, for pivot_mc (off by default)."""


class AlgorithmConfig(Section):
    estimator: str = "erpo"
    """Advantage estimator (pivotrl.algorithms.ESTIMATORS)."""
    estimator_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Estimator hyperparameters, e.g. {gamma: 5.0, eta: 0.2}."""
    policy_loss: str = "ppo"
    """Policy loss (ppo, gspo, tepo, mpo)."""
    loss_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Loss hyperparameters, e.g. {eps_low: 0.2, eps_high: 0.28, beta_kl: 0.0}."""
    loss_agg_mode: str | None = None
    """token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm (None: the loss's default)."""


class TrainConfig(Section):
    seed: int = 0
    """Seed of every random number generator of the run."""
    max_steps: int = Field(200, ge=0)
    """Training steps."""
    lr: float = Field(1e-4, gt=0)
    """Peak AdamW learning rate."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    adam_betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.99)
    """AdamW betas."""
    warmup_steps: int = Field(5, ge=0)
    """Linear warm-up steps before the cosine decay."""
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    """Final learning rate of the cosine decay, as a fraction of lr."""
    ppo_epochs: int = Field(1, ge=1)
    """Passes over each step's rollouts."""
    num_minibatches: int = Field(1, ge=1)
    """Optimizer steps per epoch: the rollouts are split into this many near-equal minibatches, every row in one."""
    micro_batch_size: int | None = Field(None, ge=1)
    """Responses per forward/backward (gradient accumulation); None: the whole minibatch."""
    max_grad_norm: float | None = Field(1.0, gt=0)
    """Gradient-norm clipping (None: off)."""
    num_threads: int | None = Field(None, ge=1)
    """torch CPU threads (None: torch's default)."""
    max_nan_steps: int = Field(3, ge=1)
    """Abort after this many consecutive steps with a NaN/inf loss or gradient."""


class EvalConfig(Section):
    task: TaskConfig | None = None
    """Held-out task when it differs from the training task (None: the training task's held-out split)."""
    every: int = Field(0, ge=0)
    """Evaluate every N steps during training (0: only before and after)."""
    before_after: bool = True
    """Evaluate the initial and the final policy and write summary.json."""
    num_problems: int = Field(500, ge=1)
    """Held-out problems per evaluation (the first N of the task's held-out split)."""
    samples_per_problem: int = Field(1, ge=1)
    """k: samples per problem (pass@1 is averaged over them; pass@k and maj@k use all)."""
    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature at evaluation."""
    max_new_tokens: int | None = Field(None, ge=1)
    """Longest response at evaluation (None: rollout.max_new_tokens)."""
    batch_size: int = Field(256, ge=1)
    """Responses generated at once during evaluation."""
    reuse_before: bool = True
    """Reuse the evaluation before training from a run that drew it already: same weights, prompts, settings,
    engine, pivotrl source and library versions (train/before_cache.py; the cache: $PIVOTRL_EVAL_CACHE)."""


class LogConfig(Section):
    progress: bool = True
    """Show progress: a live bar with ETA and reward on a terminal, plain lines otherwise (a log file)."""
    print_every: int = Field(10, ge=1)
    """When the output is not a terminal: print a plain progress line every N steps."""
    tensorboard: bool = False
    """Also log to TensorBoard (extra: tensorboard)."""
    wandb: bool = False
    """Also log to Weights & Biases in offline mode (extra: wandb)."""
    mlflow: bool = False
    """Also log to MLflow with a local file store (extra: mlflow)."""


class CheckpointConfig(Section):
    every: int = Field(50, ge=0)
    """Save every N steps (0: only at the end)."""
    keep: int = Field(2, ge=1)
    """Finished checkpoints kept (older ones are deleted)."""


class RunConfig(Section):
    output_dir: str = "runs/default"
    """Folder of metrics.jsonl, checkpoints/, eval samples and summary.json."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)


_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")



def unknown_key(key: str, valid: Any, prefix: str = "", what: str = "config key") -> ConfigError:
    """The error for an unknown `prefix+key`, naming the nearest of `valid` (or listing them)."""
    valid = [str(v) for v in valid]
    near = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.5)
    hint = f"; did you mean '{prefix}{near[0]}'?" if near else f"; valid keys: {', '.join(valid) or 'none'}"
    return ConfigError(f"unknown {what} '{prefix}{key}'{hint}")


def _section_type(annotation: Any) -> type[BaseModel] | None:
    """The section model of a field annotated `Section` or `Section | None`, else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, UnionType):
        models = [a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        return models[0] if len(models) == 1 else None
    return None


def _section_holding(key: str, model: type[BaseModel]) -> str | None:
    """The section of `model` that has a field named `key` ('lr' -> 'train'), or None."""
    for name, info in model.model_fields.items():
        section = _section_type(info.annotation)
        if section is not None and key in section.model_fields:
            return name
    return None


def _tiny_arch_keys() -> list[str]:
    from pivotrl.modeling.tiny import TINY_ARCH

    return list(TINY_ARCH)


#: Free mappings of the config whose keys are known here (the others, task options and the
#: algorithm's kwargs, are checked against the task or the registry before a run starts).
FREE_DICT_KEYS = {"model.arch": _tiny_arch_keys}


def _check_keys(data: Any, model: type[BaseModel], prefix: str = "") -> None:
    """Raise ConfigError naming an unknown key, at any depth, and its nearest valid spelling."""
    if not isinstance(data, dict):
        return
    fields = model.model_fields
    for key, value in data.items():
        if key not in fields:
            home = _section_holding(key, model)
            if home is not None:
                raise ConfigError(f"unknown config key '{prefix}{key}'; did you mean '{prefix}{home}.{key}'?")
            raise unknown_key(key, fields, prefix)
        dotted = f"{prefix}{key}"
        section = _section_type(fields[key].annotation)
        if section is not None:
            _check_keys(value, section, f"{dotted}.")
        elif dotted in FREE_DICT_KEYS and isinstance(value, dict) and value:
            valid = FREE_DICT_KEYS[dotted]()
            for sub in value:
                if sub not in valid:
                    raise unknown_key(sub, valid, f"{dotted}.")


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set '{dotted}': '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """'train.max_steps=4' -> ('train.max_steps', 4); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has no key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"override '{key}': cannot parse value {raw!r}: {err}") from None
    if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):  # YAML 1.1 reads 3e-4 as a string
        value = float(value)
    return key, value


def build_config(data: dict[str, Any] | None = None, overrides: list[str] = ()) -> RunConfig:
    """A validated RunConfig from a dict and 'dotted.key=value' overrides."""
    data = dict(data or {})
    for text in overrides:
        key, value = parse_override(text)
        _set_dotted(data, key, value)
    _check_keys(data, RunConfig)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            where = ".".join(str(p) for p in e["loc"]) or "config"
            problems.append(f"'{where}': {e['msg']}")
        raise ConfigError("invalid config: " + "; ".join(problems)) from None


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        out[key] = _deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A recipe as a dict; a top-level `base: NAME_OR_PATH` is read first and deep-merged under it.

    `path` and `base` may name a shipped recipe ('grpo'): see recipes.find_recipe. A base is looked
    for beside the recipe first, so a folder of one's own recipes can inherit from each other."""
    path = find_recipe(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder, not a file; give a YAML file")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist, and no shipped recipe has that name "
                          f"(shipped: {', '.join(shipped_recipes())})")
    if path.resolve() in seen:
        raise ConfigError(f"'base' of {path} makes a cycle")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {err.start}: {err.reason}); "
                          "give a YAML file") from None
    if not text.strip():
        raise ConfigError(f"config file {path} is empty; give a recipe (configs/*.yaml), or leave --config out "
                          "for the default one")
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    base = data.pop("base", None)
    if base is None:
        return data
    beside = path.parent / (base if str(base).endswith((".yaml", ".yml")) else f"{base}.yaml")
    base_path = beside if beside.is_file() else Path(base)  # a recipe beside this one, else a path or a shipped name
    return _deep_merge(_read_yaml(base_path, (*seen, path.resolve())), data)


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> RunConfig:
    """Read a YAML recipe (None: all defaults; `base:` inherits another recipe) and apply dotted overrides."""
    data = _read_yaml(Path(path)) if path is not None else {}
    return build_config(data, overrides)


def dump_config(config: RunConfig) -> str:
    """The config as YAML, every field written out."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def flat_config(config: RunConfig | dict[str, Any]) -> dict[str, Any]:
    """{'train.max_steps': 200, 'task.options.num_numbers': 3, ...}: every leaf by its dotted key
    (mappings are descended into, so their keys are compared one by one)."""
    data = config.model_dump(mode="json") if isinstance(config, BaseModel) else config
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):  # an empty mapping adds no key: {} and {a: 1} differ in 'a' only
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            out[prefix[:-1]] = node

    walk(data, "")
    return out


def config_differences(old: RunConfig, new: RunConfig, ignore: tuple[str, ...] = ()) -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) for every setting that differs, except the keys in
    `ignore` and those below them ('log' ignores every log.* key)."""
    a, b = flat_config(old), flat_config(new)
    missing = object()
    diffs = []
    for key in sorted(set(a) | set(b)):
        if any(key == i or key.startswith(f"{i}.") for i in ignore):
            continue
        va, vb = a.get(key, missing), b.get(key, missing)
        if va != vb:
            diffs.append((key, None if va is missing else va, None if vb is missing else vb))
    return diffs


def describe_differences(diffs: list[tuple[str, Any, Any]], old: str = "run", new: str = "given") -> str:
    """'algorithm.estimator (run: grpo, given: erpo), train.lr (run: 0.001, given: 0.01)'."""
    def show(value: Any) -> str:
        return "unset" if value is None else yaml.safe_dump(value, default_flow_style=True, width=10**6).strip() \
            .removesuffix("...").strip()

    return ", ".join(f"{key} ({old}: {show(a)}, {new}: {show(b)})" for key, a, b in diffs)
