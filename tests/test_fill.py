"""The fill policy of a per-token-slot engine (kvzap.fill.layer_fill), against a plain loop over heads, and the
press built on it: every head of a layer keeps the same count, never less than KVzap keeps."""

import pytest
import torch

from kvzap.fill import layer_fill
from kvzap.pruning import KVzapLayerFillPress, KVzapPress
from tiny_pruning import WINDOW, pruning_model, random_tokens, scorer, tiny_surrogate


def reference_fill(scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """One (H, m) judgement, head by head: n = the most any head keeps; each head takes its n best, older first."""
    heads, m = scores.shape
    n = max(int((scores[h] >= threshold).sum()) for h in range(heads))
    keep = torch.zeros(heads, m, dtype=torch.bool)
    for h in range(heads):
        ranked = sorted(range(m), key=lambda t: (-scores[h, t].item(), t))
        keep[h, ranked[:n]] = True
    return keep


def test_layer_fill_matches_the_loop_with_ties_and_batches():
    torch.manual_seed(0)
    scores = torch.randn(4, 3, 5, 40).round(decimals=1)  # rounding makes ties
    got = layer_fill(scores, 0.3)
    for b in range(4):
        for layer in range(3):
            assert torch.equal(got[b, layer], reference_fill(scores[b, layer], 0.3))


def test_every_head_keeps_the_most_keeping_heads_count_and_all_it_would_keep():
    scores = torch.tensor([[[0.5, -1.0, 2.0, -3.0], [-1.0, -2.0, -3.0, -4.0], [1.0, 1.0, -5.0, 0.2]]])
    keep = layer_fill(scores, 0.0)
    assert keep.sum(-1).tolist() == [[3, 3, 3]]
    assert bool(keep[scores >= 0.0].all())  # nothing KVzap keeps is dropped
    assert keep[0, 1].tolist() == [True, True, True, False]  # a head keeping nothing keeps its 3 best


def test_one_leaving_token_is_kept_by_every_head_iff_one_head_keeps_it():
    scores = torch.tensor([[[-1.0], [0.5]], [[-1.0], [-0.5]]])
    assert layer_fill(scores, 0.0)[..., 0].tolist() == [[True, True], [False, False]]


def test_the_layer_fill_press_removes_at_most_what_kvzap_does_per_head():
    model, ids, surrogate = pruning_model("llama"), random_tokens(64), tiny_surrogate()
    removed = {}
    for press_type in (KVzapPress, KVzapLayerFillPress):
        press = press_type(scorer(surrogate), threshold=0.0, window=WINDOW)
        with torch.no_grad(), press(model):
            model(ids)
        removed[press_type] = torch.stack([press.removed_counts[i][0] for i in sorted(press.removed_counts)])
    fill = removed[KVzapLayerFillPress]
    assert bool((fill <= removed[KVzapPress]).all()) and bool((fill < removed[KVzapPress]).any())
    assert bool((fill == fill[..., :1]).all())  # (layers, B, H): one count per (layer, row)


@pytest.mark.parametrize(
    ("scores", "threshold", "message"),
    [
        (torch.zeros(5), 0.0, r"scores \(\.\.\., H, m\), one row per KV head; got shape \(5,\)"),
        (torch.zeros(2, 5), float("nan"), "threshold is NaN: give a log score"),
    ],
)
def test_layer_fill_refuses_a_bad_shape_or_threshold_by_name(scores, threshold, message):
    with pytest.raises(ValueError, match=message):
        layer_fill(scores, threshold)
