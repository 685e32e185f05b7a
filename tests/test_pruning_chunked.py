"""Chunked prefill: equal to one forward when nothing is pruned, to masking, to an explicit-mask reference, and to
chunks fed by hand; through model.generate and kvpress's pipeline."""

from __future__ import annotations

import math

import pytest
import torch
from kvpress.pipeline import KVPressTextGenerationPipeline
from transformers import AttentionInterface, DynamicCache

from kvzap.evaluation import methods, presses
from kvzap.pruning import KVzapPress, PrunedLayer, TopKPerHeadPress
from kvzap.pruning.scorer_presses import PrecomputedScorerPress
from tiny_pruning import SIZES, WINDOW, pruning_model, random_tokens, scorer, word_tokenizer


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model(request):
    return pruning_model(request.param)


def _prefill(model, press, ids):
    with press(model):
        return model(ids, past_key_values=DynamicCache()).logits


@pytest.mark.parametrize("chunk", [48, 50, 199])
def test_nothing_pruned_equals_one_forward(model, surrogate, chunk):
    ids = random_tokens(200)
    press = KVzapPress(scorer(surrogate), threshold=-math.inf, window=WINDOW, prefill_chunk=chunk)
    cache = DynamicCache()
    with press(model):
        chunked = model(ids, past_key_values=cache).logits
    assert (chunked - model(ids).logits).abs().max() <= 1e-4
    assert isinstance(cache.layers[0], PrunedLayer) and cache.get_seq_length() == 200
    assert cache.layers[0].rows.length.tolist() == [200 - WINDOW] * SIZES["num_key_value_heads"]


def test_eviction_equals_masking(model, surrogate):
    ids = random_tokens(230, seed=3)
    logits, ratios = [], []
    for evict in (True, False):
        press = KVzapPress(scorer(surrogate), threshold=0.0, window=WINDOW, evict=evict, prefill_chunk=40)
        logits.append(_prefill(model, press, ids))
        ratios.append(press.compression_ratio)
    assert (logits[0] - logits[1]).abs().max() <= 1e-4
    assert ratios[0] == ratios[1] and 0.2 < ratios[0] < 0.8
    whole = KVzapPress(scorer(surrogate), threshold=0.0, window=WINDOW)
    assert (_prefill(model, whole, ids)[:, -1] - logits[0][:, -1]).abs().max() > 1e-3  # chunks saw a pruned cache


def _chunk_ends(length: int, chunk: int) -> list[int]:
    """Chunks counted from the prompt's end: the first is the short one."""
    return list(range(length % chunk or chunk, length + 1, chunk))


def _release(length: int, chunk: int, window: int) -> torch.Tensor:
    """(T,) first query position that no longer sees token j if it is dropped: the end of the first chunk after
    which j has left the window (length: no later query, or never judged)."""
    ends = torch.tensor(_chunk_ends(length, chunk))
    release = torch.full((length,), length)
    for end in ends.flip(0):
        release[: max(end - window, 0)] = end
    return release


def test_release_positions():
    assert _release(10, 4, 2).tolist() == [6, 6, 6, 6, 10, 10, 10, 10, 10, 10]


def test_equals_an_explicit_mask_reference():
    """Scores fixed in advance (an oracle's), so which entry each query sees is known: one whole-prompt forward
    with eager attention under that (layer, kv-head, query, key) mask must give the chunked prefill's logits."""
    model, ids, chunk = pruning_model("qwen3"), random_tokens(150, seed=4), 32
    layers, heads, length = SIZES["num_hidden_layers"], SIZES["num_key_value_heads"], ids.shape[1]
    scores = torch.randn(layers, heads, length, generator=torch.Generator().manual_seed(5))
    release = _release(length, chunk, WINDOW)
    dropped = (scores < 0) & (torch.arange(length) < length - WINDOW)  # (L, H, T): judged and below tau
    hidden = dropped[:, :, None, :] & (torch.arange(length)[:, None] >= release)  # (L, H, query, key)
    visible = torch.ones(length, length, dtype=torch.bool).tril() & ~hidden

    def reference_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
        group = query.shape[1] // key.shape[1]
        k, v = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
        logits = (query @ k.transpose(-1, -2)) * scaling
        logits = logits.masked_fill(~visible[module.layer_idx].repeat_interleave(group, 0), -math.inf)
        return (torch.softmax(logits, -1) @ v).transpose(1, 2), None

    AttentionInterface.register("chunk_reference", reference_attention)
    reference_model = pruning_model("qwen3")
    reference_model.set_attn_implementation("chunk_reference")
    expected = reference_model(ids, use_cache=False).logits
    press = KVzapPress(PrecomputedScorerPress(scores=scores), threshold=0.0, window=WINDOW, prefill_chunk=chunk)
    cache = DynamicCache()
    with press(model):
        chunked = model(ids, past_key_values=cache).logits
    assert (chunked - expected).abs().max() <= 1e-4
    assert torch.equal(torch.stack([layer.removed[0] for layer in cache.layers]), dropped.sum(-1))


def _by_hand(model, surrogate, ids, chunk, **options):
    """The chunked schedule fed by hand: a first forward, then one forward per chunk judged as decoding would."""
    press = KVzapPress(scorer(surrogate), threshold=0.0, window=WINDOW, decoding=True, **options)
    cache = DynamicCache()
    with press(model):
        ends = _chunk_ends(ids.shape[1], chunk)
        logits = [model(ids[:, max(end - chunk, 0) : end], past_key_values=cache).logits for end in ends]
    return torch.cat(logits, 1), cache, press


def test_equals_chunks_fed_by_hand(model, surrogate):
    ids = random_tokens(170, seed=6)
    expected, _, by_hand = _by_hand(model, surrogate, ids, 64)
    press = KVzapPress(scorer(surrogate), threshold=0.0, window=WINDOW, prefill_chunk=64)
    assert torch.equal(_prefill(model, press, ids), expected)
    assert press.compression_ratio == by_hand.compression_ratio


def test_generate_prunes_the_prompt_in_chunks(surrogate):
    model, ids, chunk = pruning_model("llama"), random_tokens(150, seed=7), 40
    press = KVzapPress(scorer(surrogate), threshold=0.0, window=WINDOW, prefill_chunk=chunk)
    with press(model):
        generated = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False, pad_token_id=0
        )
    logits, cache, by_hand = _by_hand(model, surrogate, ids, chunk)
    tokens = [logits[:, -1].argmax(-1, keepdim=True)]
    for _ in range(11):  # decoding is not judged (decoding=False): greedy steps outside the press
        tokens.append(model(tokens[-1], past_key_values=cache).logits[:, -1].argmax(-1, keepdim=True))
    assert torch.equal(generated[:, ids.shape[1] :], torch.cat(tokens, 1))
    assert press.compression_ratio == by_hand.compression_ratio > 0.2


def test_kvpress_pipeline_prunes_the_context_in_chunks(surrogate):
    context = " ".join(f"w{i}" for i in random_tokens(160, seed=8)[0].clamp(min=2).tolist())
    questions = ["w5 w6 w7", "w9 w10"]
    answers, ratios = [], []
    for evict in (True, False):
        press = KVzapPress(scorer(surrogate), threshold=0.0, window=WINDOW, evict=evict, prefill_chunk=48)
        pipe = KVPressTextGenerationPipeline(model=pruning_model("llama"), tokenizer=word_tokenizer(), device="cpu")
        answers.append(pipe(context, questions=questions, press=press, max_new_tokens=8)["answers"])
        ratios.append(press.compression_ratio)
    context_ids = word_tokenizer().encode("<s>" + context, return_tensors="pt", add_special_tokens=False)  # as kvpress
    _, _, by_hand = _by_hand(pruning_model("llama"), surrogate, context_ids, 48)
    assert answers[0] == answers[1] and ratios[0] == ratios[1] == by_hand.compression_ratio > 0.2


def test_topk_press_keeps_its_share_of_each_chunk(surrogate):
    press = TopKPerHeadPress(scorer(surrogate), ratio=0.5, window=WINDOW, prefill_chunk=50)
    model, cache = pruning_model("llama"), DynamicCache()
    with press(model):
        model(random_tokens(166, seed=9), past_key_values=cache)
    assert cache.layers[0].rows.length.tolist() == [25 * 3] * 2  # chunks of 16, 50, 50, 50 leave 0, 50, 50, 50


@pytest.mark.parametrize("chunk", [0, -8, True, 2.5, "64"])
def test_bad_chunk_is_refused(surrogate, chunk):
    with pytest.raises(ValueError, match="prefill_chunk must be None or an integer >= 1"):
        KVzapPress(scorer(surrogate), threshold=0.0, prefill_chunk=chunk)


def test_right_padding_and_extra_outputs_are_refused_and_the_forward_restored(surrogate):
    model, ids = pruning_model("llama"), random_tokens(80, seed=10)
    press = KVzapPress(scorer(surrogate), threshold=0.0, window=WINDOW, prefill_chunk=32)
    mask = torch.ones_like(ids)
    mask[:, -3:] = 0
    with press(model):
        with pytest.raises(NotImplementedError, match="Chunked prefill takes left-padded batches only"):
            model(ids, attention_mask=mask, past_key_values=DynamicCache())
        with pytest.raises(ValueError, match="all padding"):
            model(ids, attention_mask=torch.zeros_like(ids), past_key_values=DynamicCache())
        with pytest.raises(NotImplementedError, match="output_hidden_states"):
            model(ids, past_key_values=DynamicCache(), output_hidden_states=True)
        short = model(ids[:, :32], past_key_values=DynamicCache()).logits  # one chunk: an ordinary forward
    assert "forward" not in vars(model.model)
    assert torch.allclose(short, model(ids[:, :32]).logits, atol=1e-5)


def test_registry_method_prefills_in_chunks(surrogate, tmp_path):
    surrogate.save_pretrained(tmp_path)
    chunked = presses.build("kvzap_mlp_chunked", -4.0, {"mlp": tmp_path})
    assert chunked.prefill_chunk == methods.METHODS["kvzap_mlp_chunked"].prefill_chunk == 2048
    assert presses.build("kvzap_mlp", -4.0, {"mlp": tmp_path}).prefill_chunk is None
    assert "kvzap_mlp_chunked" not in methods.KVZAP_METHODS  # not the paper's method: outside Table 2
