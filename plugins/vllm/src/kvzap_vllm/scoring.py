"""The surrogate's scores, computed where vLLM's attention receives its input: a forward pre-hook on each decoder
layer's attention module sees h (the input norm's output, (tokens, D) over the whole flattened batch) and the tokens'
positions, as kvpress's hook sees them in transformers. The surrogate lives outside the model's module tree, so
vLLM's weight loader neither looks for its weights nor moves it."""

from __future__ import annotations

import torch

from kvzap.surrogate.model import SCORE_DTYPE, Surrogate
from kvzap_vllm.settings import KVzapSettings


class Scorer:
    """Predicted log scores (tokens, KV heads) per layer of every forward: the last on `latest`, all on `scores`
    when recording."""

    def __init__(self, surrogate: Surrogate, settings: KVzapSettings):
        self.surrogate, self.settings, self.record = surrogate, settings, settings.record_scores
        self.scores: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}  # layer -> [(positions, scores)]
        self.latest: dict[int, torch.Tensor] = {}  # layer -> the last forward's scores, which the pruning judges

    def attach(self, attention_modules: dict[int, torch.nn.Module]) -> None:
        for index, module in attention_modules.items():
            module.register_forward_pre_hook(self._hook(index), with_kwargs=True)

    def _hook(self, index: int):
        def score(module, args, kwargs):
            h, positions = kwargs["hidden_states"], kwargs["positions"]
            layer = self.surrogate.layer_like(index, h, in_place=True)  # float32, as the press scores
            predicted = layer(h.to(SCORE_DTYPE))  # (tokens, H_kv)
            self.latest[index] = predicted
            if self.record:  # copies: vLLM reuses its position and activation buffers
                self.scores.setdefault(index, []).append(
                    (positions.to("cpu", copy=True), predicted.to("cpu", torch.float32, copy=True))
                )

        return score

    def clear(self) -> None:
        self.scores.clear()
