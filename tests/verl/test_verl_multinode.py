"""verl's own trainer across Ray nodes, and pivotrl's plugin checked on every node at start-up.

- scripts/verl_multinode.sh runs ``python -m verl.trainer.main_ppo`` with ``trainer.nnodes=2`` on
  a two-node Ray cluster on this host (scripts/verl_local_cluster.py), ERPO and TEPO, and says on
  which node and rank verl ran each estimator and loss call (about 3 minutes on the 2-core CPU,
  so marked ``multinode``, which runs only when selected: ``pytest tests/verl -m multinode``);
- where verl's processes on a node lack pivotrl's plugin, main_ppo stops right after ``ray.init``,
  before verl starts its TaskRunner, with one line naming each such node and the fix
  (pivotrl/integrations/verl_cluster.py; about 50 s, three nodes starting, the driver importing
  verl, each node's check importing it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from pivotrl.integrations import verl_cluster

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "verl_multinode.sh"
CLUSTER = ROOT / "scripts" / "verl_local_cluster.py"
SUMMARY = ROOT / "scripts" / "verl_multinode_summary.py"
LINE = (
    "verl multinode: 2 nodes, 2 steps, estimator pivotrl_erpo, loss pivotrl_tepo on 2 nodes "
    "(ranks 0,1), entropies seen: yes, ref policy: yes"
)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.multinode  # outside the default run: see conftest.py
def test_two_nodes_run_the_estimator_and_the_loss_where_verl_places_them(tmp_path):
    work = tmp_path / "work"
    out = subprocess.run(
        ["bash", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=1500,
        env={**os.environ, "PYTHON": sys.executable, "PIVOTRL_VERL_MULTINODE_WORK": str(work)},
    )
    lines = out.stdout.strip().splitlines()
    assert lines, f"the script printed nothing; stderr:\n{out.stderr[-3000:]}"
    assert out.returncode == 0, "\n".join(lines[-80:])
    print("\n" + "\n".join(lines[-3:]))  # the wall time, where each call ran, the summary
    assert re.fullmatch(r"verl multinode took \d+ s on \w+", lines[-3]), lines[-3]
    assert lines[-1] == LINE

    nodes = [record["node_id"] for record in read_jsonl(work / "nodes.jsonl")]
    assert len(set(nodes)) == 2
    losses = read_jsonl(work / "probe.jsonl.loss.jsonl")
    placed = {(record["rank"], record["node_id"]) for record in losses}
    assert {rank for rank, _ in placed} == {0, 1} and {node for _, node in placed} == set(nodes)
    assert len(placed) == 2  # each rank stayed on its node
    steps = read_jsonl(work / "probe.jsonl")
    assert all(call["node_id"] in nodes for step in steps for call in step["received"])
    assert "pivotrl: its verl plugin loads on all 2 Ray nodes" in (work / "main_ppo.log").read_text()

    # The summary can fail: the same run with rank 1's loss calls left out ran the loss on one node.
    tampered = tmp_path / "tampered"
    shutil.copytree(work, tampered, ignore=shutil.ignore_patterns("model", "hydra", "*.parquet"))
    kept = [record for record in losses if record["rank"] == 0]
    (tampered / "probe.jsonl.loss.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    check = subprocess.run(
        [sys.executable, str(SUMMARY), str(tampered), "--estimator", "pivotrl_erpo", "--loss", "pivotrl_tepo"],
        capture_output=True, text=True, timeout=300,
    )
    assert check.returncode == 1
    assert "loss pivotrl_tepo on 1 nodes (ranks 0)" in check.stdout.splitlines()[-1]


def python_without_pivotrl(folder: Path) -> Path:
    """A Python environment with this one's packages (verl, Ray, torch) but not pivotrl.

    A venv whose .pth file puts this environment's site-packages on its path: Python runs the .pth
    files of its own site-packages only, and pivotrl's editable install is one there (an import
    hook), so pivotrl does not import while its metadata, verl.plugins entry point included, is
    still found, as after a broken or partial install.
    """
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()
    Path(site, "packages-of-the-verl-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    found = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('pivotrl') is None, u.find_spec('verl') is None)"],
        capture_output=True, text=True, check=True, timeout=60, cwd=folder, env={"PATH": os.environ.get("PATH", "")},
    ).stdout.split()
    if found != ["True", "False"]:
        pytest.skip(f"pivotrl is not an editable install here, so no environment sees verl without it ({found})")
    return python


@pytest.mark.slow
def test_nodes_without_the_plugin_stop_the_run_at_start_up(tmp_path):
    """Three nodes: the head as the driver's; node 1 whose raylet has VERL_USE_EXTERNAL_PLUGINS=none
    (verl there loads no plugin); node 2 joined with `ray start --address` by a Python without
    pivotrl. main_ppo stops after ray.init, before verl's TaskRunner, with one line naming both."""
    work = tmp_path / "work"
    subprocess.run([sys.executable, str(ROOT / "tests" / "verl" / "tiny_verl.py"), str(work), "--train", "16",
                    "--val", "8"], check=True, capture_output=True, timeout=300)
    overrides = subprocess.run(
        ["bash", str(SCRIPT), "--print-overrides", "cpu", str(work)],
        capture_output=True, text=True, check=True, timeout=60, env={**os.environ, "PYTHON": sys.executable},
    ).stdout.splitlines()
    bare = python_without_pivotrl(tmp_path / "venv")
    # Outside the repository and without it on PYTHONPATH: Ray puts the driver's current folder on
    # its workers' sys.path, and node 2's raylet would pass PYTHONPATH on to its workers; either
    # would make this checkout's pivotrl importable there.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, str(CLUSTER), "--nodes", "3", "--nodes-file", str(work / "nodes.jsonl"),
         "--node-env", "1:VERL_USE_EXTERNAL_PLUGINS=none", "--node-python", f"2:{bare}",
         "--", sys.executable, "-m", "verl.trainer.main_ppo", *overrides],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env,
    )
    took = time.monotonic() - start
    output = out.stdout + out.stderr
    nodes = [record["node_id"] for record in read_jsonl(work / "nodes.jsonl")]
    assert out.returncode != 0, output[-3000:]
    errors = [line for line in output.splitlines() if "PluginMissing: " in line]
    assert len(errors) == 1, output[-3000:]
    error = errors[0]
    print(f"\nrefused in {took:.0f} s: {error}")
    assert nodes[0] not in error
    assert f"Ray node {nodes[1]} " in error and "VERL_USE_EXTERNAL_PLUGINS=none there" in error
    assert f"Ray node {nodes[2]} " in error and f"{bare}): pivotrl is not installed for that Python" in error
    assert "on 2 of them" in error and "install pivotrl in that node's environment" in error
    assert "actor_rollout_ref.actor.policy_loss.loss_mode=pivotrl_tepo" in error
    # before any rollout: raised in the driver's ray.init, verl's TaskRunner never ran (its output
    # comes prefixed "(TaskRunnerV1 pid=...)"), nothing was probed
    assert "ray.init(**OmegaConf.to_container(ray_init_kwargs))" in output
    assert "(TaskRunnerV1 pid=" not in output
    assert not list(work.glob("probe.jsonl*"))


def test_the_driver_refuses_names_pivotrl_does_not_register_before_ray_starts(monkeypatch):
    """main_ppo's driver calls get_ppo_ray_runtime_env(config) just before ray.init; pivotrl's
    plugin wraps it, and a pivotrl_* name it does not register stops the run there."""
    from verl.trainer import constants_ppo

    config = OmegaConf.create({
        "algorithm": {"adv_estimator": "pivotrl_erpo"},
        "actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": "pivotrl_tepoo"}}},
        "trainer": {"use_v1": True, "v1": {"trainer_mode": "pivotrl_sync"}},
    })
    assert getattr(constants_ppo.get_ppo_ray_runtime_env, "_pivotrl_checks_nodes", False)
    with pytest.raises(ValueError, match=r"loss_mode=pivotrl_tepoo is not registered .* pivotrl_tepo, pivotrl_mpo"):
        constants_ppo.get_ppo_ray_runtime_env(config)
    config.actor_rollout_ref.actor.policy_loss.loss_mode = "vanilla"
    config.algorithm.adv_estimator = "pivotrl_pivot_mc"
    with pytest.raises(ValueError, match="pivot_mc and the oracles run in pivotrl's own trainer only"):
        constants_ppo.get_ppo_ray_runtime_env(config)
    # without pivotrl names, or with the check off, verl's runtime environment is unchanged
    monkeypatch.setenv(verl_cluster.SWITCH_ENV, "0")
    assert verl_cluster.CHECKED_ENV not in constants_ppo.get_ppo_ray_runtime_env(config)["env_vars"]
    monkeypatch.delenv(verl_cluster.SWITCH_ENV)
    plain = OmegaConf.create({"algorithm": {"adv_estimator": "grpo"}, "trainer": {"use_v1": True}})
    assert verl_cluster.CHECKED_ENV not in constants_ppo.get_ppo_ray_runtime_env(plain)["env_vars"]


def test_the_trainers_check_only_where_the_driver_has_not(monkeypatch):
    """The pivotrl trainers' constructor checks the nodes only for a driver that initialised Ray
    itself (no PIVOTRL_VERL_NODES_CHECKED in the job's environment), and refuses unknown names."""
    import ray

    config = OmegaConf.create({"algorithm": {"adv_estimator": "pivotrl_erpp"}, "trainer": {"use_v1": True}})
    assert not ray.is_initialized()
    monkeypatch.setenv(verl_cluster.CHECKED_ENV, "1")
    verl_cluster.check_from_trainer(config)  # the driver has checked: nothing to do
    monkeypatch.delenv(verl_cluster.CHECKED_ENV)
    with pytest.raises(ValueError, match="adv_estimator=pivotrl_erpp is not registered"):
        verl_cluster.check_from_trainer(config)
    config.algorithm.adv_estimator = "pivotrl_erpo"
    verl_cluster.check_from_trainer(config)  # without Ray there are no nodes to check
    assert not ray.is_initialized()


def test_requested_names_are_the_pivotrl_ones_verl_will_look_up():
    config = OmegaConf.create({
        "algorithm": {"adv_estimator": "pivotrl_ep_grpo"},
        "actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": "vanilla"}}},
        "trainer": {"use_v1": True, "v1": {"trainer_mode": "pivotrl_sync"}},
    })
    assert verl_cluster.requested_names(config) == {
        "algorithm.adv_estimator": "pivotrl_ep_grpo",
        "trainer.v1.trainer_mode": "pivotrl_sync",
    }
    config.trainer.use_v1 = False  # verl's legacy trainer has no trainer modes
    assert verl_cluster.requested_names(config) == {"algorithm.adv_estimator": "pivotrl_ep_grpo"}
