"""Padded batches under a pruned cache: row for row, the same as each prompt alone.

Four prompts of different lengths (one shorter than the window, so padding sits in its window while it decodes),
left-padded as `generate` pads them, or right-padded in a plain forward: the generated tokens, the per-sample ratios
and the kept entries equal four batch-1 runs, for eviction and masking, prefill-only and decoding-time pruning, the
top-k presses and chunked prefill. Masks that hide anything but padding are refused.
"""

import pytest
import torch
from transformers import DynamicCache

from kvzap.pruning import KVzapPress, PrunedLayer, TopKPerHeadPress, TopKPerLayerPress
from kvzap.pruning.scorer_presses import SurrogateScorerPress
from kvzap.surrogate.model import Surrogate
from tiny_models import tiny_model

LENGTHS = (11, 37, 60, 26)  # the window is 16: the first row decodes with padding in its window
WINDOW, PAD = 16, 3
NEW_TOKENS = 12


def _scorer():
    torch.manual_seed(1)
    return SurrogateScorerPress(surrogate=Surrogate(64, 2, 2))


def _prompts():
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(4, 400, (1, n), generator=gen) for n in LENGTHS]


def _padded(prompts, side="left"):
    length = max(p.shape[1] for p in prompts)
    ids = torch.full((len(prompts), length), PAD)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        span = slice(length - p.shape[1], length) if side == "left" else slice(0, p.shape[1])
        ids[row, span], mask[row, span] = p[0], 1
    return ids, mask


def _generate(model, press, ids, mask):
    with press(model):
        out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=PAD)
    return out[:, ids.shape[1] :], press.sample_ratios


PRESSES = {
    "kvzap": lambda evict, decoding: KVzapPress(_scorer(), 0.0, WINDOW, decoding, evict=evict),
    "kvzap-chunked": lambda evict, decoding: KVzapPress(_scorer(), 0.0, WINDOW, decoding, evict=evict, prefill_chunk=9),
    "topk-head": lambda evict, decoding: TopKPerHeadPress(_scorer(), 0.5, WINDOW, evict=evict),
    "topk-layer": lambda evict, decoding: TopKPerLayerPress(_scorer(), 0.5, WINDOW, evict=evict),
}
CASES = [("kvzap", e, d) for e in (True, False) for d in (False, True)] + [
    ("kvzap-chunked", True, True),
    ("kvzap-chunked", False, False),
    ("topk-head", True, False),
    ("topk-layer", False, False),
]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


@pytest.mark.parametrize(("name", "evict", "decoding"), CASES)
def test_left_padded_generate_equals_each_prompt_alone(model, name, evict, decoding):
    prompts = _prompts()
    tokens, ratios = _generate(model, PRESSES[name](evict, decoding), *_padded(prompts))
    alone = [_generate(model, PRESSES[name](evict, decoding), p, torch.ones_like(p)) for p in prompts]
    assert torch.equal(tokens, torch.cat([t for t, _ in alone]))
    assert torch.allclose(ratios, torch.cat([r for _, r in alone]), rtol=0, atol=1e-12)
    assert ratios[0] == 0 if not decoding else ratios[0] > 0  # 11 tokens: within the window until it decodes
    assert bool((ratios[1:] > 0.1).all())


def _kept(layer: PrunedLayer, row: int, heads: int) -> list[torch.Tensor]:
    """Row `row`'s kept keys per kv-head: packed, then its window without padding."""
    packed, pads = layer.packed(), layer.window_pads()[row]
    out = []
    for h in range(heads):
        r = row * heads + h
        kept = packed.keys[packed.rows.starts[r] : packed.rows.starts[r] + packed.rows.lengths[r]]
        out.append(torch.cat([kept, layer.dense_keys[row, h, pads:]]))
    return out


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_forward_keeps_each_rows_own_entries(model, side):
    """A plain forward: each row keeps the entries it keeps alone, and the held packed bytes are the sum of the
    rows' (padding is never stored); its real positions' logits are the rows' own."""
    prompts = _prompts()
    ids, mask = _padded(prompts, side)
    # transformers numbers positions 0.. from the first column: right padding gives each row its own positions,
    # left padding needs them passed, as generate does
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    press, cache = KVzapPress(_scorer(), 0.0, WINDOW), DynamicCache()
    with press(model):
        logits = model(ids, attention_mask=mask, position_ids=positions, past_key_values=cache).logits
    batch_bytes = sum(layer.packed_keys.nbytes + layer.packed_values.nbytes for layer in cache.layers)
    alone_bytes = 0
    for row, p in enumerate(prompts):
        single, single_cache = KVzapPress(_scorer(), 0.0, WINDOW), DynamicCache()
        with single(model):
            single_logits = model(p, past_key_values=single_cache).logits
        real = mask[row].bool()
        assert (logits[row, real] - single_logits[0]).abs().max() <= 1e-5
        assert torch.allclose(press.sample_ratios[row], single.sample_ratios[0], rtol=0, atol=1e-12)
        for batch_layer, single_layer in zip(cache.layers, single_cache.layers):
            for got, want in zip(_kept(batch_layer, row, 2), _kept(single_layer, 0, 2)):
                assert got.shape == want.shape and (got - want).abs().max() <= 1e-5
            alone_bytes += single_layer.packed_keys.nbytes + single_layer.packed_values.nbytes
    assert batch_bytes == alone_bytes > 0


def test_sampled_rollouts_run_batched(model):
    """num_return_sequences (AIME's rollouts): the rows of one prompt share its prefill verdicts, then sample
    apart; seeded runs repeat."""
    prompt = _prompts()[2]
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        press = KVzapPress(_scorer(), 0.0, WINDOW, decoding=False)
        with press(model):
            out = model.generate(
                prompt, max_new_tokens=6, do_sample=True, num_return_sequences=3, pad_token_id=PAD, top_k=0
            )
        runs.append((out, press.sample_ratios))
    (out, ratios), (again, ratios_again) = runs
    assert out.shape == (3, prompt.shape[1] + 6) and torch.equal(out, again)
    assert torch.equal(ratios, ratios_again) and len(set(ratios.tolist())) == 1 and ratios[0] > 0


def test_beam_search_is_refused(model):
    prompt = _prompts()[2]
    with KVzapPress(_scorer(), 0.0, WINDOW)(model):
        with pytest.raises(NotImplementedError, match="Beam search is not supported with a pruned cache"):
            model.generate(prompt, max_new_tokens=3, num_beams=2, do_sample=False, pad_token_id=PAD)


def test_masks_that_hide_more_than_padding_are_refused(model):
    prompts = _prompts()
    ids, mask = _padded(prompts)
    holes = mask.clone()
    holes[2, 30] = 0  # a hole inside a row
    with KVzapPress(_scorer(), 0.0, WINDOW)(model):
        with pytest.raises(NotImplementedError, match="neither a prefix nor a suffix"):
            model(ids, attention_mask=holes, past_key_values=DynamicCache())
        empty = mask.clone()
        empty[0] = 0
        with pytest.raises(ValueError, match="Row 0 of the batch is all padding"):
            model(ids, attention_mask=empty, past_key_values=DynamicCache())
        cache = DynamicCache()
        model(ids, attention_mask=mask, past_key_values=cache)
        step = torch.cat([mask, torch.ones(4, 1, dtype=mask.dtype)], -1)
        step[3, -5] = 0  # hides a token the cache judged as real
        with pytest.raises(NotImplementedError, match="hides .* earlier tokens per row, the padding is"):
            model(ids[:, -1:], attention_mask=step, past_key_values=cache)
        padded = int((mask == 0).sum(-1).argmax())
        assert int((mask[padded] == 0).sum()) >= 2
        fewer = torch.ones(4, mask.shape[1] + 1, dtype=mask.dtype)  # shows every row's padding: allowed...
        fewer[padded, -5] = 0  # ...but then hides one real token of a padded row, fewer than its padding
        with pytest.raises(NotImplementedError, match="hides .* earlier tokens per row, the padding is"):
            model(ids[:, -1:], attention_mask=fewer, past_key_values=cache)


def test_full_attention_mask_is_accepted(model):
    """An all-ones mask is no padding: same cache and ratios as passing no mask."""
    ids = torch.randint(4, 400, (2, 24), generator=torch.Generator().manual_seed(0))
    ratios = []
    for kwargs in ({}, {"attention_mask": torch.ones_like(ids)}):
        press = KVzapPress(_scorer(), 0.0, 4)
        with press(model):
            model(ids, past_key_values=DynamicCache(), **kwargs)
        ratios.append(press.sample_ratios)
    assert torch.equal(ratios[0], ratios[1]) and bool((ratios[0] > 0).all())
