"""The "kvzap" attention implementation: exact attention over pruned layers, sdpa for everything else.

transformers calls `cache.update(...)` and hands its result to the model's attention function. A pruned
layer returns itself, so this function can send the query to `layer.attend`; dense layers go to sdpa with
sdpa's masks (cut to the layer's length when presses leave layers of different lengths). It is registered under
a new name (nothing existing is replaced) and must stay selected as long as a pruned cache is in use, e.g. for
the question pass kvpress's pipeline runs after the press block.
"""

from __future__ import annotations

from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from kvzap.pruning.cache import JudgedLayer

NAME = "kvzap"


def kvzap_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """query (B, Hq, T, D); key/value dense (B, H, L, D) or a JudgedLayer -> ((B, T, Hq, D), None)."""
    if isinstance(key, JudgedLayer):
        for name, what in (("softcap", "soft-capped logits"), ("s_aux", "attention sinks")):
            if kwargs.get(name) is not None:
                raise NotImplementedError(
                    f"{type(module).__name__} uses {what}, which attention over a pruned cache does not apply: "
                    "KVzap pruning does not support this model family yet."
                )
        scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
        return key.attend(query, attention_mask, scaling), None
    if attention_mask is not None and attention_mask.shape[-1] > key.shape[-2]:
        # Layers pruned to different lengths (kvpress's PyramidKV) share one mask sized for the longest layer. Rows
        # are unpadded and pruning only removes past entries, so this layer's keys are the mask's last columns.
        attention_mask = attention_mask[..., -key.shape[-2] :]
    return ALL_ATTENTION_FUNCTIONS["sdpa"](
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
    )


# Registered on import, so that `from_pretrained(..., attn_implementation="kvzap")` finds it too.
AttentionInterface.register(NAME, kvzap_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_kvzap_attention(model: PreTrainedModel) -> None:
    """Select the "kvzap" attention on `model` (idempotent); dense caches then behave exactly as with sdpa."""
    if model.config._attn_implementation != NAME:
        model.set_attn_implementation(NAME)
