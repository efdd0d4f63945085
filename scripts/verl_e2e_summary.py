"""The summary line of scripts/verl_e2e_gpu.sh, from the pivotrl trainer's probe file.

    python scripts/verl_e2e_summary.py PROBE.jsonl

prints ``verl e2e: <steps> steps, estimator <name>, entropies seen: yes|no, ref policy: yes|no``.
PROBE.jsonl holds one JSON line per advantage step (written when ``PIVOTRL_VERL_PROBE`` is set,
see ``pivotrl.integrations.verl``): the masked sums of the batch's tensors as verl's workers
wrote them to the TransferQueue (``batch``), and of the tensors each estimator call received
(``received``). "entropies seen: yes" iff every step's every estimator call received the
batch's entropies (same token count, same masked sum, not zero); "ref policy: yes" iff every
step ran with verl's reference policy and every call received the batch's ``ref_log_prob``.
A missing or empty file gives 0 steps and "no".
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def _same(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5)


def _received(record: dict, field: str, nonzero: bool = False) -> bool:
    batch, calls = record["batch"], record["received"]
    if not calls or batch[field] is None or (nonzero and batch[field] == 0):
        return False
    return all(c["tokens"] == batch["tokens"] and _same(c[field], batch[field]) for c in calls)


def summary(records: list[dict]) -> str:
    steps = len({r["step"] for r in records})
    estimators = sorted({r["estimator"] for r in records})
    estimator = estimators[0] if len(estimators) == 1 else ("none probed" if not estimators else "/".join(estimators))
    entropies = bool(records) and all(_received(r, "entropy", nonzero=True) for r in records)
    ref = bool(records) and all(r["use_reference_policy"] and _received(r, "ref_log_prob") for r in records)
    yes = {True: "yes", False: "no"}
    return f"verl e2e: {steps} steps, estimator {estimator}, entropies seen: {yes[entropies]}, ref policy: {yes[ref]}"


def read_probe(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/verl_e2e_summary.py PROBE.jsonl")
    print(summary(read_probe(sys.argv[1])))
