"""Which methods a model family cannot run (the planner's check before any job, and the jobs' own at start): the
family facts of kvzap.families, read per method of the registry."""

from __future__ import annotations

from kvzap.evaluation import methods
from kvzap.families import EAGER_ONLY, KVZIP, TYPED_ROPE, kvzip_reason, pruned_attention_reason, text_config


def refusal(config: dict, method: str) -> str | None:
    """Why `method` (a kvzap.evaluation.methods name) cannot run on the family, or None."""
    info = methods.METHODS[method]
    if method in KVZIP and kvzip_reason(config):
        return kvzip_reason(config)
    if info.kvzap_attention and pruned_attention_reason(config):
        return pruned_attention_reason(config)
    if method == "duo_attention_on_the_fly" and text_config(config).get("model_type") in TYPED_ROPE:
        return (
            "kvpress's on-the-fly DuoAttention scoring calls the model's rotary embedding without a layer type, "
            "which Gemma 3's needs (AttributeError 'None_inv_freq')"
        )
    if info.masks and text_config(config).get("model_type") in EAGER_ONLY:
        return (
            "kvpress masks its entries through the attention functions it patches, and this family runs eager "
            "attention (kvpress asserts 'eager mode not supported')"
        )
    return None
