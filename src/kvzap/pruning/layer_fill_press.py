"""KVzapLayerFillPress: KVzap as an engine with per-token slots (a vLLM block holds every KV head of a token) serves
it. The heads of a layer keep the same number of entries at each judgement (kvzap.fill.layer_fill), so this press is
the transformers reference of the vLLM plugin's pruning: the same verdicts, and the same greedy tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvzap.fill import layer_fill
from kvzap.pruning.kvzap_press import KVzapPress


@dataclass
class KVzapLayerFillPress(KVzapPress):
    """KVzapPress whose heads under the layer's most-kept count keep their next-best entries (never fewer entries
    than KVzapPress keeps; the ratios count what is held)."""

    def select(self, scores: torch.Tensor) -> torch.Tensor:
        return layer_fill(scores, self.threshold)
