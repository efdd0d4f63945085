"""Write a freshly initialised tiny Qwen2ForCausalLM with the char tokenizer to a folder (for GPU checks offline).

Usage: python scripts/tiny_qwen2.py OUTPUT_DIR
"""

from __future__ import annotations

import sys

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from pivotrl.modeling.tokenizer import build_char_tokenizer


def main(out: str) -> None:
    tokenizer = build_char_tokenizer(model_max_length=1024)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"tiny Qwen2 in {out}")


if __name__ == "__main__":
    main(sys.argv[1])
