"""Policy-side tensor helpers: chunked log-probs and entropies, the tiny model."""
