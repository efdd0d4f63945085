"""Which devices this machine has, checked before a model is loaded (torch only: quick to import)."""

from __future__ import annotations

import torch


def available_devices() -> list[str]:
    """'cpu', then each CUDA device ('cuda:0', ...) and 'mps' where present."""
    names = ["cpu"]
    if torch.cuda.is_available():
        names += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        names.append("mps")
    return names


def check_device(device: str, what: str = "model.device") -> None:
    """ValueError (one line, naming what this machine has) unless `device` is 'auto' or a device here."""
    if device == "auto":
        return
    has = ", ".join(available_devices())
    try:
        wanted = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(f"{what}={device!r} is not a device name (auto, cpu, cuda, cuda:N, mps); "
                         f"this machine has: {has}") from None
    if wanted.type == "cpu":
        return
    if wanted.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count and (wanted.index is None or wanted.index < count):
            return
    elif wanted.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available() and not wanted.index:
            return
    raise ValueError(f"{what}={device}: this machine has no such device; it has: {has}")


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX). Without either, torch emulates
    bfloat16 matmuls: a forward and backward of SmolLM2-135M took 15x as long as in float32 on an AVX2-only
    CPU (docs/PERFORMANCE.md, "bfloat16")."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)
