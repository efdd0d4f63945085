"""ERPO inside TRL: PivotGRPOTrainer on a tiny Llama, on the CPU, in about 15 seconds.

    pip install "pivotrl[trl]"        # or: pip install trl==1.16.0
    python examples/trl_pivot_grpo.py

Everything is built here (no download): a word-level tokenizer, a 1-layer Llama
from a config, six prompts, and a reward for saying "a". With a real model, pass
its hub name or path as `model=` and drop the building code.
"""

from __future__ import annotations

import tempfile

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from pivotrl.integrations.trl import PivotGRPOConfig, PivotGRPOTrainer

WORDS = ["a", "b", "c", "d", "e", "f", "g", "h"]


def tiny_model(folder: str) -> PreTrainedTokenizerFast:
    """Save a tiny Llama and its tokenizer to `folder` (TRL builds the reference model from the path)."""
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=0, eos_token_id=1, bos_token_id=None, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return tokenizer


def says_a(completions, **kwargs):
    """The fraction of the completion's words that are "a"."""
    return [sum(w == "a" for w in c.split()) / max(len(c.split()), 1) for c in completions]


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        tokenizer = tiny_model(folder)
        args = PivotGRPOConfig(
            output_dir=f"{folder}/run",
            advantage_estimator="erpo",              # any pivotrl estimator
            estimator_kwargs={"gamma": 5.0, "eta": 0.2},
            policy_loss="ppo",                       # ppo, gspo, tepo or mpo
            policy_loss_kwargs={"eps_low": 0.2, "eps_high": 0.28, "beta_kl": 0.0},
            beta=0.04,                               # > 0: TRL builds the reference model ERPO reads
            num_generations=4, per_device_train_batch_size=8, max_completion_length=6,
            max_steps=3, learning_rate=5e-3, logging_steps=1, report_to="none", save_strategy="no",
            bf16=False, gradient_checkpointing=False, use_cpu=True, seed=0, disable_tqdm=True,
        )
        trainer = PivotGRPOTrainer(
            model=folder, reward_funcs=says_a, args=args, processing_class=tokenizer,
            train_dataset=Dataset.from_dict({"prompt": ["a b", "c d", "e f a", "g h", "b b", "a c"] * 4}),
        )
        trainer.train()
        last = trainer.pivot_last
        adv, mask = last["advantages"], last["batch"].response_mask
        print(f"advantages {tuple(adv.shape)} (token-level); first response: {adv[0][mask[0]].tolist()}")
        print({k: v for k, v in trainer.state.log_history[-2].items() if k.startswith(("reward", "pivotrl/adv"))})


if __name__ == "__main__":
    main()
