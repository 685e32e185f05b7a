"""Which decoder layers KVzap prunes: those with a full KV cache. Sliding-window (and chunked) layers keep their own
bounded cache, so KVzap leaves them alone; the oracle does not score them and the surrogate records them as skipped.

Torch-free (the planner reads it), and the same rule as transformers' `DynamicCache(config=...)`: a config's
`layer_types` when it has them, else every layer slides when it sets `sliding_window` (or `attention_chunk_size`).
"""

from __future__ import annotations

BOUNDED = ("sliding_attention", "chunked_attention")  # layer types whose cache transformers bounds


def _text_config(config):
    getter = getattr(config, "get_text_config", None)
    return getter(decoder=True) if callable(getter) else config


def layer_types(config) -> list[str]:
    """One type per decoder layer, as transformers builds the cache for it."""
    config = _text_config(config)
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)
    bounded = getattr(config, "sliding_window", None) or getattr(config, "attention_chunk_size", None)
    return ["sliding_attention" if bounded else "full_attention"] * config.num_hidden_layers


def skipped_layers(config) -> list[int]:
    """Indices of the layers KVzap leaves alone (their cache is bounded by a window)."""
    return [i for i, kind in enumerate(layer_types(config)) if kind in BOUNDED]


def pruned_layers(config) -> list[int]:
    """Indices of the layers KVzap scores, trains and prunes (full attention)."""
    skipped = set(skipped_layers(config))
    return [i for i in range(len(layer_types(config))) if i not in skipped]
