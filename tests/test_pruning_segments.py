"""Segment attention over a pruned cache: exact (vs a per-row loop and vs masking), chunked within a budget."""

from __future__ import annotations

import functools
import math
import random

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from transformers import DynamicCache

from kvzap.pruning import KVzapPress, PrunedLayer
from kvzap.pruning import cache as cache_module
from kvzap.pruning.scorers import SurrogateScorerPress
from kvzap.pruning.segments import plan_blocks, segment_attention
from kvzap.surrogate import Surrogate
from tiny_models import tiny_model


@pytest.mark.parametrize("budget", [1, 50, 700, 10**9])
@pytest.mark.parametrize("queries", [1, 4, 37])
def test_plan_covers_each_row_and_query_once_within_budget(budget, queries):
    rng = random.Random(budget * 100 + queries)
    capacity, window = [rng.choice([0, 1, 5, 30, 90]) for _ in range(13)], 7
    covered = torch.zeros(len(capacity), queries, dtype=torch.int64)
    for r0, r1, q0, q1 in plan_blocks(capacity, window, queries, budget):
        covered[r0:r1, q0:q1] += 1
        elements = (r1 - r0) * (q1 - q0) * (sum(capacity[r0:r1]) + window)
        assert elements <= budget or (r1 - r0, q1 - q0) == (1, 1)  # one query of one row is the unit
    assert bool((covered == 1).all())


def test_short_steps_share_blocks_and_long_forwards_split():
    blocks = list(plan_blocks([100] * 8, 16, 4, budget=8 * 4 * (800 + 16)))
    assert blocks == [(0, 8, 0, 4)]  # a decoding step: all rows in one matmul
    blocks = list(plan_blocks([100] * 8, 16, 2048, budget=100_000))
    assert {(r1 - r0) for r0, r1, _, _ in blocks} == {1} and len(blocks) == 8 * math.ceil(2048 / (100_000 // 116))


def _per_row_reference(q, keys, values, owner, window_keys, window_values, new_mask, heads):
    """Row by row: gather the row's kept slots by owner, append its window, plain softmax attention."""
    rows, queries, _ = q.shape
    out = torch.empty_like(q)
    for r in range(rows):
        k = torch.cat([keys[owner == r], window_keys[r]])
        v = torch.cat([values[owner == r], window_values[r]])
        scores = q[r] @ k.T
        if new_mask is not None:
            visible = new_mask[r // heads if new_mask.shape[0] > 1 else 0, 0]  # (Q, T)
            scores[:, k.shape[0] - visible.shape[-1]:] = scores[:, k.shape[0] - visible.shape[-1]:].masked_fill(
                ~visible, -math.inf)
        out[r] = torch.softmax(scores, -1) @ v
    return out


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("causal_only", [False, True])
@pytest.mark.parametrize("budget", [1, 300, 10**9])
def test_segment_attention_equals_a_per_row_loop(budget, causal_only, fused):
    gen = torch.Generator().manual_seed(0)
    batch, heads, group, new, window, dim = 2, 3, 2, 5, 9, 8
    rows, lengths = batch * heads, [0, 7, 3, 20, 1, 11]
    capacity = torch.tensor([n + s for n, s in zip(lengths, [0, 2, 0, 4, 1, 3])])  # spare slots too
    start = capacity.cumsum(0) - capacity
    owner = torch.full((int(capacity.sum()),), -1, dtype=torch.int32)
    for r, n in enumerate(lengths):
        owner[int(start[r]):int(start[r]) + n] = r
    keys, values = torch.randn(owner.shape[0], dim, generator=gen), torch.randn(owner.shape[0], dim, generator=gen)
    keys[owner < 0] = 0  # as after a re-pack
    q = torch.randn(rows, group * new, dim, generator=gen)
    window_keys, window_values = torch.randn(2, rows, window, dim, generator=gen)
    causal = torch.ones(new, new, dtype=torch.bool).tril().repeat(group, 1)
    other = causal if causal_only else causal & torch.rand(group * new, new, generator=gen).gt(0.3) | torch.eye(
        new, dtype=torch.bool).repeat(group, 1)
    new_mask = torch.stack([causal, other])[:, None]  # (B, 1, Q, T), a different mask per batch row
    got = segment_attention(q, keys, values, owner, start.tolist(), capacity.tolist(), lengths, window_keys,
                            window_values, new_mask, heads, budget, fused=fused)
    expected = _per_row_reference(q, keys, values, owner, window_keys, window_values, new_mask, heads)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def _chunked_forward(model, press, ids, prompt_len, chunk):
    """Prefill, then feed the rest `chunk` tokens per forward (multi-token forwards over a pruned cache)."""
    cache, logits = DynamicCache(), []
    with press(model):
        logits.append(model(ids[:, :prompt_len], past_key_values=cache).logits)
        for t in range(prompt_len, ids.shape[1], chunk):
            logits.append(model(ids[:, t:t + chunk], past_key_values=cache).logits)
    return torch.cat(logits, 1), cache


@pytest.mark.parametrize("budget", [1, 400, None])
def test_multi_token_forwards_over_a_pruned_cache_equal_masking(budget, monkeypatch):
    if budget is not None:  # force row-by-row and query chunks (None: the default budget, one block)
        monkeypatch.setattr(PrunedLayer, "score_budget", lambda self: budget)
    torch.manual_seed(1)
    scorer = SurrogateScorerPress(surrogate=Surrogate(64, 2, 2))
    model = tiny_model("qwen3")
    ids = torch.randint(4, 400, (2, 120), generator=torch.Generator().manual_seed(2))  # two different rows
    runs = {evict: _chunked_forward(model, KVzapPress(scorer, threshold=0.0, window=8, decoding=True, evict=evict),
                                    ids, 60, 7)
            for evict in (True, False)}
    (evicted, cache), (masked, _) = runs[True], runs[False]
    lengths = cache.layers[0].length
    assert isinstance(cache.layers[0], PrunedLayer) and len(set(lengths.tolist())) > 1  # rows differ
    assert (evicted - masked).abs().max() <= 1e-4


def _largest_allocation(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max(event.cpu_memory_usage for event in prof.events())


# torch's CPU flash kernel holds fixed-size block buffers (query block x key block scores, per thread).
FLASH_WORKSPACE = 1 << 21


@pytest.mark.parametrize("fused", [False, True])
def test_no_tensor_outgrows_the_kept_cache(monkeypatch, fused):
    """A 256-token forward over 4 rows pruned to about half: the old one-matmul attention allocated
    (all queries) x (all slots) scores, 68 MB here; segment attention stays within the kept cache's size
    (the flash path: or within the kernel's fixed workspace)."""
    monkeypatch.setattr(cache_module, "MIN_SCORE_CHUNK", 1, raising=False)  # budget from the kept keys
    monkeypatch.setattr(cache_module, "segment_attention", functools.partial(segment_attention, fused=fused))
    gen = torch.Generator().manual_seed(3)
    heads, length, dim, group, new = 4, 2000, 16, 4, 256
    layer = PrunedLayer(*torch.randn(2, 1, heads, length, dim, generator=gen))
    layer.judge(length - 64, torch.rand(1, heads, length - 64, generator=gen) < 0.5)
    layer.update(*torch.randn(2, 1, heads, new, dim, generator=gen))
    query = torch.randn(1, heads * group, new, dim, generator=gen)
    largest = _largest_allocation(lambda: layer.attend(query, None, dim ** -0.5))
    workspace = FLASH_WORKSPACE if fused else 0
    assert largest <= max(query.nbytes, layer.packed_keys.nbytes + layer.packed_values.nbytes, workspace)
