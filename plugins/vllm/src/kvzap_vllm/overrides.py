"""The model overrides: each subclasses vLLM's own class for an architecture and, when the engine's
additional_config has a `kvzap` section, refuses what KVzap cannot serve under, loads the surrogate as KVzapPress
loads it (a folder, our Hub repos or nvidia/KVzap-*), checks it against the model and attaches the scorer. With a
finite threshold it also sets the engine up to prune: one KV cache group per layer (with `"layout": "per_head"`, per
(layer, KV head): each layer's attention is split per KV head first), the worker's compaction and the pruning
scheduler (the model is built before the KV cache and the scheduler, in the same process)."""

from __future__ import annotations

from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.mistral import MistralForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

from kvzap.surrogate.model import Surrogate
from kvzap_vllm import groups, heads, pruner
from kvzap_vllm.architectures import ARCHITECTURES
from kvzap_vllm.refusals import pruning_refusal, refusal, sliding_refusal
from kvzap_vllm.scoring import Scorer
from kvzap_vllm.settings import KVzapSettings, prunes

SCHEDULER = "kvzap_vllm.scheduler.KVzapScheduler"


def attach_scorer(model, vllm_config, architecture: str) -> Scorer | None:
    """The scorer for `model` (a vLLM decoder-only model with .model.layers[i].self_attn), or None without settings."""
    settings = KVzapSettings.read(vllm_config.additional_config)
    if settings is None:
        return None
    reason = refusal(vllm_config, architecture, tuple(ARCHITECTURES))
    if prunes(vllm_config):
        attention = vllm_config.compilation_config.static_forward_context  # layer name -> the attention vLLM built
        windows = {name: getattr(layer, "sliding_window", None) for name, layer in attention.items()}
        reason = reason or pruning_refusal(vllm_config, SCHEDULER) or sliding_refusal(windows)
    if reason:
        raise ValueError(f"KVzap cannot serve this engine: {reason}.")
    surrogate = Surrogate.from_pretrained(settings.surrogate)
    surrogate.check_matches(vllm_config.model_config.hf_config)
    decoder = model.model
    layers = range(decoder.start_layer, decoder.end_layer)  # this pipeline stage's layers
    scorer = Scorer(surrogate, settings)
    scorer.attach({i: decoder.layers[i].self_attn for i in layers})
    if prunes(vllm_config) and settings.layout == "per_head":  # before the KV cache spec is read from the layers
        heads.split_heads({i: decoder.layers[i].self_attn for i in layers}, vllm_config)
    if prunes(vllm_config):
        groups.install()
        pruner.install()
        vllm_config.scheduler_config.scheduler_cls = SCHEDULER
    return scorer


def kvzap_override(base: type) -> type:
    """`base` (vLLM's class for one architecture) with the scorer attached once the model is built. One recipe for
    every family: their decoders all have .model.layers[i].self_attn, called with positions= and hidden_states=."""

    def __init__(self, *, vllm_config, prefix: str = "", **kwargs):
        base.__init__(self, vllm_config=vllm_config, prefix=prefix, **kwargs)
        self.kvzap = attach_scorer(self, vllm_config, base.__name__)

    name = f"KVzap{base.__name__}"
    return type(name, (base,), {"__init__": __init__, "__module__": __name__, "__qualname__": name})


KVzapLlamaForCausalLM = kvzap_override(LlamaForCausalLM)
KVzapQwen3ForCausalLM = kvzap_override(Qwen3ForCausalLM)
KVzapQwen2ForCausalLM = kvzap_override(Qwen2ForCausalLM)
KVzapMistralForCausalLM = kvzap_override(MistralForCausalLM)
