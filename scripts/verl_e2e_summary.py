"""The summary line of scripts/verl_e2e.sh, from the pivotrl trainer's probes and verl's metrics.

    python scripts/verl_e2e_summary.py PROBE.jsonl METRICS.jsonl [--steps N] [--max-probs-diff X]

prints one line,

    verl e2e: <steps> steps, estimator <name>, entropies seen: yes|no, ref policy: yes|no,
    advantages recomputed: yes|no, rollout_probs_diff_mean <value>

(on one line), and exits 0 iff the run had N steps (default 2), every "yes" holds and the
value is at most X (default: no bound).

PROBE.jsonl holds one JSON line per advantage step (written when ``PIVOTRL_VERL_PROBE`` is set,
see ``pivotrl.integrations.verl``): the masked sums of the batch's tensors as verl's workers
wrote them to the TransferQueue (``batch``), and of the tensors each estimator call received
(``received``); beside it, ``<PROBE.jsonl>.step<k>.pt`` holds the tensors each call received and
the advantages verl stored for the step.

- "entropies seen: yes" iff every step's every estimator call received the batch's entropies
  (same token count, same masked sum, not zero);
- "ref policy: yes" iff every step ran with verl's reference policy and every call received the
  batch's ``ref_log_prob``;
- "advantages recomputed: yes" iff, at every step, one estimator call received the whole batch
  and ``pivotrl.algorithms.compute_advantages`` on what it received (rewards summed per response,
  groups from verl's uids, ℓ^old, ℓ^ref, entropies, the hyperparameters it used) equals, on the
  response tokens, the advantages verl stored to within 1e-5, and at some step they are not all
  zero (a step whose every group has equal rewards can give zeros: ERPO without its fallback);
- rollout_probs_diff_mean: the largest over the steps of verl's ``training/rollout_probs_diff_mean``
  (the mean |p_rollout - p_actor| over response tokens: the vLLM sampler's token probabilities
  against the trainer's recomputation), read from verl's file logger (METRICS.jsonl, written
  with ``trainer.logger=[...,file]`` and ``VERL_FILE_LOGGER_PATH``); "n/a" where it is missing.

Missing or empty files give 0 steps and "no".
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ADVANTAGE_ATOL = 1e-5
PROBS_DIFF_KEY = "training/rollout_probs_diff_mean"


def _same(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5)


def _received(record: dict, field: str, nonzero: bool = False) -> bool:
    batch, calls = record["batch"], record["received"]
    if not calls or batch[field] is None or (nonzero and batch[field] == 0):
        return False
    return all(c["tokens"] == batch["tokens"] and _same(c[field], batch[field]) for c in calls)


def read_jsonl(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def recomputed(record: dict, probe_dir: Path) -> tuple[bool, bool]:
    """Whether the advantages verl stored at this step are pivotrl's estimator on what the
    estimator received (one call, the whole batch), and whether they are not all zero."""
    import torch

    from pivotrl.algorithms import TokenBatch, compute_advantages

    path = probe_dir / record.get("tensors", "")
    if not record.get("tensors") or not path.exists():
        return False, False
    saved = torch.load(path, weights_only=True)
    calls, stored, batch_mask = saved["received"], saved["advantages"], saved["response_mask"]
    if len(calls) != 1 or calls[0]["response_mask"].shape[0] != batch_mask.shape[0]:
        return False, False
    got = calls[0]
    name = record["estimator"].removeprefix("pivotrl_")
    received_mask = got["response_mask"].bool()
    groups: dict[str, int] = {}
    batch = TokenBatch(
        rewards=got["token_level_rewards"].float().sum(-1),
        group_index=torch.tensor([groups.setdefault(u, len(groups)) for u in got["index"]]),
        response_mask=received_mask,
        old_logprobs=torch.zeros(received_mask.shape)
        if got["old_log_probs"] is None
        else got["old_log_probs"].float(),
        ref_logprobs=None if got["ref_log_prob"] is None else got["ref_log_prob"].float(),
        entropies=None if got["entropys"] is None else got["entropys"].float(),
    )
    expected = compute_advantages(name, batch, **got["hparams"])
    width = min(expected.shape[1], stored.shape[1])
    mask = batch_mask[:, :width].bool()
    if not torch.equal(received_mask[:, :width], mask) or received_mask[:, width:].any():
        return False, False
    ours = torch.where(mask, expected[:, :width].float(), 0.0)
    theirs = torch.where(mask, stored[:, :width].float(), 0.0)
    return bool((ours - theirs).abs().max() <= ADVANTAGE_ATOL), bool(theirs.abs().max() > 0)


def probs_diff(metrics: list[dict]) -> float | None:
    values = [m["data"][PROBS_DIFF_KEY] for m in metrics if PROBS_DIFF_KEY in m.get("data", {})]
    values = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return max(values) if values else None


def summary(records: list[dict], metrics: list[dict], probe_dir: Path) -> tuple[str, dict]:
    """The summary line and its parts (steps, estimator, entropies, ref, advantages, probs_diff)."""
    steps = len({r["step"] for r in records})
    estimator = "/".join(sorted({r["estimator"] for r in records})) or "none probed"
    checks = [recomputed(r, probe_dir) for r in records]
    parts = {
        "steps": steps,
        "estimator": estimator,
        "entropies": bool(records) and all(_received(r, "entropy", nonzero=True) for r in records),
        "ref": bool(records)
        and all(r["use_reference_policy"] and _received(r, "ref_log_prob") for r in records),
        "advantages": bool(checks)
        and all(same for same, _ in checks)
        and any(nonzero for _, nonzero in checks),
        "probs_diff": probs_diff(metrics),
    }
    yes = {True: "yes", False: "no"}
    diff = "n/a" if parts["probs_diff"] is None else f"{parts['probs_diff']:.3g}"
    line = (
        f"verl e2e: {steps} steps, estimator {estimator}, "
        f"entropies seen: {yes[parts['entropies']]}, "
        f"ref policy: {yes[parts['ref']]}, advantages recomputed: {yes[parts['advantages']]}, "
        f"rollout_probs_diff_mean {diff}"
    )
    return line, parts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("probe", help="the PIVOTRL_VERL_PROBE file")
    parser.add_argument("metrics", help="verl's file-logger output (VERL_FILE_LOGGER_PATH)")
    parser.add_argument("--steps", type=int, default=2, help="steps the run must have (default 2)")
    parser.add_argument(
        "--max-probs-diff", type=float, default=None, help="bound on rollout_probs_diff_mean"
    )
    args = parser.parse_args(argv)
    probe = Path(args.probe)
    line, parts = summary(read_jsonl(probe), read_jsonl(args.metrics), probe.parent)
    print(line)
    ok = (
        parts["steps"] == args.steps and parts["entropies"] and parts["ref"] and parts["advantages"]
    )
    diff = parts["probs_diff"]
    if args.max_probs_diff is not None:
        ok = ok and diff is not None and diff <= args.max_probs_diff
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
