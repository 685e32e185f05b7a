"""The cache a cell prefills its context into (kvpress's pipeline, one press at a time), and its KV memory.

It is transformers' own cache for the model's config, so sliding-window layers keep their bounded window
(kvpress's pipeline would prefill into `DynamicCache()`, where they grow like full layers). A sliding layer counts
every position it has seen; a plain full layer counts what it holds. Once a kvpress press has shortened a full
layer the two disagree: the model takes the question's positions from layer 0 and the masks place each layer's
entries from those counts, so on Gemma 3 (layer 0 slides) the question's tokens see the tokens after them in the
full layers, and where layer 0 is full the sliding layers' windows are misplaced. `PositionedLayer` counts positions
as the sliding layer does and places what it holds just before the query: every layer then attends as a forward
that masks the pruned entries would (tests/test_hybrid_baselines.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from kvzap.introspection import attention_modules
from kvzap.layer_types import pruned_layers
from kvzap.pruning import held_kv_bytes
from kvzap.pruning.windowed_press import WindowedPress


class PositionedLayer(DynamicLayer):
    """A full-attention layer that counts every position appended to it, whatever a press leaves in `keys`.

    kvpress's pipeline drops an answer by cutting each layer to its length before the question; counted in
    positions, that cut no longer removes it, so a cache of these serves one question per context (as the jobs ask).
    """

    def __init__(self):
        super().__init__()
        self.seen = 0

    def update(self, key_states, value_states, cache_kwargs=None):
        self.seen += key_states.shape[-2]
        return super().update(key_states, value_states, cache_kwargs)

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, cache_position) -> tuple[int, int]:
        held = self.keys.shape[-2] if self.is_initialized else 0
        return held + cache_position.shape[0], self.seen - held


def prefill_cache(model, press) -> DynamicCache:
    """`DynamicCache(config=...)`, its full-attention layers PositionedLayer unless the press is ours (KVzap's
    presses put their own layers there, which count positions)."""
    cache = DynamicCache(config=model.config)
    if not isinstance(press, WindowedPress):
        cache.layers = [layer if layer.is_sliding else PositionedLayer() for layer in cache.layers]
    return cache


def full_kv_bytes(model, cache) -> int:
    """The bytes the uncompressed cache would hold now: every position of every full-attention layer, and the
    sliding layers' windows as they are (no press touches them)."""
    windows = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers if layer.is_sliding)
    text = model.config.get_text_config(decoder=True)
    modules = attention_modules(model)
    position = sum(2 * text.num_key_value_heads * modules[i].head_dim for i in pruned_layers(model.config))
    return windows + cache.get_seq_length() * position * model.dtype.itemsize


@contextmanager
def memory_after_prefill(model) -> Iterator[dict]:
    """While active, the KV bytes of the cache at the model's first call on it ({} before): kvpress's pipeline
    prefills through `model.model`, then asks the question through `model`. `kv_bytes` is what the cache holds
    (kvzap.pruning.held_kv_bytes, every layer); `full_kv_bytes` what the full cache would hold."""
    memory = {}

    def read(module, args, kwargs):
        if not memory:
            cache = kwargs["past_key_values"]
            memory.update(kv_bytes=held_kv_bytes(cache), full_kv_bytes=full_kv_bytes(model, cache))

    handle = model.register_forward_pre_hook(read, with_kwargs=True)
    try:
        yield memory
    finally:
        handle.remove()
