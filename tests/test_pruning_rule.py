"""KVzap's inference rule on a hand-worked example: threshold, protected window, each token judged once."""

import pytest
import torch
from transformers import DynamicCache

from kvzap.pruning import KVzapPress
from kvzap.pruning.scorer_presses import PrecomputedScorerPress
from tiny_models import tiny_model

# Two KV heads, eight tokens, window 3, tau 0 (an entry is kept iff its score >= 0).
SCORES = torch.tensor(
    [
        [1.0, -1.0, 2.0, -3.0, 0.0, -2.0, 5.0, -1.0],  # head 0
        [-1.0] * 8,  # head 1
    ]
)


@pytest.mark.parametrize("evict", [True, False])
def test_hand_worked_threshold_and_window(evict):
    model = tiny_model("llama", 100)
    press = KVzapPress(
        PrecomputedScorerPress(scores=SCORES.expand(2, 2, 8)), threshold=0.0, window=3, decoding=True, evict=evict
    )
    ids = torch.arange(8)[None]
    cache = DynamicCache()
    with press(model):
        # Prefill 6 tokens: positions 0-2 leave the window. Head 0 drops 1; head 1 drops 0, 1, 2.
        model(ids[:, :6], past_key_values=cache)
        assert press.compression_ratio == pytest.approx(4 / 12)
        # Token 6 arrives: position 3 leaves the window, both heads drop it.
        model(ids[:, 6:7], past_key_values=cache)
        assert press.compression_ratio == pytest.approx(6 / 14)
        # Token 7 arrives: position 4 (score exactly 0) is kept by head 0, dropped by head 1.
        model(ids[:, 7:8], past_key_values=cache)
        assert press.compression_ratio == pytest.approx(7 / 16)
    for layer in cache.layers:
        assert layer.removed[0].tolist() == [2, 5]
    assert press.head_ratio_table.tolist() == [[2 / 8, 5 / 8]] * 2
    if evict:  # physically gone: head 0 holds positions 0, 2, 4, head 1 none, plus the 3-token window
        assert cache.layers[0].rows.length.tolist() == [3, 0]
        assert cache.layers[0].window_len == 3
