"""Peak memory and time of chunked vs naive token log-probs + entropy, forward and backward.

naive:   logits = hidden @ weight.T; log_softmax; gather; entropy; backward.
chunked: pivotrl.modeling.token_logprobs_and_entropy(hidden=..., weight=...); backward.

On CPU each variant runs once in a fresh subprocess and its peak is the growth of
the process's maximum resident set size (ru_maxrss) over the size after the inputs
are allocated. On CUDA both run in this process and the peak is
torch.cuda.max_memory_allocated above the memory held by the inputs.

    python benchmarks/bench_logprobs.py [--B 2 --T 2048 --V 65536 --D 256 --chunk-size 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pivotrl.modeling import token_logprobs_and_entropy  # noqa: E402

VARIANTS = ("naive", "chunked")


def naive_logprobs_and_entropy(
    hidden: Tensor, weight: Tensor, labels: Tensor
) -> tuple[Tensor, Tensor]:
    """The full-vocabulary reference: materialises (B, T, V) logits and softmax."""
    logp_all = torch.log_softmax(hidden @ weight.T, dim=-1)
    logp = logp_all.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def _inputs(B: int, T: int, V: int, D: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """Seeded hidden states, LM-head weight (both requiring grad) and labels."""
    g = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(B, T, D, generator=g, device=device).requires_grad_()
    weight = (torch.randn(V, D, generator=g, device=device) / D**0.5).requires_grad_()
    labels = torch.randint(0, V, (B, T), generator=g, device=device)
    return hidden, weight, labels


def _step(variant: str, hidden: Tensor, weight: Tensor, labels: Tensor, chunk_size: int) -> float:
    """One forward + backward of ``variant``; returns logp.sum() + H.sum() as a checksum."""
    if variant == "naive":
        logp, entropy = naive_logprobs_and_entropy(hidden, weight, labels)
    else:
        logp, entropy = token_logprobs_and_entropy(
            labels, hidden=hidden, weight=weight, chunk_size=chunk_size
        )
    total = logp.sum() + entropy.sum()
    total.backward()
    return float(total.detach())


def _maxrss_bytes() -> int:
    """This process's peak resident set size so far, in bytes."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def _worker(variant: str, B: int, T: int, V: int, D: int, chunk_size: int) -> dict[str, float]:
    """Run one variant once on CPU in this (fresh) process and report peak RSS growth and time."""
    device = torch.device("cpu")
    warm = _inputs(2, 8, 64, 8, device)  # load kernels and thread pools before the baseline
    _step(variant, *warm, chunk_size=4)
    del warm
    hidden, weight, labels = _inputs(B, T, V, D, device)
    baseline = _maxrss_bytes()
    start = time.perf_counter()
    checksum = _step(variant, hidden, weight, labels, chunk_size)
    elapsed = time.perf_counter() - start
    return {"peak_bytes": _maxrss_bytes() - baseline, "time_s": elapsed, "checksum": checksum}


def _cpu_run(variant: str, B: int, T: int, V: int, D: int, chunk_size: int) -> dict[str, float]:
    """Run ``_worker`` for one variant in a fresh subprocess and parse its JSON line."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", variant]
    cmd += ["--B", str(B), "--T", str(T), "--V", str(V), "--D", str(D)]
    cmd += ["--chunk-size", str(chunk_size)]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cuda_run(variant: str, B: int, T: int, V: int, D: int, chunk_size: int) -> dict[str, float]:
    """Run one variant once on the current CUDA device and report peak allocation and time."""
    device = torch.device("cuda")
    _step(variant, *_inputs(2, 8, 64, 8, device), chunk_size=4)
    hidden, weight, labels = _inputs(B, T, V, D, device)
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    checksum = _step(variant, hidden, weight, labels, chunk_size)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() - baseline
    del hidden, weight, labels
    torch.cuda.empty_cache()
    return {"peak_bytes": peak, "time_s": elapsed, "checksum": checksum}


def measure_peak_memory(
    B: int = 2, T: int = 2048, V: int = 65536, D: int = 256, chunk_size: int = 1024
) -> dict[str, float | int | str]:
    """Peak extra memory and time of forward + backward, naive vs chunked, one run each."""
    use_cuda = torch.cuda.is_available()
    run = _cuda_run if use_cuda else _cpu_run
    res = {v: run(v, B, T, V, D, chunk_size) for v in VARIANTS}
    naive, chunked = res["naive"], res["chunked"]
    return {
        "device": "cuda" if use_cuda else "cpu",
        "method": "torch.cuda.max_memory_allocated" if use_cuda else "subprocess ru_maxrss",
        "B": B,
        "T": T,
        "V": V,
        "D": D,
        "chunk_size": chunk_size,
        "naive_peak_bytes": int(naive["peak_bytes"]),
        "chunked_peak_bytes": int(chunked["peak_bytes"]),
        "peak_ratio": chunked["peak_bytes"] / naive["peak_bytes"],
        "naive_time_s": naive["time_s"],
        "chunked_time_s": chunked["time_s"],
        "time_ratio": chunked["time_s"] / naive["time_s"],
        "checksum_rel_diff": abs(chunked["checksum"] - naive["checksum"])
        / max(abs(naive["checksum"]), 1e-30),
    }


def _mib(n: float) -> str:
    """Bytes as MiB with one decimal."""
    return f"{n / 2**20:.1f} MiB"


def main(argv: list[str] | None = None) -> None:
    """Parse arguments; run a worker, or the whole comparison and print it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--B", type=int, default=2)
    parser.add_argument("--T", type=int, default=2048)
    parser.add_argument("--V", type=int, default=65536)
    parser.add_argument("--D", type=int, default=256)
    parser.add_argument("--chunk-size", type=int, default=1024)
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args.worker, args.B, args.T, args.V, args.D, args.chunk_size)))
        return
    r = measure_peak_memory(args.B, args.T, args.V, args.D, args.chunk_size)
    print(
        f"token_logprobs_and_entropy, forward+backward, float32, device={r['device']} "
        f"({r['method']})"
    )
    print(f"B={r['B']} T={r['T']} V={r['V']} D={r['D']} chunk_size={r['chunk_size']}")
    print(f"peak memory  naive   : {_mib(r['naive_peak_bytes'])}")
    print(f"peak memory  chunked : {_mib(r['chunked_peak_bytes'])}")
    print(f"peak ratio   chunked/naive: {r['peak_ratio']:.3f}")
    print(f"time         naive   : {r['naive_time_s']:.2f} s")
    print(f"time         chunked : {r['chunked_time_s']:.2f} s")
    print(f"time ratio   chunked/naive: {r['time_ratio']:.2f}")
    print(f"checksum relative difference: {r['checksum_rel_diff']:.2e}")


if __name__ == "__main__":
    main()
