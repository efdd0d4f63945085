"""Chunked token log-probs and entropies agree with the naive full-softmax computation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from pivotrl.modeling import token_logprobs_and_entropy

B, T, V, D = 3, 5, 13, 6  # B*T = 15
CHUNKS = [1, 7, B * T, B * T + 9]


def naive(labels: Tensor, logits: Tensor, temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """The reference: full log_softmax, gather, entropy = -(p * logp).sum."""
    logp_all = torch.log_softmax(logits / temperature, dim=-1)
    logp = logp_all.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def make(dtype: torch.dtype, seed: int = 0, b: int = B, t: int = T, v: int = V, d: int = D):
    """Random hidden, weight, labels and upstream gradients for both outputs."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, t, d, generator=g, dtype=torch.float64).to(dtype)
    weight = torch.randn(v, d, generator=g, dtype=torch.float64).to(dtype)
    labels = torch.randint(0, v, (b, t), generator=g)
    g_lp = torch.randn(b, t, generator=g, dtype=torch.float64)
    g_ent = torch.randn(b, t, generator=g, dtype=torch.float64)
    return hidden.requires_grad_(), weight.requires_grad_(), labels, g_lp, g_ent


def loss(logp: Tensor, entropy: Tensor, g_lp: Tensor, g_ent: Tensor) -> Tensor:
    """A scalar with arbitrary weights on both outputs, so both gradient paths are checked."""
    return (logp * g_lp.to(logp.dtype)).sum() + (entropy * g_ent.to(entropy.dtype)).sum()


def close(a: Tensor, b: Tensor, tol: float = 1e-5) -> None:
    """Assert equality within ``tol`` absolute and relative."""
    torch.testing.assert_close(a, b, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("chunk_size", CHUNKS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_hidden_form_matches_naive(dtype: torch.dtype, chunk_size: int, temperature: float) -> None:
    hidden, weight, labels, g_lp, g_ent = make(dtype)
    logp, ent = token_logprobs_and_entropy(
        labels, hidden=hidden, weight=weight, chunk_size=chunk_size, temperature=temperature
    )
    assert logp.shape == ent.shape == (B, T) and logp.dtype == ent.dtype == dtype
    gh, gw = torch.autograd.grad(loss(logp, ent, g_lp, g_ent), (hidden, weight))
    ref_lp, ref_ent = naive(labels, hidden @ weight.T, temperature)
    rh, rw = torch.autograd.grad(loss(ref_lp, ref_ent, g_lp, g_ent), (hidden, weight))
    close(logp, ref_lp)
    close(ent, ref_ent)
    close(gh, rh)
    close(gw, rw)
    assert gh.dtype == gw.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("chunk_size", CHUNKS)
@pytest.mark.parametrize("temperature", [1.0, 1.6])
def test_logits_form_matches_naive(dtype: torch.dtype, chunk_size: int, temperature: float) -> None:
    hidden, weight, labels, g_lp, g_ent = make(dtype, seed=1)
    logits = (hidden @ weight.T).detach().requires_grad_()
    logp, ent = token_logprobs_and_entropy(
        labels, logits=logits, chunk_size=chunk_size, temperature=temperature
    )
    assert logp.dtype == ent.dtype == dtype
    (gl,) = torch.autograd.grad(loss(logp, ent, g_lp, g_ent), (logits,))
    ref_lp, ref_ent = naive(labels, logits, temperature)
    (rl,) = torch.autograd.grad(loss(ref_lp, ref_ent, g_lp, g_ent), (logits,))
    close(logp, ref_lp)
    close(ent, ref_ent)
    close(gl, rl)


@pytest.mark.parametrize("form", ["hidden", "logits"])
@pytest.mark.parametrize("use", ["logp", "entropy"])
def test_gradient_of_one_output_only(form: str, use: str) -> None:
    hidden, weight, labels, _, _ = make(torch.float64, seed=2)
    if form == "hidden":
        inputs: tuple[Tensor, ...] = (hidden, weight)
        logp, ent = token_logprobs_and_entropy(labels, hidden=hidden, weight=weight, chunk_size=4)
        ref_lp, ref_ent = naive(labels, hidden @ weight.T)
    else:
        logits = (hidden @ weight.T).detach().requires_grad_()
        inputs = (logits,)
        logp, ent = token_logprobs_and_entropy(labels, logits=logits, chunk_size=4)
        ref_lp, ref_ent = naive(labels, logits)
    out, ref = (logp, ref_lp) if use == "logp" else (ent, ref_ent)
    for got, want in zip(
        torch.autograd.grad(out.sum(), inputs), torch.autograd.grad(ref.sum(), inputs), strict=True
    ):
        close(got, want)


def test_gradient_to_weight_only_and_hidden_only() -> None:
    hidden, weight, labels, g_lp, g_ent = make(torch.float64, seed=3)
    frozen_hidden = hidden.detach()
    logp, ent = token_logprobs_and_entropy(
        labels, hidden=frozen_hidden, weight=weight, chunk_size=4
    )
    (gw,) = torch.autograd.grad(loss(logp, ent, g_lp, g_ent), (weight,))
    ref = naive(labels, frozen_hidden @ weight.T)
    (rw,) = torch.autograd.grad(loss(*ref, g_lp, g_ent), (weight,))
    close(gw, rw)
    frozen_weight = weight.detach()
    logp, ent = token_logprobs_and_entropy(
        labels, hidden=hidden, weight=frozen_weight, chunk_size=4
    )
    (gh,) = torch.autograd.grad(loss(logp, ent, g_lp, g_ent), (hidden,))
    ref = naive(labels, hidden @ frozen_weight.T)
    (rh,) = torch.autograd.grad(loss(*ref, g_lp, g_ent), (hidden,))
    close(gh, rh)


def test_gradcheck_hidden_form() -> None:
    hidden, weight, labels, _, _ = make(torch.float64, seed=4, b=2, t=3, v=5, d=3)

    def fn(h: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
        return token_logprobs_and_entropy(labels, hidden=h, weight=w, chunk_size=4, temperature=0.8)

    assert torch.autograd.gradcheck(fn, (hidden, weight))


def test_gradcheck_logits_form() -> None:
    _, _, labels, _, _ = make(torch.float64, seed=5, b=2, t=3, v=5, d=3)
    logits = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)

    def fn(z: Tensor) -> tuple[Tensor, Tensor]:
        return token_logprobs_and_entropy(labels, logits=z, chunk_size=4, temperature=1.3)

    assert torch.autograd.gradcheck(fn, (logits,))


class _LargestOutput(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op produces."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_hidden_form_never_materialises_full_logits() -> None:
    b, t, v, d, chunk = 4, 8, 40, 3, 4  # N*V = 1280; chunk*V = V*D = 160 and 120
    hidden, weight, labels, g_lp, g_ent = make(torch.float32, seed=6, b=b, t=t, v=v, d=d)
    with _LargestOutput() as mode:
        logp, ent = token_logprobs_and_entropy(
            labels, hidden=hidden, weight=weight, chunk_size=chunk
        )
        loss(logp, ent, g_lp, g_ent).backward()
    assert hidden.grad is not None and weight.grad is not None
    assert mode.largest <= max(chunk * v, v * d, b * t * d) < b * t * v
    # The same probe sees the naive computation's full logits, so it is not vacuous.
    with _LargestOutput() as mode:
        naive(labels, hidden @ weight.T)
    assert mode.largest >= b * t * v


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_half_inputs_compute_in_float32(half: torch.dtype) -> None:
    hidden, weight, labels, g_lp, g_ent = make(half, seed=7)
    logp, ent = token_logprobs_and_entropy(labels, hidden=hidden, weight=weight, chunk_size=4)
    assert logp.dtype == ent.dtype == torch.float32
    gh, gw = torch.autograd.grad(loss(logp, ent, g_lp, g_ent), (hidden, weight))
    assert gh.dtype == gw.dtype == half
    h32, w32 = hidden.detach().float().requires_grad_(), weight.detach().float().requires_grad_()
    ref_lp, ref_ent = naive(labels, h32 @ w32.T)
    rh, rw = torch.autograd.grad(loss(ref_lp, ref_ent, g_lp, g_ent), (h32, w32))
    torch.testing.assert_close(logp, ref_lp, atol=0.1, rtol=0.05)
    torch.testing.assert_close(ent, ref_ent, atol=0.1, rtol=0.05)
    torch.testing.assert_close(gh.float(), rh, atol=0.1, rtol=0.05)
    torch.testing.assert_close(gw.float(), rw, atol=0.1, rtol=0.05)
    # The logits form in half precision agrees with float32 on the same (rounded) logits.
    logits = (hidden @ weight.T).detach().requires_grad_()
    lp16, ent16 = token_logprobs_and_entropy(labels, logits=logits, chunk_size=4)
    assert lp16.dtype == torch.float32
    (gl,) = torch.autograd.grad(loss(lp16, ent16, g_lp, g_ent), (logits,))
    assert gl.dtype == half
    l32 = logits.detach().float().requires_grad_()
    ref_lp, ref_ent = naive(labels, l32)
    (rl,) = torch.autograd.grad(loss(ref_lp, ref_ent, g_lp, g_ent), (l32,))
    close(lp16, ref_lp)
    close(ent16, ref_ent)
    torch.testing.assert_close(gl.float(), rl, atol=1e-2, rtol=1e-2)


def test_autocast_hidden_form_runs_in_bfloat16() -> None:
    hidden, weight, labels, g_lp, g_ent = make(torch.float32, seed=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, ent = token_logprobs_and_entropy(labels, hidden=hidden, weight=weight, chunk_size=4)
    assert logp.dtype == torch.float32
    gh, gw = torch.autograd.grad(loss(logp, ent, g_lp, g_ent), (hidden, weight))
    assert gh.dtype == gw.dtype == torch.float32
    ref = naive(labels, hidden @ weight.T)
    rh, rw = torch.autograd.grad(loss(*ref, g_lp, g_ent), (hidden, weight))
    torch.testing.assert_close(logp, ref[0], atol=0.1, rtol=0.05)
    torch.testing.assert_close(gh, rh, atol=0.1, rtol=0.05)
    torch.testing.assert_close(gw, rw, atol=0.1, rtol=0.05)


def test_masked_logits_give_finite_entropy_and_gradient() -> None:
    logits = torch.randn(2, 3, 6, dtype=torch.float64)
    logits[..., 4:] = float("-inf")
    logits.requires_grad_()
    labels = torch.randint(0, 4, (2, 3))
    logp, ent = token_logprobs_and_entropy(labels, logits=logits, chunk_size=4)
    ref_lp, ref_ent = naive(labels, logits.detach()[..., :4])
    close(logp, ref_lp)
    close(ent, ref_ent)
    (logp.sum() + ent.sum()).backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    assert (logits.grad[..., 4:] == 0).all()


def test_no_grad_and_empty_batch() -> None:
    hidden, weight, labels, _, _ = make(torch.float32, seed=9)
    with torch.no_grad():
        logp, ent = token_logprobs_and_entropy(labels, hidden=hidden, weight=weight)
    assert not logp.requires_grad
    close(logp, naive(labels, hidden.detach() @ weight.detach().T)[0])
    empty_lp, empty_ent = token_logprobs_and_entropy(
        torch.zeros(0, 4, dtype=torch.long), logits=torch.randn(0, 4, 7)
    )
    assert empty_lp.shape == empty_ent.shape == (0, 4)


def test_int32_labels_accepted() -> None:
    hidden, weight, labels, _, _ = make(torch.float64, seed=10)
    a = token_logprobs_and_entropy(labels.int(), hidden=hidden, weight=weight)
    b = token_logprobs_and_entropy(labels, hidden=hidden, weight=weight)
    close(a[0], b[0])


def _bad_cases() -> list[tuple[str, dict[str, object], str]]:
    h = torch.randn(2, 3, 4)
    w = torch.randn(5, 4)
    z = torch.randn(2, 3, 5)
    y = torch.randint(0, 5, (2, 3))
    return [
        ("both forms", dict(labels=y, logits=z, hidden=h, weight=w), "exactly one"),
        ("neither form", dict(labels=y), "exactly one"),
        ("hidden without weight", dict(labels=y, hidden=h), "weight"),
        ("weight with logits", dict(labels=y, logits=z, weight=w), "weight"),
        ("float labels", dict(labels=y.float(), logits=z), "integer"),
        ("bool labels", dict(labels=y > 2, logits=z), "integer"),
        ("labels not a tensor", dict(labels=[[0, 1, 2]], logits=z), "labels"),
        ("labels 1-D", dict(labels=y[0], logits=z), "labels"),
        ("labels too large", dict(labels=y.clone().fill_(5), logits=z), r"\[0, 5\)"),
        ("negative labels", dict(labels=y.clone().fill_(-100), logits=z), r"\[0, 5\)"),
        ("logits 2-D", dict(labels=y, logits=z[0]), "logits"),
        ("logits (B,T) mismatch", dict(labels=y, logits=torch.randn(2, 4, 5)), "logits shape"),
        ("integer logits", dict(labels=y, logits=y.unsqueeze(-1)), "floating-point"),
        ("hidden (B,T) mismatch", dict(labels=y, hidden=torch.randn(3, 3, 4), weight=w), "hidden"),
        ("weight D mismatch", dict(labels=y, hidden=h, weight=torch.randn(5, 3)), "weight shape"),
        ("weight 3-D", dict(labels=y, hidden=h, weight=w.unsqueeze(0)), "weight"),
        ("dtype mismatch", dict(labels=y, hidden=h, weight=w.double()), "dtype"),
        ("empty vocabulary", dict(labels=y, logits=torch.randn(2, 3, 0)), "V"),
        ("chunk_size 0", dict(labels=y, logits=z, chunk_size=0), "chunk_size"),
        ("chunk_size negative", dict(labels=y, logits=z, chunk_size=-3), "chunk_size"),
        ("chunk_size float", dict(labels=y, logits=z, chunk_size=2.0), "chunk_size"),
        ("temperature 0", dict(labels=y, logits=z, temperature=0.0), "temperature"),
        ("temperature negative", dict(labels=y, logits=z, temperature=-1.0), "temperature"),
        ("temperature nan", dict(labels=y, logits=z, temperature=float("nan")), "temperature"),
        ("temperature inf", dict(labels=y, logits=z, temperature=float("inf")), "temperature"),
    ]


@pytest.mark.parametrize(("case", "kwargs", "match"), _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_bad_inputs_raise_value_error(case: str, kwargs: dict[str, object], match: str) -> None:
    labels = kwargs.pop("labels")
    with pytest.raises(ValueError, match=match):
        token_logprobs_and_entropy(labels, **kwargs)  # type: ignore[arg-type]


@settings(max_examples=30, deadline=None)
@given(
    b=st.integers(1, 3),
    t=st.integers(1, 6),
    v=st.integers(1, 9),
    d=st.integers(1, 4),
    chunk_size=st.integers(1, 20),
    temperature=st.floats(0.25, 4.0),
    seed=st.integers(0, 2**16),
)
def test_property_random_shapes(
    b: int, t: int, v: int, d: int, chunk_size: int, temperature: float, seed: int
) -> None:
    hidden, weight, labels, g_lp, g_ent = make(torch.float64, seed=seed, b=b, t=t, v=v, d=d)
    logp, ent = token_logprobs_and_entropy(
        labels, hidden=hidden, weight=weight, chunk_size=chunk_size, temperature=temperature
    )
    gh, gw = torch.autograd.grad(loss(logp, ent, g_lp, g_ent), (hidden, weight))
    ref_lp, ref_ent = naive(labels, hidden @ weight.T, temperature)
    rh, rw = torch.autograd.grad(loss(ref_lp, ref_ent, g_lp, g_ent), (hidden, weight))
    for got, want in ((logp, ref_lp), (ent, ref_ent), (gh, rh), (gw, rw)):
        close(got, want)
    assert (ent >= -1e-12).all() and (logp <= 1e-12).all()


def test_logprobs_only_equals_the_first_output_of_the_entropy_path() -> None:
    from pivotrl.modeling.logprobs import token_logprobs

    g = torch.Generator().manual_seed(11)
    hidden = torch.randn(3, 7, 16, generator=g, dtype=torch.float64)
    weight = torch.randn(50, 16, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 50, (3, 7), generator=g)
    for temperature in (1.0, 0.7):
        expected, _ = token_logprobs_and_entropy(labels, hidden=hidden, weight=weight, chunk_size=5,
                                                 temperature=temperature)
        got = token_logprobs(labels, hidden=hidden, weight=weight, chunk_size=5, temperature=temperature)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
