"""Segment attention over a pruned cache: exact (vs a per-row loop and vs masking), chunked within a budget."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from transformers import DynamicCache

from kvzap.pruning import KVzapPress, PrunedLayer, segments
from kvzap.pruning import cache as cache_module
from kvzap.pruning.scorer_presses import SurrogateScorerPress
from kvzap.surrogate.model import Surrogate
from tiny_models import tiny_model
from varlen_reference import varlen_reference


def _per_row_reference(q, row_keys, row_values, window_keys, window_values, new_mask, heads):
    """Row by row: the row's kept keys followed by its window, plain softmax attention."""
    rows, queries, _ = q.shape
    out = torch.empty_like(q)
    for r in range(rows):
        k, v = torch.cat([row_keys[r], window_keys[r]]), torch.cat([row_values[r], window_values[r]])
        scores = q[r] @ k.T
        if new_mask is not None:
            visible = new_mask[r // heads if new_mask.shape[0] > 1 else 0, 0]  # (Q, T)
            scores[:, k.shape[0] - visible.shape[-1] :] = scores[:, k.shape[0] - visible.shape[-1] :].masked_fill(
                ~visible, -math.inf
            )
        out[r] = torch.softmax(scores, -1) @ v
    return out


# (kernel, mask): the flash kernels take causal masks (or a single new token), the decoding kernel and the row
# loop (the reference) any mask
CASES = [
    ("rows", "arbitrary"),
    ("rows", "causal"),
    ("rows", "single"),
    ("decode", "single"),
    ("decode", "causal"),
    ("decode", "arbitrary"),
    ("flash", "causal"),
    ("varlen", "causal"),
    ("varlen", "single"),
]

# What unused slots hold in these layouts: finite, as a PrunedLayer's are (zeros, or a dropped token), which the
# decoding kernel reads with weight 0; so large that a kernel giving them any weight is far off.
SPARE = 1e6


@pytest.mark.parametrize("kernel,mask", CASES)
@pytest.mark.parametrize("budget", [1, 300, 10**9])
def test_segment_attention_equals_a_per_row_loop(budget, kernel, mask, monkeypatch):
    monkeypatch.setattr(segments, "varlen_attn", varlen_reference)
    gen = torch.Generator().manual_seed(0)
    batch, heads, group, window, dim = 2, 3, 2, 9, 8
    new = 1 if mask == "single" else 5
    rows, lengths = batch * heads, [0, 7, 3, 20, 1, 11]
    capacity = [n + s for n, s in zip(lengths, [0, 2, 0, 4, 1, 3])]  # spare slots too
    row_keys, row_values = ([torch.randn(n, dim, generator=gen) for n in lengths] for _ in range(2))
    spare = [torch.full((c - n, dim), SPARE) for n, c in zip(lengths, capacity)]
    keys = torch.cat([t for pair in zip(row_keys, spare) for t in pair])
    values = torch.cat([t for pair in zip(row_values, spare) for t in pair])
    packed = segments.Packed(keys, values, segments.Rows.segments(torch.tensor(capacity), torch.tensor(lengths)))
    q = torch.randn(rows, group * new, dim, generator=gen)
    window_keys, window_values = torch.randn(2, rows, window, dim, generator=gen)
    causal = torch.ones(new, new, dtype=torch.bool).tril().repeat(group, 1)
    other = (
        causal
        if mask != "arbitrary"
        else causal & torch.rand(group * new, new, generator=gen).gt(0.3)
        | torch.eye(new, dtype=torch.bool).repeat(group, 1)
    )
    new_mask = None if mask == "single" else torch.stack([causal, other])[:, None]  # (B, 1, Q, T), per batch row
    got = segments.segment_attention(
        q, packed, segments.Window(window_keys, window_values, new_mask), heads, budget, kernel=kernel
    )
    expected = _per_row_reference(q, row_keys, row_values, window_keys, window_values, new_mask, heads)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def _random_packed(gen, lengths, spare, dim, lead=0):
    """A packed layout with `lead` unused slots in front and SPARE in every unused slot."""
    capacity = [n + s for n, s in zip(lengths, spare)]
    starts = [lead + sum(capacity[:r]) for r in range(len(lengths))]
    keys, values = (torch.full((lead + sum(capacity), dim), SPARE) for _ in range(2))
    for start, n in zip(starts, lengths):
        keys[start : start + n], values[start : start + n] = torch.randn(2, n, dim, generator=gen)
    rows = segments.Rows(torch.tensor(starts), torch.tensor(capacity), torch.tensor(lengths))
    return segments.Packed(keys, values, rows)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("window", [1, 17])  # at least the new token
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_kernel_equals_the_row_loop_on_random_layouts(seed, window, dtype):
    """The batched one-token kernel against the row loop: random lengths (empty rows, one row much longer
    than the rest), spare slots and a gap before the first row, one or several queries per row, small
    windows (never empty: a window holds the new token); in bfloat16 both compute scores in that dtype and
    softmax in float32, so they agree up to the rounding of the same products."""
    gen = torch.Generator().manual_seed(seed)
    rows, dim = int(torch.randint(1, 13, (1,), generator=gen)), 8
    lengths = torch.randint(0, 30, (rows,), generator=gen).tolist()
    lengths[0] = 0
    lengths[rows // 2] += 60
    packed = _random_packed(gen, lengths, torch.randint(0, 4, (rows,), generator=gen).tolist(), dim, lead=seed)
    packed = packed._replace(keys=packed.keys.to(dtype), values=packed.values.to(dtype))
    queries = int(torch.randint(1, 5, (1,), generator=gen))
    q = torch.randn(rows, queries, dim, generator=gen).to(dtype)
    window_keys, window_values = torch.randn(2, rows, window, dim, generator=gen).to(dtype)
    window = segments.Window(window_keys, window_values, None)
    got = segments.segment_attention(q, packed, window, 3, 10**9, kernel="decode")
    want = segments.segment_attention(q, packed, window, 3, 10**9, kernel="rows")
    assert got.dtype == dtype and got.shape == want.shape and not got.isnan().any()
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tolerance, rtol=tolerance)


def test_decode_kernel_serves_one_unmasked_token_on_cpu_and_restores_threads():
    q = torch.randn(4, 3, 8)
    assert segments.applicable_kernels(q, None) == ["decode"]
    causal = torch.ones(3, 3, dtype=torch.bool).tril()[None, None]
    assert segments.applicable_kernels(q, causal) == ["flash", "decode"]  # a causal chunk: flash first
    assert segments.applicable_kernels(q, ~causal) == ["decode"]  # the row loop serves none: it is the reference
    threads = torch.get_num_threads()
    packed = _random_packed(torch.Generator().manual_seed(0), [3, 0, 5, 2], [1, 0, 0, 2], 8)
    segments.segment_attention(q, packed, segments.Window(*torch.randn(2, 4, 2, 8), None), 2, 10**9)
    assert torch.get_num_threads() == threads


def test_decoding_under_eviction_with_the_decode_kernel_equals_masking():
    """Greedy decoding of a left-padded batch (padding leaves the window during the run, so steps go from
    the row loop to the decode kernel) under eviction equals masking, logits and all."""
    torch.manual_seed(1)
    scorer = SurrogateScorerPress(surrogate=Surrogate(64, 2, 2))
    model = tiny_model("qwen3")
    ids = torch.randint(4, 400, (3, 40), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :5], mask[2, :11] = 0, 0
    runs = {}
    for evict in (True, False):
        press = KVzapPress(scorer, threshold=0.0, window=8, decoding=True, evict=evict)
        with press(model):
            runs[evict] = model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=12,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=0,
            )
    assert torch.equal(runs[True].sequences, runs[False].sequences)
    assert (torch.stack(runs[True].logits) - torch.stack(runs[False].logits)).abs().max() <= 1e-4


@pytest.mark.parametrize("tokens", [1, 6])
def test_varlen_over_a_layer_with_nothing_judged_reads_only_the_window(tokens, monkeypatch):
    """A prompt within the window leaves no kept slots: the kernel is never handed an empty key set."""

    def kernel(query, key, value, *args, **kwargs):
        assert key.shape[0] > 0
        return varlen_reference(query, key, value, *args, **kwargs)

    monkeypatch.setattr(segments, "varlen_attn", kernel)
    gen = torch.Generator().manual_seed(5)
    layer = PrunedLayer(*torch.randn(2, 1, 2, 20, 16, generator=gen))
    assert layer.packed_keys.shape[0] == 0
    q = torch.randn(2, 3 * tokens, 16, generator=gen)
    causal = None if tokens == 1 else torch.ones(tokens, tokens, dtype=torch.bool).tril().repeat(3, 1)[None, None]
    window = segments.Window(layer.dense_keys.flatten(0, 1), layer.dense_values.flatten(0, 1), causal)
    got, want = (
        segments.segment_attention(q, layer.packed(), window, 2, layer.score_budget(), kernel=k)
        for k in ("varlen", "rows")
    )
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("broken", [False, True])
def test_a_varlen_kernel_that_disagrees_with_the_row_loop_stops_the_job_by_name(broken, monkeypatch):
    """The first use per (device, dtype, causal) compares the kernel with the row loop; a kernel whose causal
    window is aligned otherwise (here: ignored) raises KernelMismatch naming it and the fix, at every call (no
    silent fallback to the 12-15x slower loop), and the comparison is not run twice."""
    kernel = functools.partial(varlen_reference, causal_as_full=broken)
    monkeypatch.setattr(segments, "varlen_attn", kernel)
    monkeypatch.setattr(segments, "applicable_kernels", lambda q, mask: ["varlen", "rows"])
    monkeypatch.setattr(segments, "TRUSTED", {})
    gen = torch.Generator().manual_seed(4)
    layer = PrunedLayer(*torch.randn(2, 1, 2, 300, 16, generator=gen))
    layer.judge(300 - 128, torch.rand(1, 2, 300 - 128, generator=gen) < 0.5)
    q = torch.randn(2, 3 * 8, 16, generator=gen)
    causal = torch.ones(8, 8, dtype=torch.bool).tril().repeat(3, 1)[None, None]
    window = segments.Window(layer.dense_keys.flatten(0, 1), layer.dense_values.flatten(0, 1), causal)
    for _ in range(2):  # the second call reads the remembered comparison
        with segments.kernels_served() as served:
            if broken:
                with pytest.raises(segments.KernelMismatch, match="'varlen'.*Fix: .*float32"):
                    segments.segment_attention(q, layer.packed(), window, 2, layer.score_budget())
            else:
                segments.segment_attention(q, layer.packed(), window, 2, layer.score_budget())
        assert served == ({} if broken else {"varlen": 1})
        monkeypatch.setattr(segments, "float32_rows", None)  # a second check would call it
    assert list(segments.TRUSTED) == [("cpu", torch.float32, True)]


def _chunked_forward(model, press, ids, prompt_len, chunk):
    """Prefill, then feed the rest `chunk` tokens per forward (multi-token forwards over a pruned cache)."""
    cache, logits = DynamicCache(), []
    with press(model):
        logits.append(model(ids[:, :prompt_len], past_key_values=cache).logits)
        for t in range(prompt_len, ids.shape[1], chunk):
            logits.append(model(ids[:, t : t + chunk], past_key_values=cache).logits)
    return torch.cat(logits, 1), cache


@pytest.mark.parametrize("budget", [1, 400, None])
def test_multi_token_forwards_over_a_pruned_cache_equal_masking(budget, monkeypatch):
    if budget is not None:  # force query chunks (None: the default budget)
        monkeypatch.setattr(PrunedLayer, "score_budget", lambda self: budget)
    torch.manual_seed(1)
    scorer = SurrogateScorerPress(surrogate=Surrogate(64, 2, 2))
    model = tiny_model("qwen3")
    ids = torch.randint(4, 400, (2, 120), generator=torch.Generator().manual_seed(2))  # two different rows
    runs = {
        evict: _chunked_forward(
            model, KVzapPress(scorer, threshold=0.0, window=8, decoding=True, evict=evict), ids, 60, 7
        )
        for evict in (True, False)
    }
    (evicted, cache), (masked, _) = runs[True], runs[False]
    lengths = cache.layers[0].rows.length
    assert isinstance(cache.layers[0], PrunedLayer) and len(set(lengths.tolist())) > 1  # rows differ
    assert (evicted - masked).abs().max() <= 1e-4


def _largest_allocation(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max(event.cpu_memory_usage for event in prof.events())


# torch's CPU flash kernel holds fixed-size block buffers (query block x key block scores, per thread).
FLASH_WORKSPACE = 1 << 21


@pytest.mark.parametrize("kernel", ["rows", "flash", "decode"])
def test_no_tensor_outgrows_the_kept_cache(monkeypatch, kernel):
    """A 256-token forward over 4 rows pruned to about half: the old one-matmul attention allocated
    (all queries) x (all slots) scores, 68 MB here; segment attention stays within the kept cache's size
    (the flash path: or within the kernel's fixed workspace)."""
    monkeypatch.setattr(cache_module, "MIN_SCORE_CHUNK", 1, raising=False)  # budget from the kept keys
    monkeypatch.setattr(cache_module, "segment_attention", functools.partial(segments.segment_attention, kernel=kernel))
    gen = torch.Generator().manual_seed(3)
    heads, length, dim, group, new = 4, 2000, 16, 4, 256
    layer = PrunedLayer(*torch.randn(2, 1, heads, length, dim, generator=gen))
    layer.judge(length - 64, torch.rand(1, heads, length - 64, generator=gen) < 0.5)
    layer.update(*torch.randn(2, 1, heads, new, dim, generator=gen))
    query = torch.randn(1, heads * group, new, dim, generator=gen)
    largest = _largest_allocation(lambda: layer.attend(query, None, dim**-0.5))
    workspace = FLASH_WORKSPACE if kernel == "flash" else 0
    assert largest <= max(query.nbytes, layer.packed_keys.nbytes + layer.packed_values.nbytes, workspace)
