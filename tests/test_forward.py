"""The trainer's response forward: sharing each group's prompt changes nothing but the cost."""

from __future__ import annotations

import pytest
import torch

from pivotrl.modeling.tiny import build_tiny_model
from pivotrl.modeling.tokenizer import build_char_tokenizer
from pivotrl.rollout import Rollout
from pivotrl.rollout.forward import response_logprobs, shared_prompt_rows

GROUP = 3


def make_rollout(vocab: int, *, prompts: int = 4, width: int = 7, length: int = 6, seed: int = 0) -> Rollout:
    """Left-padded prompts of different lengths, GROUP right-padded responses each (one with no EOS)."""
    g = torch.Generator().manual_seed(seed)
    n = prompts * GROUP
    prompt_lengths = torch.tensor([width, width - 2, 2, width - 1][:prompts])
    prompt_mask = torch.arange(width).flip(0).unsqueeze(0) < prompt_lengths.unsqueeze(1)
    prompt_ids = torch.where(prompt_mask, torch.randint(4, vocab, (prompts, width), generator=g), 0)
    lengths = torch.randint(1, length + 1, (n,), generator=g)
    lengths[0] = length
    response_mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    response_ids = torch.where(response_mask, torch.randint(4, vocab, (n, length), generator=g), 0)
    return Rollout(prompt_ids.repeat_interleave(GROUP, 0), prompt_mask.repeat_interleave(GROUP, 0), response_ids,
                   response_mask, [""] * n, torch.zeros(n, dtype=torch.bool), group_size=GROUP)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    tokenizer = build_char_tokenizer()
    return build_tiny_model(tokenizer, seed=0, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=2).double()


def run(model: torch.nn.Module, rollout: Rollout, rows, share: bool):
    """(log-probs, entropies, every parameter's gradient) of a loss touching both outputs."""
    model.zero_grad(set_to_none=True)
    lp, ent = response_logprobs(model, rollout, rows, share_prompts=share)
    mask = rollout.response_mask if rows is None else rollout.response_mask[rows]
    weights = torch.linspace(0.5, 1.5, mask.shape[1], dtype=lp.dtype)
    ((lp * weights + 0.3 * ent) * mask).sum().backward()
    return lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("rows", [None, torch.tensor([7, 0, 2, 8, 1, 10, 6]), torch.tensor([5, 4, 3])])
def test_shared_prompt_forward_equals_full_forward(model: torch.nn.Module, rows) -> None:
    model.train()
    rollout = make_rollout(model.config.vocab_size)
    selected = torch.arange(12) if rows is None else rows
    assert shared_prompt_rows(rollout, selected) is not None
    full, shared = run(model, rollout, rows, share=False), run(model, rollout, rows, share=True)
    mask = rollout.response_mask[selected]
    for a, b in zip(full[:2], shared[:2], strict=True):
        assert a.dtype == torch.float64
        torch.testing.assert_close(a[mask], b[mask], rtol=1e-10, atol=1e-10)
    # HF Llama runs RMSNorm in float32 even in a float64 model: gradients agree to float32 rounding
    for a, b in zip(full[2], shared[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * float(a.abs().max()))


def test_sharing_is_skipped_when_nothing_or_something_wrong_is_shared(model: torch.nn.Module) -> None:
    rollout = make_rollout(model.config.vocab_size)
    assert shared_prompt_rows(rollout, torch.tensor([0, 3, 6, 9])) is None  # one row per group
    leaders, inverse = shared_prompt_rows(rollout, torch.tensor([4, 0, 5, 1]))
    assert leaders.tolist() == [0, 4] and inverse.tolist() == [1, 0, 1, 0]
    broken = make_rollout(model.config.vocab_size)
    broken.prompt_ids[1, -1] += 1  # row 1's prompt differs from its group's
    assert shared_prompt_rows(broken, torch.arange(12)) is None
    model.eval()
    with torch.no_grad():
        full = response_logprobs(model, broken, share_prompts=False)[0]
        auto = response_logprobs(model, broken)[0]
    torch.testing.assert_close(full[broken.response_mask], auto[broken.response_mask], rtol=0, atol=0)


def test_gradient_checkpointing_falls_back_to_the_full_forward(model: torch.nn.Module) -> None:
    rollout = make_rollout(model.config.vocab_size)
    model.train()
    reference = run(model, rollout, None, share=False)
    model.gradient_checkpointing_enable()
    try:
        checkpointed = run(model, rollout, None, share=True)
    finally:
        model.gradient_checkpointing_disable()
    mask = rollout.response_mask
    torch.testing.assert_close(reference[0][mask], checkpointed[0][mask], rtol=1e-10, atol=1e-10)
    for a, b in zip(reference[2], checkpointed[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * float(a.abs().max()))
