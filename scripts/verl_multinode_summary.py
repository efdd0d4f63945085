"""The summary of scripts/verl_multinode.sh: where verl ran pivotrl's estimator and loss, across nodes.

    python scripts/verl_multinode_summary.py WORK_DIR --estimator NAME --loss NAME
        [--nodes N] [--steps N] [--max-probs-diff X]

reads, in WORK_DIR, ``nodes.jsonl`` (the cluster's nodes, from scripts/verl_local_cluster.py),
``probe.jsonl`` and its ``.step<k>.pt`` files (one record per advantage step, written by the pivotrl
trainer in verl's TaskRunner, with each estimator call's Ray node id), ``probe.jsonl.loss.jsonl``
(one record per policy-loss call, written by each actor worker: its Ray node id and rank) and
``metrics.jsonl`` (verl's file logger), and prints two lines:

    verl multinode: estimator calls: <calls> on node <id>...; loss calls: rank <r> on node <id> (<calls>), ...;
    advantages recomputed: yes|no, rollout_probs_diff_mean <value>
    verl multinode: <nodes> nodes, <steps> steps, estimator <name>, loss <name> on <k> nodes (ranks <r,...>),
    entropies seen: yes|no, ref policy: yes|no

(each on one line). "entropies seen", "ref policy", "advantages recomputed" and
rollout_probs_diff_mean mean what scripts/verl_e2e_summary.py says. Exit status 0 iff the cluster
had N nodes (default 2), the run N steps (default 2), every estimator call was NAME and ran on a
node of the cluster, every loss call was NAME, the loss ran on every node with ranks 0..N-1, every
"yes" holds and rollout_probs_diff_mean is at most X (where given).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from verl_e2e_summary import read_jsonl, summary  # noqa: E402

LOSS_RECORDS = "probe.jsonl.loss.jsonl"


def _short(node_id: str | None) -> str:
    return "?" if not node_id else node_id[:8]


def placement(work: Path) -> tuple[str, dict]:
    """The detail line and the parts of the summary."""
    nodes = [record["node_id"] for record in read_jsonl(work / "nodes.jsonl")]
    records = read_jsonl(work / "probe.jsonl")
    losses = read_jsonl(work / LOSS_RECORDS)
    _, e2e = summary(records, read_jsonl(work / "metrics.jsonl"), work)

    estimator_calls = Counter(
        call.get("node_id") for record in records for call in record.get("received", [])
    )
    loss_calls = Counter((record.get("rank"), record.get("node_id")) for record in losses)
    parts = {
        "nodes": len(nodes),
        "cluster": set(nodes),
        "steps": e2e["steps"],
        "estimator": e2e["estimator"],
        "estimator_nodes": set(estimator_calls),
        "loss": "/".join(sorted({record["loss"] for record in losses})) or "none",
        "loss_nodes": {node for _, node in loss_calls},
        "ranks": sorted({rank for rank, _ in loss_calls if rank is not None}),
        "entropies": e2e["entropies"],
        "ref": e2e["ref"],
        "advantages": e2e["advantages"],
        "probs_diff": e2e["probs_diff"],
    }
    yes = {True: "yes", False: "no"}
    where_estimator = ", ".join(
        f"{count} on node {_short(node)}" for node, count in sorted(estimator_calls.items(), key=str)
    )
    where_loss = ", ".join(
        f"rank {rank} on node {_short(node)} ({count})"
        for (rank, node), count in sorted(loss_calls.items(), key=str)
    )
    diff = "n/a" if parts["probs_diff"] is None else f"{parts['probs_diff']:.3g}"
    detail = (
        f"verl multinode: estimator calls: {where_estimator or 'none'}; "
        f"loss calls: {where_loss or 'none'}; "
        f"advantages recomputed: {yes[parts['advantages']]}, rollout_probs_diff_mean {diff}"
    )
    return detail, parts


def summary_line(parts: dict) -> str:
    yes = {True: "yes", False: "no"}
    ranks = ",".join(str(rank) for rank in parts["ranks"]) or "none"
    return (
        f"verl multinode: {parts['nodes']} nodes, {parts['steps']} steps, "
        f"estimator {parts['estimator']}, "
        f"loss {parts['loss']} on {len(parts['loss_nodes'])} nodes (ranks {ranks}), "
        f"entropies seen: {yes[parts['entropies']]}, ref policy: {yes[parts['ref']]}"
    )


def holds(parts: dict, *, nodes: int, steps: int, estimator: str, loss: str,
          max_probs_diff: float | None) -> bool:
    diff = parts["probs_diff"]
    return (
        parts["nodes"] == nodes
        and parts["steps"] == steps
        and parts["estimator"] == estimator
        and bool(parts["estimator_nodes"])
        and parts["estimator_nodes"] <= parts["cluster"]
        and parts["loss"] == loss
        and parts["loss_nodes"] == parts["cluster"]
        and parts["ranks"] == list(range(nodes))
        and parts["entropies"]
        and parts["ref"]
        and parts["advantages"]
        and (max_probs_diff is None or (diff is not None and diff <= max_probs_diff))
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path, help="the run's work dir")
    parser.add_argument("--estimator", required=True, help="the verl estimator name asked for")
    parser.add_argument("--loss", required=True, help="the verl loss mode asked for")
    parser.add_argument("--nodes", type=int, default=2, help="nodes the cluster must have (default 2)")
    parser.add_argument("--steps", type=int, default=2, help="steps the run must have (default 2)")
    parser.add_argument("--max-probs-diff", type=float, default=None, help="bound on rollout_probs_diff_mean")
    args = parser.parse_args(argv)
    detail, parts = placement(args.work)
    print(detail)
    print(summary_line(parts))
    ok = holds(parts, nodes=args.nodes, steps=args.steps, estimator=args.estimator, loss=args.loss,
               max_probs_diff=args.max_probs_diff)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
