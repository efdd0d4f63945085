"""Policy-side tensor helpers: chunked log-probs and entropies, the tiny model."""

from pivotrl.modeling.logprobs import token_logprobs_and_entropy

__all__ = ["token_logprobs_and_entropy"]
