"""A Ray cluster of several nodes on this host, around one command (scripts/verl_multinode.sh).

    python scripts/verl_local_cluster.py [--nodes 2] [--num-cpus 16] [--num-gpus 1]
        [--object-store-mib 1024] [--node-env INDEX:NAME=VALUE ...] [--node-python INDEX:PYTHON ...]
        [--nodes-file PATH] -- COMMAND [ARG ...]

starts a head node and ``--nodes - 1`` more with ``ray.cluster_utils.Cluster`` (each node its own
raylet with its own resources, all on this host), runs COMMAND with ``RAY_ADDRESS`` set to the
head node, then shuts the cluster down with ``Cluster.shutdown`` (this cluster's processes only:
never ``ray stop``, which ends every Ray process on the host) and exits with COMMAND's status.
SIGTERM and SIGINT (e.g. from ``timeout``) stop COMMAND and shut the cluster down too.

Each node's raylet, and so every Ray worker it starts, inherits this process's environment as it
was when the node started, plus that node's ``--node-env`` variables (index 0 is the head node):
export what every node needs before calling this script. Ray's files (sockets, session logs, and
the address file a plain ``ray.init()`` on this host would look for) go to a temporary folder of
their own under /tmp, removed at the end, so no other Ray program on the host joins this cluster.

``--node-python INDEX:PYTHON`` starts node INDEX (not the head) as another host would join:
``PYTHON -m ray.scripts.scripts start --address=<head> --block`` (``ray start``, run by that
Python, whose Ray workers then run that Python too); it is stopped with SIGTERM, which stops
its processes.

``--nodes-file PATH`` writes one JSON line per node before COMMAND starts: its index, Ray node id
and ``--node-env`` variables.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def node_env(specs: list[str], nodes: int) -> dict[int, dict[str, str]]:
    """``INDEX:NAME=VALUE`` specifications, by node index."""
    env: dict[int, dict[str, str]] = {}
    for spec in specs:
        index, sep, assignment = spec.partition(":")
        name, eq, value = assignment.partition("=")
        if not (sep and eq and index.isdigit() and name):
            raise SystemExit(f"verl_local_cluster.py: --node-env takes INDEX:NAME=VALUE, got {spec!r}")
        if int(index) >= nodes:
            raise SystemExit(f"verl_local_cluster.py: --node-env {spec!r}: there are {nodes} nodes (0-{nodes - 1})")
        env.setdefault(int(index), {})[name] = value
    return env


def node_python(specs: list[str], nodes: int) -> dict[int, str]:
    """``INDEX:PYTHON`` specifications, by node index (not the head's)."""
    pythons = {}
    for spec in specs:
        index, sep, python = spec.partition(":")
        if not (sep and index.isdigit() and python):
            raise SystemExit(f"verl_local_cluster.py: --node-python takes INDEX:PYTHON, got {spec!r}")
        if not 0 < int(index) < nodes:
            raise SystemExit(f"verl_local_cluster.py: --node-python {spec!r}: not the head, one of 1-{nodes - 1}")
        pythons[int(index)] = python
    return pythons


def _live_nodes(cluster: object) -> list[str]:
    return [node["NodeID"] for node in cluster.global_state.node_table() if node["Alive"]]


def _wait_for(cluster: object, count: int, joining: subprocess.Popen, timeout_s: float = 120) -> str:
    """The id of the node that joins as the ``count``-th (started by ``joining``)."""
    known = set(_live_nodes(cluster))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if joining.poll() is not None:
            raise SystemExit(f"verl_local_cluster.py: `ray start` exited with status {joining.returncode}")
        new = [node for node in _live_nodes(cluster) if node not in known]
        if new and len(known) + len(new) >= count:
            return new[0]
        time.sleep(0.5)
    raise SystemExit(f"verl_local_cluster.py: no node joined in {timeout_s:.0f} s")


def _stop(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2, help="nodes, the head included (default 2)")
    parser.add_argument("--num-cpus", type=int, default=16, help="logical CPUs per node (default 16)")
    parser.add_argument("--num-gpus", type=int, default=1, help="logical GPUs per node (default 1)")
    parser.add_argument("--object-store-mib", type=int, default=1024, help="object store per node (default 1024)")
    parser.add_argument("--node-env", action="append", default=[], metavar="INDEX:NAME=VALUE",
                        help="an environment variable for one node's raylet and workers (repeatable)")
    parser.add_argument("--node-python", action="append", default=[], metavar="INDEX:PYTHON",
                        help="start that node with `ray start --address` run by PYTHON (repeatable)")
    parser.add_argument("--nodes-file", type=Path, help="write the nodes' ids here, one JSON line each")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    if args.nodes < 1:
        parser.error("--nodes must be at least 1")
    extra_env = node_env(args.node_env, args.nodes)
    pythons = node_python(args.node_python, args.nodes)

    # a short path: Ray's unix sockets live below it (at most 107 characters)
    ray_tmp = tempfile.mkdtemp(prefix="pvray-", dir="/tmp")
    os.environ["RAY_TMPDIR"] = ray_tmp
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)

    from ray.cluster_utils import Cluster

    cluster = Cluster(shutdown_at_exit=True)
    joined: list[subprocess.Popen] = []  # nodes started with `ray start --block`
    child: subprocess.Popen | None = None
    try:
        for index in range(args.nodes):
            resources = {"num_cpus": args.num_cpus, "num_gpus": args.num_gpus}
            if index in pythons:
                command_line = [pythons[index], "-m", "ray.scripts.scripts", "start", "--block",
                                f"--address={cluster.address}", "--disable-usage-stats",
                                f"--object-store-memory={args.object_store_mib << 20}",
                                *(f"--{key.replace('_', '-')}={value}" for key, value in resources.items())]
                joined.append(subprocess.Popen(command_line, env={**os.environ, **extra_env.get(index, {})},
                                               stdout=subprocess.DEVNULL))
                node_id = _wait_for(cluster, index + 1, joined[-1])
            else:
                options = {**resources, "object_store_memory": args.object_store_mib << 20,
                           "env_vars": extra_env.get(index) or None}
                if index == 0:
                    options["include_dashboard"] = False
                node_id = cluster.add_node(**options).node_id
            if args.nodes_file is not None:
                record = {"index": index, "node_id": node_id, "env": extra_env.get(index, {}),
                          "python": pythons.get(index, sys.executable)}
                with args.nodes_file.open("w" if index == 0 else "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(record) + "\n")
        print(f"verl_local_cluster.py: {args.nodes} Ray nodes at {cluster.address}", file=sys.stderr, flush=True)
        child = subprocess.Popen(command, env={**os.environ, "RAY_ADDRESS": cluster.address})
        return child.wait()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if child is not None and child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        for process in joined:
            process.terminate()
        for process in joined:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        cluster.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
