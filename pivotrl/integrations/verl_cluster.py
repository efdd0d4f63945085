"""pivotrl's verl plugin on every node of a Ray cluster: a start-up check.

verl runs the advantage estimator in its TaskRunner and the policy loss in each actor worker,
Ray processes that it places on any node of the cluster. Each loads pivotrl's plugin at
``import verl`` (the ``verl.plugins`` entry point), and verl logs a plugin that fails to load at
DEBUG level only, so a node whose environment lacks pivotrl shows itself late and without its
cause: "Unknown trainer 'pivotrl_sync'", or, after the first rollout, "Unknown advantage
estimator" / "Unsupported loss mode". This module finds it at start-up instead.

:func:`check_nodes` runs one small Ray task on every alive node, pinned there, in a fresh worker
process of the job (the node's Python and environment, and the job's runtime environment, as
verl's own processes there get them). The task imports verl, which loads the plugins that
node's verl loads, and reports whether pivotrl's plugin is among them, and if not why (pivotrl
not installed for that Python, discovery turned off by ``VERL_USE_EXTERNAL_PLUGINS``, no entry
point, or the plugin's own import error, which verl would have logged at DEBUG level), and
whether each ``pivotrl_*`` estimator, loss and trainer the config asks for is registered there.
Any problem stops the run with one line (:class:`PluginMissing`) naming the nodes, what is
wrong on each and the fix. The task is pickled by value, so it runs where pivotrl is not
installed. It costs one verl import per node, in parallel (on a 2-core VM beside another job:
6 s for one node, 14-18 s for two).

It runs in ``main_ppo``'s driver, right after ``ray.init`` and before verl starts its TaskRunner:
pivotrl's plugin wraps verl's ``get_ppo_ray_runtime_env``, which ``main_ppo`` calls just before
``ray.init`` with the config (:func:`wrap_runtime_env`); the wrapper refuses ``pivotrl_*``
names that pivotrl does not have (:func:`check_names`, before Ray starts), and has Ray call
once connected, :func:`check_nodes` (``ray._private.worker._post_init_hooks``, the list of
functions ``ray.init`` calls once connected, which Ray's own libraries use; where a Ray lacks it,
the trainers check instead). It marks the runtime environment
(``PIVOTRL_VERL_NODES_CHECKED``), so that the pivotrl trainers, which otherwise run the same
check first thing in their constructor (for a driver that initialised Ray itself, before
``main_ppo.run_ppo``), skip it. ``PIVOTRL_VERL_NODE_CHECK=0`` in the driver's environment turns
both off.

This module imports neither torch nor verl: importing it costs nothing.
"""

from __future__ import annotations

import functools
import os
import sys
import time
import types
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "CHECKED_ENV",
    "SWITCH_ENV",
    "PluginMissing",
    "check_from_trainer",
    "check_names",
    "check_nodes",
    "node_report",
    "requested_names",
    "wrap_runtime_env",
]

PREFIX = "pivotrl_"
PLUGIN_MODULE = "pivotrl.integrations.verl"
#: set in the job's runtime environment once the driver has checked the nodes
CHECKED_ENV = "PIVOTRL_VERL_NODES_CHECKED"
#: "0" in the driver's environment: no node check
SWITCH_ENV = "PIVOTRL_VERL_NODE_CHECK"
#: seconds to wait for every node's answer
TIMEOUT_S = 300.0

#: the config keys whose value may name something pivotrl's plugin registers, and its kind
CONFIG_KEYS = {
    "algorithm.adv_estimator": "estimator",
    "actor_rollout_ref.actor.policy_loss.loss_mode": "loss",
    "trainer.v1.trainer_mode": "trainer",
}

FIX = (
    'install pivotrl in that node\'s environment (pip install "pivotrl[verl]" with the Python named), '
    "the same version as the driver's, and let verl load it (VERL_USE_EXTERNAL_PLUGINS unset, or naming pivotrl)"
)


class PluginMissing(RuntimeError):
    """A node of the cluster where verl would run a ``pivotrl_*`` name without pivotrl's plugin."""


def _select(config: Any, key: str) -> Any:
    node = config
    for part in key.split("."):
        if node is None:
            return None
        getter = getattr(node, "get", None)
        node = getter(part, None) if callable(getter) else getattr(node, part, None)
    return getattr(node, "value", node)  # enums (verl's AdvantageEstimator) by value


def requested_names(config: Any) -> dict[str, str]:
    """The config's ``pivotrl_*`` names, by config key (``{"algorithm.adv_estimator": "pivotrl_erpo", ...}``).

    The trainer mode counts only with verl's v1 trainer (``trainer.use_v1``, verl 0.9.1's default).
    """
    names = {}
    for key in CONFIG_KEYS:
        value = _select(config, key)
        if isinstance(value, str) and value.startswith(PREFIX):
            names[key] = value
    if "trainer.v1.trainer_mode" in names and _select(config, "trainer.use_v1") is False:
        del names["trainer.v1.trainer_mode"]
    return names


def check_names(names: Mapping[str, str]) -> None:
    """ValueError for a ``pivotrl_*`` name that this pivotrl does not register (a typo, pivot_mc, an oracle)."""
    from pivotrl.algorithms import POLICY_LOSSES
    from pivotrl.integrations import verl as pv

    known = {
        "estimator": [PREFIX + name for name in pv.adaptable_estimators()],
        "loss": [PREFIX + name for name in POLICY_LOSSES],
        "trainer": [PREFIX + mode for mode in pv.TRAINER_MODES],
    }
    for key, name in names.items():
        offered = known[CONFIG_KEYS[key]]
        if name not in offered:
            raise ValueError(
                f"{key}={name} is not registered by pivotrl's verl plugin; it registers {', '.join(offered)} "
                "(pivot_mc and the oracles run in pivotrl's own trainer only)"
            )


# ----------------------------------------------------------------------------- on each node


def node_report(names: Mapping[str, str]) -> dict[str, Any]:
    """What ``import verl`` loads in this process, for :func:`check_nodes` (runs on each node).

    Returns the node's id, host and Python, and ``problem``: None where pivotrl's plugin is
    loaded and registers every name in ``names`` (config key -> ``pivotrl_*`` name), else why not.
    Uses the standard library, Ray, verl and this module's constants only: it is pickled by value
    and runs where pivotrl is not installed.
    """
    import importlib
    import importlib.metadata
    import importlib.util
    import os
    import socket
    import sys

    report: dict[str, Any] = {"host": socket.gethostname(), "python": sys.executable, "problem": None}
    try:
        import ray

        report["node_id"] = ray.get_runtime_context().get_node_id()
        report["ip"] = ray.util.get_node_ip_address()
    except Exception:  # outside Ray
        report["node_id"] = report["ip"] = None
    try:
        import verl  # noqa: F401  (loads the verl.plugins entry points this node's verl allows)
    except Exception as exc:
        report["problem"] = f"verl does not import ({type(exc).__name__}: {exc})"
        return report

    policy = os.environ.get("VERL_USE_EXTERNAL_PLUGINS", "auto").strip().lower()
    if PLUGIN_MODULE not in sys.modules:
        entry_points = [ep for ep in importlib.metadata.entry_points(group="verl.plugins") if ep.name == "pivotrl"]
        if importlib.util.find_spec("pivotrl") is None:
            report["problem"] = "pivotrl is not installed for that Python"
        elif policy == "none" or (policy != "auto" and "pivotrl" not in {p.strip() for p in policy.split(",")}):
            report["problem"] = f"VERL_USE_EXTERNAL_PLUGINS={policy} there keeps verl from loading it"
        elif not entry_points:
            report["problem"] = "pivotrl is importable but not installed (no verl.plugins entry point: on PYTHONPATH only?)"
        else:
            try:
                importlib.import_module(PLUGIN_MODULE)
                report["problem"] = "verl did not load pivotrl's plugin"
            except Exception as exc:
                report["problem"] = f"pivotrl's plugin fails to import ({type(exc).__name__}: {exc})"
        return report

    missing = []
    wanted = {key: name for key, name in names.items() if not key.startswith("trainer.")}
    if wanted:
        from verl.trainer.ppo import core_algos

        registries = {
            "algorithm.adv_estimator": core_algos.ADV_ESTIMATOR_REGISTRY,
            "actor_rollout_ref.actor.policy_loss.loss_mode": core_algos.POLICY_LOSS_REGISTRY,
        }
        missing += [name for key, name in wanted.items() if name not in registries[key]]
    trainer = names.get("trainer.v1.trainer_mode")
    # the plugin registers its trainers when verl imports its v1 package (5 s), unless told not to
    if trainer is not None and os.environ.get("PIVOTRL_VERL_TRAINERS", "1") == "0":
        missing.append(f"{trainer} (PIVOTRL_VERL_TRAINERS=0 there)")
    if missing:
        try:
            version = importlib.metadata.version("pivotrl")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
        report["problem"] = f"its pivotrl ({version}) does not register {', '.join(missing)}"
    return report


def _describe(report: Mapping[str, Any]) -> str:
    where = ", ".join(str(report[key]) for key in ("host", "ip", "python") if report.get(key))
    return f"Ray node {report.get('node_id') or '?'} ({where}): {report['problem']}"


def check_nodes(names: Mapping[str, str], timeout_s: float = TIMEOUT_S) -> list[dict[str, Any]]:
    """Run :func:`node_report` on every alive node of the connected Ray cluster; raise
    :class:`PluginMissing` (one line) where any has a problem; return the reports."""
    import ray
    import ray.cloudpickle
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # by value: the task must run where pivotrl is not importable (and say so)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # max_calls=1: the worker exits after its answer, and gives its memory back
    probe = ray.remote(num_cpus=0, max_calls=1, max_retries=0)(node_report)
    start = time.monotonic()
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    pending = {
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote(dict(names)): node
        for node in nodes
    }
    ready, late = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
    reports = []
    for ref in ready:
        node = pending[ref]
        try:
            reports.append(ray.get(ref))
        except Exception as exc:
            last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            reports.append({"node_id": node["NodeID"], "ip": node.get("NodeManagerAddress"),
                            "problem": f"the check failed there ({last})"})
    for ref in late:
        node = pending[ref]
        ray.cancel(ref, force=True)
        reports.append({"node_id": node["NodeID"], "ip": node.get("NodeManagerAddress"),
                        "problem": f"no answer in {timeout_s:.0f} s (a Ray worker there did not start or import verl)"})
    bad = [report for report in reports if report["problem"]]
    if bad:
        asked = ", ".join(f"{key}={name}" for key, name in names.items())
        if len(reports) == 1:
            where = "on the one Ray node, where"
        else:
            where = f"on any of the {len(reports)} Ray nodes, and on {len(bad)} of them"
        raise PluginMissing(
            f"verl places its TaskRunner and workers {where} pivotrl's plugin cannot run {asked}: "
            f"{'; '.join(_describe(report) for report in bad)}. Fix: {FIX}"
        )
    where = "the one Ray node" if len(reports) == 1 else f"all {len(reports)} Ray nodes"
    print(f"pivotrl: its verl plugin loads on {where} and registers "
          f"{', '.join(names.values())} there (checked in {time.monotonic() - start:.1f} s)", flush=True)
    return reports


# ----------------------------------------------------------------------------- in main_ppo's driver


def _switched_off() -> bool:
    return os.environ.get(SWITCH_ENV, "1").strip() == "0"


def _after_ray_init(names: Mapping[str, str]) -> Callable[[], None]:
    """A one-shot Ray post-init hook that checks the nodes."""

    def hook() -> None:
        hooks = _post_init_hooks()
        if hooks is not None and hook in hooks:
            hooks.remove(hook)
        check_nodes(names)

    return hook


def _post_init_hooks() -> list | None:
    """Ray's list of functions that ``ray.init`` calls once connected (None where this Ray has none)."""
    worker = sys.modules.get("ray._private.worker")
    hooks = getattr(worker, "_post_init_hooks", None)
    return hooks if isinstance(hooks, list) else None


def wrap_runtime_env(constants_ppo: types.ModuleType) -> None:
    """Wrap ``verl.trainer.constants_ppo.get_ppo_ray_runtime_env`` (called by ``main_ppo`` right
    before ``ray.init``, with the config): refuse unknown ``pivotrl_*`` names, then check every
    node once Ray is connected, and tell the trainers so through the runtime environment."""
    original = constants_ppo.get_ppo_ray_runtime_env
    if getattr(original, "_pivotrl_checks_nodes", False):
        return

    @functools.wraps(original)
    def get_ppo_ray_runtime_env(config: Any = None, *args: Any, **kwargs: Any) -> dict:
        runtime_env = original(config, *args, **kwargs)
        names = requested_names(config) if config is not None else {}
        if names and not _switched_off():
            check_names(names)
            hooks = _post_init_hooks()
            if hooks is not None:
                hooks.append(_after_ray_init(names))
                runtime_env.setdefault("env_vars", {})[CHECKED_ENV] = "1"
        return runtime_env

    get_ppo_ray_runtime_env._pivotrl_checks_nodes = True  # type: ignore[attr-defined]
    constants_ppo.get_ppo_ray_runtime_env = get_ppo_ray_runtime_env


def check_from_trainer(config: Any) -> None:
    """The pivotrl trainers' check (first thing in their constructor), unless the driver has checked."""
    if os.environ.get(CHECKED_ENV) == "1" or _switched_off():
        return
    names = requested_names(config)
    if not names:
        return
    check_names(names)
    import ray

    if ray.is_initialized():
        check_nodes(names)
