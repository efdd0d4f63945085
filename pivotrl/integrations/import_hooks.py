"""Run a function on a module right after its first import: how the verl adapter patches or extends
verl modules that it must not import itself (importing them costs seconds in every verl process).

    after_import("verl.trainer.ppo.v1", register_trainers)

calls ``register_trainers(module)`` now if ``verl.trainer.ppo.v1`` is already imported, else as
soon as its code has run, before the import statement that loaded it returns (so a module that
does ``from verl.utils.distributed import f`` gets the patched ``f``). A meta-path finder in front
of ``sys.meta_path`` sees only the names it waits for, and leaves them once loaded.
"""

from __future__ import annotations

import importlib.abc
import sys
import types
from collections.abc import Callable
from typing import Any

__all__ = ["after_import"]

Hook = Callable[[types.ModuleType], None]


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds a module with the other finders and wraps its loader's ``exec_module`` with hooks."""

    def __init__(self) -> None:
        self.hooks: dict[str, list[Hook]] = {}

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        hooks = self.hooks.pop(fullname)
        exec_module = loader.exec_module

        def exec_and_hook(module: types.ModuleType) -> None:
            exec_module(module)
            for hook in hooks:
                hook(module)

        loader.exec_module = exec_and_hook  # type: ignore[method-assign]
        return spec


_FINDER = _PostImportFinder()


def after_import(name: str, hook: Hook) -> None:
    """Call ``hook(module)`` when module ``name`` is imported: now, or once its code has run."""
    module = sys.modules.get(name)
    if module is not None:
        hook(module)
        return
    _FINDER.hooks.setdefault(name, []).append(hook)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
