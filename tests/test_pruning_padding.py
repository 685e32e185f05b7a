"""Padded batches are refused at the prefill itself, in a plain forward as in generate."""

import pytest
import torch
from transformers import DynamicCache

from kvzap.pruning import KVzapPress
from kvzap.pruning.scorer_presses import SurrogateScorerPress
from kvzap.surrogate.model import Surrogate
from tiny_models import tiny_model

PADDING_ERROR = "Padded batches are not supported with a pruned cache: use equal-length prompts."


def _press(evict=True):
    torch.manual_seed(1)
    return KVzapPress(SurrogateScorerPress(surrogate=Surrogate(64, 2, 2)), threshold=0.0, window=4, evict=evict)


def _batch():
    ids = torch.randint(4, 400, (2, 24), generator=torch.Generator().manual_seed(0))
    return ids, torch.ones_like(ids)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("evict", [True, False])
def test_padded_forward_is_refused(side, evict):
    model, (ids, mask) = tiny_model("llama"), _batch()
    if side == "left":
        mask[1, :5] = 0
    else:
        mask[1, -5:] = 0
    press = _press(evict)
    with pytest.raises(NotImplementedError, match=PADDING_ERROR):
        with press(model):
            model(ids, attention_mask=mask, past_key_values=DynamicCache())


def test_padded_generate_gives_the_same_error():
    model, (ids, mask) = tiny_model("llama"), _batch()
    mask[1, :5] = 0
    with pytest.raises(NotImplementedError, match=PADDING_ERROR):
        with _press()(model):
            model.generate(ids, attention_mask=mask, max_new_tokens=2, pad_token_id=3)


def test_full_attention_mask_is_accepted():
    """An all-ones mask is no padding: same cache and ratios as passing no mask."""
    model, (ids, mask) = tiny_model("llama"), _batch()
    ratios = []
    for kwargs in ({}, {"attention_mask": mask}):
        press = _press()
        with press(model):
            model(ids, past_key_values=DynamicCache(), **kwargs)
        ratios.append(press.sample_ratios)
    assert torch.equal(ratios[0], ratios[1]) and bool((ratios[0] > 0).all())
