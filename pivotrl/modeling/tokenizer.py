"""A character-level tokenizer for the synthetic tasks, built with ``tokenizers``.

Every printable ASCII character and the newline is one token; the layout tags
``<think>``, ``</think>``, ``<answer>``, ``</answer>`` are single (non-special)
tokens, so they survive ``decode(..., skip_special_tokens=True)``; ``<pad>``,
``<bos>``, ``<eos>`` and ``<unk>`` are special. Encoding prepends ``<bos>``;
``<eos>`` is appended by whoever builds training targets. The result is a
``transformers.PreTrainedTokenizerFast`` and saves/loads with the usual
``save_pretrained`` / ``PreTrainedTokenizerFast.from_pretrained``.
"""

from __future__ import annotations

import functools
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
TAGS = ("<think>", "</think>", "<answer>", "</answer>")
#: Printable ASCII (space to ``~``) and the newline.
CHARACTERS = "\n" + "".join(chr(c) for c in range(32, 127))


def build_char_tokenizer(
    characters: str = CHARACTERS,
    tags: tuple[str, ...] = TAGS,
    *,
    model_max_length: int = 256,
    padding_side: str = "left",
) -> PreTrainedTokenizerFast:
    """The character-level tokenizer (ids: specials, then tags, then ``characters``).

    ``padding_side`` defaults to ``"left"``, what batched generation needs.
    """
    vocab: dict[str, int] = {}
    for token in (*SPECIAL_TOKENS, *tags, *characters):
        if token not in vocab:
            vocab[token] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # each character its own piece (``[\s\S]`` also matches the newline)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in tags])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A $B",
        special_tokens=[(BOS, vocab[BOS])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        model_max_length=model_max_length,
        padding_side=padding_side,
        clean_up_tokenization_spaces=False,
    )


def is_char_tokenizer(tokenizer: Any) -> bool:
    """Whether `tokenizer` is pivotrl's character tokenizer (the vocabulary :func:`build_char_tokenizer` makes)."""
    return tokenizer.get_vocab() == _char_vocab()


@functools.cache
def _char_vocab() -> dict[str, int]:
    return build_char_tokenizer().get_vocab()
