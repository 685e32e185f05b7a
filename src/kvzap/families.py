"""What a model family cannot serve, from its config alone (torch-free): the library's presses and oracle refuse it
at entry, the planner (kvzap.evaluation.refusals) before any job, each with the same reason.

A config here is a plain dict: a Hub config.json, a known offline model's facts (kvzap.plan.model_configs), or a
loaded model's `config.to_dict()`. A composite config (Gemma 3 with vision) is read through its text_config. Layer
types count only where the config lists them: a raw config.json without `layer_types` does not say which layers
slide (Qwen2's sets a window it does not use), so rules that need them are left to the jobs.
"""

from __future__ import annotations

from types import SimpleNamespace

from kvzap.layer_types import BOUNDED, pruned_layers, skipped_layers

KVZIP_REFUSED = ("gemma3", "gemma3_text")  # kvpress's KVzipPress refuses every Gemma3PreTrainedModel
SINKS = ("gpt_oss",)  # every layer adds a learned sink logit (s_aux) to its softmax
EAGER_ONLY = ("gpt_oss",)  # no sdpa kernel for its sinks in transformers 5.2: it runs eager attention
TYPED_ROPE = ("gemma3", "gemma3_text")  # one rotary table per layer type: calls without the type crash
KVZIP = ("kvzip", "kvzip_plus")
ALL_SLIDING = "every layer is sliding-window (or chunked) attention, so no full-attention layer is left to score"


def text_config(config: dict) -> dict:
    return config.get("text_config") or config


def _listed_layers(config: dict) -> SimpleNamespace | None:
    """The config as kvzap.layer_types reads it, when it lists its layer types (else None: unknown)."""
    text = text_config(config)
    return SimpleNamespace(**text) if text.get("layer_types") else None


def out_of_reach(config: dict) -> str | None:
    """Why no KVzap stage runs on the family (the oracle, hence surrogates, hence every model entry), or None: the
    rules of kvzap.oracle.attention.check_family, in its words."""
    text = text_config(config)
    if text.get("kv_lora_rank"):
        return "its multi-head latent attention caches a compressed latent KV, not per-head keys"
    other = sorted({t for t in text.get("layer_types") or () if t not in ("full_attention", *BOUNDED)})
    if other:
        return f"its layers of type {', '.join(other)} keep a recurrent state, not a KV cache"
    fields = [k for k in text if k.startswith(("mamba", "ssm", "linear_", "layers_block_type"))]
    if fields:
        return f"it has state-space or linear-attention layers ({fields[0]}, ...), which keep no KV cache"
    layers = _listed_layers(config)
    if layers is not None and not pruned_layers(layers):
        return ALL_SLIDING
    return None


def pruned_attention_reason(config: dict) -> str | None:
    """Why attention over a pruned cache (kvzap.pruning.attention, which also serves a prefill group's batched
    decode) would compute something else than the model's own attention, or None."""
    text = text_config(config)
    if text.get("model_type") in SINKS:
        return "its attention uses attention sinks, which attention over a pruned cache does not apply"
    if text.get("attn_logit_softcapping"):
        return (
            f"its attention uses soft-capped logits (attn_logit_softcapping={text['attn_logit_softcapping']}), "
            "which attention over a pruned cache does not apply"
        )
    return None


def kvzip_reason(config: dict) -> str | None:
    """Why kvpress's KVzipPress cannot run on the family, or None."""
    model_type = text_config(config).get("model_type")
    if model_type in KVZIP_REFUSED:
        return "kvpress's KVzipPress refuses Gemma 3 models ('KVzipPress is not supported for Gemma3ForCausalLM')"
    layers = _listed_layers(config)
    if layers is not None and skipped_layers(layers):
        return (
            "KVzipPress replays the context through every layer and then cuts each layer's cache back to the "
            "context, which a sliding-window layer's bounded cache no longer holds"
        )
    return None
