"""Engine settings KVzap cannot run under, refused when the engine builds its model, each named with its fix.

Prefix caching shares blocks between requests, and a block pruned for one request would be pruned for all; a
speculative decoder writes and rolls back KV entries the pruning would have judged; CUDA graphs replay fixed shapes,
which per-layer kept counts do not have; an architecture without an override has no hook for the surrogate."""

from __future__ import annotations


def refusal(vllm_config, architecture: str, supported: tuple[str, ...]) -> str | None:
    """Why KVzap cannot serve with `vllm_config`, or None."""
    if architecture not in supported:
        return f"the model architecture {architecture} has no KVzap override (supported: {', '.join(supported)})"
    if vllm_config.cache_config.enable_prefix_caching:
        return "prefix caching is on: start the engine with --no-enable-prefix-caching (enable_prefix_caching=False)"
    if vllm_config.speculative_config is not None:
        return "speculative decoding is configured: start the engine without --speculative-config"
    if not vllm_config.model_config.enforce_eager:
        return "CUDA graphs / torch.compile are on: start the engine with --enforce-eager (enforce_eager=True)"
    return None
