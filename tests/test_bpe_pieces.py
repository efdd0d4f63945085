"""A task's length limit and its token marks on a real BPE tokenizer's pieces, not only on characters.

The marks are defined on characters (Task.token_marks): a token is written in the state of its first
character, and is free when every character it writes is a filler's. These tests read both off a
response's characters and check them on the pieces that two real tokenizers cut it into, through the
trainer's own decoding of each id (TokenPieces): SmolLM2-135M's byte-level BPE (where its package is
installed) and a BPE trained here on the task's text, whose merges cross step boundaries ("=15;").
"""

from __future__ import annotations

import random

import pytest
from real_models import needs_smollm2

from pivotrl.modeling.tokenizer import build_char_tokenizer
from pivotrl.rollout.marks import TokenPieces
from pivotrl.tasks import get_task

SMALL = {"train_size": 300, "test_size": 40}


def trained_bpe():
    """A byte-level BPE tokenizer trained on countdown_free's worked solutions (a real tokenizer, made here)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    task = get_task("countdown_free", **SMALL)
    texts = [task.worked_solution(p, flaw) for p in task.problems("train") for flaw in (None, "wrong_step")]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=600, special_tokens=["<eos>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")


def smollm2_tokenizer():
    from pivotrl.modeling.policy import load_policy

    return load_policy("smollm2-135m", device="cpu")[1]


def check_marks_on_pieces(tokenizer) -> dict[str, float]:
    """Assert, for countdown's and countdown_free's worked solutions (right and flawed) cut into `tokenizer`'s
    pieces, that each piece's marks are the ones its characters give; returns how the pieces look."""
    decode = TokenPieces(tokenizer)
    multi, crossing, filler_chars, filler_in_free = 0, 0, 0, 0
    for name in ("countdown", "countdown_free"):
        task = get_task(name, **SMALL)
        rng = random.Random(0)
        for p in task.problems("test"):
            for flaw in (None, "wrong_step", "wrong_answer"):
                text = task.worked_solution(p, flaw, random.Random(rng.random()))
                ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                pieces = decode(ids)
                assert "".join(pieces) == text and pieces[-1] == ""  # the trainer's pieces rebuild the text
                on_pieces = task.token_marks(pieces, p)
                on_chars = task.token_marks([*text, ""], p)
                start = 0
                for k, piece in enumerate(pieces):
                    span = range(start, start + len(piece))
                    assert on_pieces["reachable"][k] == on_chars["reachable"][start], (text, piece)
                    if "free" in on_pieces:
                        assert on_pieces["free"][k] == (bool(piece) and all(on_chars["free"][i] for i in span))
                        filler_chars += sum(on_chars["free"][i] for i in span)
                        filler_in_free += len(piece) if on_pieces["free"][k] else 0
                    multi += len(piece) > 1
                    crossing += len(set(on_chars["reachable"][i] for i in span)) > 1
                    start += len(piece)
    return {"multi": multi, "crossing": crossing, "filler_in_free": filler_in_free / filler_chars}


def test_marks_land_on_a_trained_bpe_tokenizers_pieces_as_on_characters() -> None:
    seen = check_marks_on_pieces(trained_bpe())
    assert seen["multi"] > 1000 and seen["crossing"] > 0  # pieces of several characters, some across a step's end
    assert 0 < seen["filler_in_free"] < 1  # some fillers merge with what follows them: those pieces are not free


@needs_smollm2
def test_marks_land_on_smollm2s_pieces_as_on_characters() -> None:
    seen = check_marks_on_pieces(smollm2_tokenizer())
    assert seen["multi"] > 0
    assert seen["filler_in_free"] > 0.9  # SmolLM2 cuts the fillers apart from the steps: they stay free


def test_the_character_tokenizer_keeps_each_tasks_stated_length() -> None:
    char = build_char_tokenizer()
    for name in ("countdown", "countdown_free", "countdown_search", "add_sub", "arithmetic"):
        task = get_task(name)
        assert task.response_limit(char) == task.response_limit() == task.max_new_tokens


@pytest.mark.parametrize("make", [trained_bpe, pytest.param(smollm2_tokenizer, marks=needs_smollm2)])
def test_another_tokenizer_gets_twice_the_longest_worked_solution(make) -> None:
    tokenizer = make()
    task = get_task("countdown")
    longest = max(len(tokenizer(task.solution(p), add_special_tokens=False)["input_ids"]) + 1 for p in task.problems("train")[:1000])
    assert task.response_limit(tokenizer) == max(task.max_new_tokens, 2 * longest)
    assert get_task("gsm8k").response_limit(tokenizer) == 1024  # no worked solutions: the stated figure


@needs_smollm2
def test_countdown_on_smollm2_fits_every_worked_solution() -> None:
    tokenizer = smollm2_tokenizer()
    task = get_task("countdown")
    lengths = [len(tokenizer(task.solution(p), add_special_tokens=False)["input_ids"]) + 1 for p in task.problems("test")]
    assert max(lengths) > task.max_new_tokens  # the characters' 34 would cut SmolLM2's longest solutions
    assert task.response_limit(tokenizer) == 78 >= 2 * max(lengths)
