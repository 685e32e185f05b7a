"""The model overrides: each subclasses vLLM's own class for an architecture and, when the engine's
additional_config has a `kvzap` section, refuses what KVzap cannot serve under, loads the surrogate as KVzapPress
loads it (a folder, our Hub repos or nvidia/KVzap-*), checks it against the model and attaches the scorer."""

from __future__ import annotations

import math

from vllm.logger import init_logger
from vllm.model_executor.models.llama import LlamaForCausalLM

from kvzap.surrogate.model import Surrogate
from kvzap_vllm.architectures import ARCHITECTURES
from kvzap_vllm.refusals import refusal
from kvzap_vllm.scoring import Scorer
from kvzap_vllm.settings import KVzapSettings

logger = init_logger(__name__)


def attach_scorer(model, vllm_config, architecture: str) -> Scorer | None:
    """The scorer for `model` (a vLLM decoder-only model with .model.layers[i].self_attn), or None without settings."""
    settings = KVzapSettings.read(vllm_config.additional_config)
    if settings is None:
        return None
    reason = refusal(vllm_config, architecture, tuple(ARCHITECTURES))
    if reason:
        raise ValueError(f"KVzap cannot serve this engine: {reason}.")
    if settings.threshold > -math.inf:
        logger.warning(
            "KVzap: this plugin version scores but does not prune: threshold %s removes no entry and frees no block.",
            settings.threshold,
        )
    surrogate = Surrogate.from_pretrained(settings.surrogate)
    surrogate.check_matches(vllm_config.model_config.hf_config)
    decoder = model.model
    layers = range(decoder.start_layer, decoder.end_layer)  # this pipeline stage's layers
    scorer = Scorer(surrogate, settings.record_scores)
    scorer.attach({i: decoder.layers[i].self_attn for i in layers})
    return scorer


class KVzapLlamaForCausalLM(LlamaForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.kvzap = attach_scorer(self, vllm_config, "LlamaForCausalLM")
