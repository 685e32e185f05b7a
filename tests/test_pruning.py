"""Physical KV eviction: equal to masking, to no pruning at tau = -inf, and to kvpress's DMSPress."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from kvpress import DMSPress
from kvpress.pipeline import KVPressTextGenerationPipeline
from transformers import DynamicCache

from kvzap.pruning import KVzapPress, MaskedLayer, PrunedLayer, TopKPerHeadPress, TopKPerLayerPress
from kvzap.pruning.scorer_presses import PrecomputedScorerPress
from kvzap.surrogate.model import Surrogate
from tiny_pruning import FAMILIES, SIZES, WINDOW, pruning_model, random_tokens, scorer, word_tokenizer


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def model(request):
    return pruning_model(request.param)


def _teacher_forced(model, press, ids, prompt_len):
    """Prefill `prompt_len` tokens, then feed the rest one by one; logits of each step's last position."""
    cache, logits = DynamicCache(), []
    with press(model) if press else torch.no_grad():
        out = model(ids[:, :prompt_len], past_key_values=cache)
        logits.append(out.logits[:, -1])
        for t in range(prompt_len, ids.shape[1]):
            logits.append(model(ids[:, t : t + 1], past_key_values=cache).logits[:, -1])
    return torch.stack(logits), cache


def test_eviction_equals_masking_in_prefill_and_decoding(model, surrogate):
    ids = random_tokens(80 + 64)
    press = lambda evict: KVzapPress(scorer(surrogate), threshold=0.0, window=WINDOW, decoding=True, evict=evict)
    evict_press, mask_press = press(True), press(False)
    evicted, cache = _teacher_forced(model, evict_press, ids, 80)
    masked, dense = _teacher_forced(model, mask_press, ids, 80)
    assert isinstance(cache.layers[0], PrunedLayer) and isinstance(dense.layers[0], MaskedLayer)
    assert (evicted - masked).abs().max() <= 1e-4
    assert 0.2 < evict_press.compression_ratio == mask_press.compression_ratio < 0.8
    assert cache.get_seq_length() == ids.shape[1]  # positions continue from the unpruned length
    for layer, reference in zip(cache.layers, dense.layers):  # counted from the packed rows / the dropped mask
        assert torch.equal(layer.removed, reference.removed) and bool(layer.removed.gt(0).any())


def test_minus_inf_threshold_prunes_nothing(model, surrogate):
    ids = random_tokens(60 + 20)
    press = KVzapPress(scorer(surrogate), threshold=-math.inf, window=WINDOW, decoding=True)
    pruned, cache = _teacher_forced(model, press, ids, 60)
    full, _ = _teacher_forced(model, None, ids, 60)
    assert press.compression_ratio == 0.0
    assert cache.layers[1].rows.length.tolist() == [ids.shape[1] - WINDOW] * SIZES["num_key_value_heads"]
    assert torch.equal(pruned.argmax(-1), full.argmax(-1))
    assert (pruned - full).abs().max() <= 1e-5


def test_greedy_generate_matches_kvpress_dmspress(surrogate):
    prompt = random_tokens(100, seed=3)
    outputs, ratios = [], []
    for press in (
        KVzapPress(scorer(surrogate), threshold=0.0, window=WINDOW, decoding=True),
        DMSPress(scorer(surrogate), threshold=0.0, sliding_window_size=WINDOW, decoding=True),
    ):
        model = pruning_model("llama")
        with press(model):
            outputs.append(model.generate(prompt, max_new_tokens=40, do_sample=False, pad_token_id=0))
        ratios.append(press.compression_ratio)
    assert torch.equal(outputs[0], outputs[1])
    assert ratios[0] == pytest.approx(ratios[1], abs=1e-12) and ratios[0] > 0.2


def test_sampling_generate_eviction_equals_masking(surrogate):
    model, prompt, outputs = pruning_model("qwen3"), random_tokens(90, seed=4), []
    for evict in (True, False):
        torch.manual_seed(5)
        with KVzapPress(scorer(surrogate), threshold=0.0, window=WINDOW, decoding=True, evict=evict)(model):
            outputs.append(model.generate(prompt, max_new_tokens=30, do_sample=True, top_k=50, pad_token_id=0))
    assert torch.equal(outputs[0], outputs[1])


def test_held_bytes_follow_the_kept_fraction(surrogate):
    model, ids = pruning_model("llama"), random_tokens(1024, seed=6)
    press = KVzapPress(scorer(surrogate), threshold=0.0, window=WINDOW)
    _, cache = _teacher_forced(model, press, ids, ids.shape[1])
    _, full = _teacher_forced(model, None, ids, ids.shape[1])
    held = sum(layer.nbytes for layer in cache.layers)
    dense = sum(layer.keys.nbytes + layer.values.nbytes for layer in full.layers)
    assert 0.3 < press.compression_ratio < 0.7
    assert held / dense <= 1 - press.compression_ratio + 0.03


def test_kvpress_pipeline_prefill_pruning_matches_dmspress(surrogate):
    """RULER-style: context pruned under the press, short questions answered after it (two, to test cropping)."""
    context = " ".join(f"w{i}" for i in random_tokens(120, seed=7)[0].clamp(min=2).tolist())
    questions = ["w5 w6 w7", "w9 w10"]
    answers, ratios = [], []
    for press in (
        KVzapPress(scorer(surrogate), threshold=0.0, window=WINDOW),
        KVzapPress(scorer(surrogate), threshold=0.0, window=WINDOW, evict=False),
        DMSPress(scorer(surrogate), threshold=0.0, sliding_window_size=WINDOW),
    ):
        pipe = KVPressTextGenerationPipeline(model=pruning_model("llama"), tokenizer=word_tokenizer(), device="cpu")
        answers.append(pipe(context, questions=questions, press=press, max_new_tokens=8)["answers"])
        ratios.append(press.compression_ratio)
    assert answers[0] == answers[1] == answers[2]
    assert ratios[0] == pytest.approx(ratios[2], abs=1e-12) and ratios[0] > 0.2


def test_ratio_breakdowns(model, surrogate):
    press = KVzapPress(scorer(surrogate), threshold=0.5, window=WINDOW)
    _teacher_forced(model, press, random_tokens(100, seed=8).repeat(2, 1), 100)
    table = press.head_ratio_table
    assert table.shape == (SIZES["num_hidden_layers"], SIZES["num_key_value_heads"])
    assert press.sample_ratios.shape == (2,) and torch.allclose(press.sample_ratios, press.sample_ratios[:1])
    assert press.compression_ratio == pytest.approx(table.mean().item())
    with pytest.raises(AttributeError):
        press.compression_ratio = 0.5


def test_topk_per_head_and_per_layer_selection(surrogate):
    scores = torch.randn(1, 2, 100, generator=torch.Generator().manual_seed(9))
    scores[0, 0] += 3  # head 0 dominates: per-layer budgets move to it
    head = TopKPerHeadPress(scorer(surrogate), ratio=0.75, window=0).select(scores)
    layer = TopKPerLayerPress(scorer(surrogate), ratio=0.75, window=0).select(scores)
    assert head.sum(-1).tolist() == [[25, 25]]
    assert layer.sum().item() == 50 and layer[0, 0].sum() > 25 and layer[0, 1].sum() >= int(0.2 * 25)
    assert layer[0, 1][scores[0, 1].topk(5).indices].all()  # the safeguard


def test_topk_press_runs_with_a_window(model, surrogate):
    press = TopKPerHeadPress(scorer(surrogate), ratio=0.5, window=WINDOW)
    _, cache = _teacher_forced(model, press, random_tokens(116, seed=10), 116)
    assert cache.layers[0].rows.length.tolist() == [50, 50]
    assert press.compression_ratio == pytest.approx(50 / 116)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(threshold="-4"), "threshold must be a number"),
        (dict(threshold=None), "threshold must be a number"),
        (dict(threshold=float("nan")), "threshold must be a number"),
        (dict(threshold=-4.0, window=-1), "window must be an integer"),
        (dict(threshold=-4.0, window=2.5), "window must be an integer"),
    ],
)
def test_bad_arguments_are_refused(surrogate, kwargs, match):
    with pytest.raises(ValueError, match=match):
        KVzapPress(scorer(surrogate), **kwargs)


def test_a_model_whose_every_layer_slides_is_refused(surrogate):
    model = pruning_model("mistral", sliding_window=32)  # Mistral-7B v0.1's layout
    with pytest.raises(NotImplementedError, match="every layer of this mistral model is sliding-window"):
        with KVzapPress(scorer(surrogate), threshold=0.0)(model):
            model.generate(random_tokens(40), max_new_tokens=2, pad_token_id=0)


def test_mismatched_surrogate_is_refused(surrogate, tmp_path):
    Surrogate(32, 2, 2).save_pretrained(tmp_path)
    press = KVzapPress(str(tmp_path), threshold=-4.0)
    with pytest.raises(ValueError, match="does not match"):
        with press(pruning_model("llama")):
            pass


def test_surrogate_loads_from_a_folder(surrogate, tmp_path):
    surrogate.save_pretrained(tmp_path)
    by_path = KVzapPress(str(tmp_path), threshold=0.0, window=WINDOW)
    by_object = KVzapPress(scorer(copy.deepcopy(surrogate)), threshold=0.0, window=WINDOW)
    model, ids = pruning_model("llama"), random_tokens(64, seed=11)
    assert torch.equal(_teacher_forced(model, by_path, ids, 64)[0], _teacher_forced(model, by_object, ids, 64)[0])


def test_precomputed_oracle_scores_drive_the_press():
    """An oracle's (layers, H, T) scores: exactly the entries below tau outside the window are dropped."""
    model, ids = pruning_model("qwen3"), random_tokens(70, seed=12)
    oracle = torch.randn(
        SIZES["num_hidden_layers"], SIZES["num_key_value_heads"], 60, generator=torch.Generator().manual_seed(13)
    )
    press = KVzapPress(PrecomputedScorerPress(scores=oracle, offset=10), threshold=0.0, window=WINDOW)
    _, cache = _teacher_forced(model, press, ids, 70)
    expected = (oracle[..., : 70 - WINDOW - 10] < 0).sum(-1)  # the first 10 positions are unscored: kept
    assert torch.equal(torch.stack([layer.removed[0] for layer in cache.layers]), expected)


def test_forward_without_cache_is_left_alone(surrogate):
    model, ids = pruning_model("llama"), random_tokens(40, seed=14)
    with KVzapPress(scorer(surrogate), threshold=0.0, window=WINDOW)(model):
        pruned = model(ids, use_cache=False).logits
    assert torch.allclose(pruned, model(ids, use_cache=False).logits, atol=1e-6)
