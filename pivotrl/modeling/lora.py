"""LoRA on a policy (peft): the adapter added to a model, its merged weights, its files.

A LoRA layer computes W x + s·B A x (s = alpha / r, B zero at the start). The trainer keeps the
transformers model with peft's LoRA layers injected as its policy (``PeftModel.get_base_model()``),
so that code reading a causal LM's parts (the decoder under ``base_model_prefix``, the head from
``get_output_embeddings()``) finds them, and the ``PeftModel`` handle to switch the adapter off
(the reference policy: the base) and to save the adapter.

:func:`merged_parameters` gives every weight under its plain Hugging Face name with each adapted
weight merged, W + s·B A, computed out of place: the base weights are never changed, so they cannot
drift. The vLLM engine's weight push and ``pivotrl export`` (through :func:`merge_into_base`) read
it. A checkpoint of a LoRA run holds ``adapter_config.json`` (the base model's resolved path in
``base_model_name_or_path``) and ``adapter_model.safetensors``; :func:`load_merged` loads one
onto its base.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

#: The files of a saved adapter (peft's names).
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: peft's name of the one adapter pivotrl trains.
ADAPTER_NAME = "default"
#: How to get peft, named in the errors of a command that needs it.
INSTALL = "pip install 'pivotrl[lora]' (peft>=0.21,<0.22)"


def peft_installed() -> bool:
    """Whether peft can be imported (checked without importing it)."""
    import importlib.util

    return importlib.util.find_spec("peft") is not None


def is_adapter_folder(folder: str | Path) -> bool:
    """Whether `folder` holds a saved LoRA adapter (adapter_config.json) and no full model (config.json)."""
    folder = Path(folder)
    return (folder / ADAPTER_CONFIG).is_file() and not (folder / "config.json").is_file()


def adapter_base(folder: str | Path) -> str:
    """The base model a saved adapter was trained on: its adapter_config.json's base_model_name_or_path.
    ValueError naming the file when it names none."""
    path = Path(folder) / ADAPTER_CONFIG
    try:
        base = json.loads(path.read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: unreadable ({err})") from None
    if not base:
        raise ValueError(f"{path} names no base model (base_model_name_or_path)")
    return str(base)


def add_lora(model: torch.nn.Module, *, r: int, alpha: float, target_modules: str | list[str], dropout: float,
             seed: int, base_path: str | None = None) -> Any:
    """Inject a LoRA adapter into `model` (in place) and return peft's PeftModel around it.

    A is drawn from torch's generator seeded with `seed` (the global generators are left as they
    were), B is zero, so the adapted model starts equal to the base. Only the adapter's parameters
    require gradients. `base_path` is what the saved adapter_config.json names as its base.
    ValueError naming model.lora.target_modules when they match no layer, or a layer that is not a
    linear one or is the LM head (pivotrl's log-prob path reads the head's weight directly).
    """
    from peft import LoraConfig

    head = model.get_output_embeddings()
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=target_modules, lora_dropout=dropout, bias="none",
                        task_type="CAUSAL_LM")
    try:
        lora = _inject(model, config, seed)
    except ValueError as err:
        raise ValueError(f"model.lora.target_modules={target_modules!r}: {' '.join(str(err).split())}") from None
    lora.peft_config[ADAPTER_NAME].base_model_name_or_path = base_path  # get_peft_model sets the model's own name
    for name, layer in lora_layers(lora.get_base_model()).items():
        base = layer.get_base_layer()
        if base is head or not isinstance(base, torch.nn.Linear):
            what = "the LM head" if base is head else f"a {type(base).__name__}"
            raise ValueError(f"model.lora.target_modules={target_modules!r} reaches {name}, {what}: LoRA here adapts "
                             "the linear layers of the decoder only ('all-linear', or their names: q_proj, v_proj, ...)")
    return lora


def _inject(model: torch.nn.Module, config: Any, seed: int) -> Any:
    """get_peft_model with the adapter's initial draws from a generator seeded with `seed`."""
    import warnings

    from peft import get_peft_model

    with torch.random.fork_rng(devices=range(torch.cuda.device_count())), warnings.catch_warnings():
        # peft 0.21 reads transformers' deprecated is_gradient_checkpointing (a FutureWarning on every call)
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        torch.manual_seed(seed)
        return get_peft_model(model, config, adapter_name=ADAPTER_NAME)


def lora_layers(model: torch.nn.Module) -> dict[str, Any]:
    """peft's LoRA layers injected in `model`, by module name ({} without any)."""
    import sys

    tuner = sys.modules.get("peft.tuners.lora")  # a model holds LoRA layers only once peft made them
    if tuner is None:
        return {}
    return {name: module for name, module in model.named_modules() if isinstance(module, tuner.LoraLayer)}


def merged_weight(layer: Any, weight: torch.Tensor) -> torch.Tensor:
    """W + s·B A of a LoRA layer's base `weight` over its active adapters (a new tensor; `weight` unchanged).
    With the adapters switched off, W itself."""
    if layer.merged:
        raise RuntimeError("a LoRA layer was merged in place; pivotrl merges out of place only (merged_parameters)")
    if layer.disable_adapters:
        return weight.detach()
    merged = weight.detach().clone()
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A:
            merged += layer.get_delta_weight(adapter).to(merged.dtype)
    return merged


@torch.no_grad()
def merged_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every weight of `model` under its plain Hugging Face name, as named_parameters()
    gives them, one at a time: where peft's LoRA layers are injected, the base weight merged with the
    adapter (merged_weight) under the layer's own name, and the adapter's A and B left out. For a model
    without LoRA layers, its named_parameters(), detached."""
    layers = lora_layers(model)
    for name, param in model.named_parameters():
        owner, base, leaf = name.partition(".base_layer.")
        if base and owner in layers:
            yield f"{owner}.{leaf}", merged_weight(layers[owner], param) if leaf == "weight" else param.detach()
        elif name.partition(".lora_")[0] not in layers:  # not an adapter's own A or B
            yield name, param.detach()


def merge_into_base(lora: Any) -> torch.nn.Module:
    """The plain transformers model of a PeftModel with its adapter merged into the weights (W + s·B A):
    peft's LoRA layers removed, every weight under its plain name. The PeftModel is used up."""
    merged = dict(merged_parameters(lora.get_base_model()))
    model = lora.unload()
    with torch.no_grad():
        for name, tensor in merged.items():
            target = model.get_parameter(name)
            if target.data_ptr() != tensor.data_ptr():
                target.copy_(tensor)
    return model


def save_adapter(lora: Any, folder: str | Path) -> None:
    """Write the adapter's files into `folder`: adapter_config.json and adapter_model.safetensors (peft's
    save_pretrained, with the model card it writes beside them)."""
    lora.save_pretrained(str(folder), safe_serialization=True, save_embedding_layers=False)


def load_adapter_weights(lora: Any, folder: str | Path) -> None:
    """Set the adapter of PeftModel `lora` to the one saved in `folder` (safetensors only, nothing in it can
    run). ValueError naming the file when it is missing, damaged, or does not fit the adapter's layers."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    path = Path(folder) / ADAPTER_WEIGHTS
    if not path.is_file():
        raise ValueError(f"{path}: missing")
    try:
        tensors = load_file(str(path))
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types for damaged files
        raise ValueError(f"{path}: damaged ({_first_line(err)})") from None
    ours = {k for k in lora.state_dict() if ".lora_" in k}
    try:
        result = set_peft_model_state_dict(lora, tensors, adapter_name=ADAPTER_NAME)
    except RuntimeError as err:  # shapes that do not fit: torch lists them one a line, under a heading
        lines = [line.strip() for line in str(err).strip().splitlines()[1:] if line.strip()] or [_first_line(err)]
        more = f" and {len(lines) - 1} more" if len(lines) > 1 else ""
        raise ValueError(f"{path} does not fit this adapter: {lines[0].rstrip('.')}{more}") from None
    missing = sorted(k for k in result.missing_keys if k in ours)
    if result.unexpected_keys or missing:
        extra = sorted(result.unexpected_keys)
        raise ValueError(f"{path} does not fit this adapter: " + "; ".join(
            f"{what} {names[0]}" + (f" and {len(names) - 1} more" if len(names) > 1 else "")
            for what, names in (("it lacks", missing), ("it has no place for", extra)) if names))


def load_merged(folder: str | Path, base: torch.nn.Module) -> torch.nn.Module:
    """`base` (the model adapter_base(folder) names, loaded) with the adapter saved in `folder` merged into it."""
    from peft import LoraConfig

    config = LoraConfig.from_pretrained(str(folder))
    config.base_model_name_or_path = None  # get_peft_model sets base's own name (and warns when it differs)
    lora = _inject(base, config, seed=0)
    load_adapter_weights(lora, folder)
    return merge_into_base(lora)


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__
