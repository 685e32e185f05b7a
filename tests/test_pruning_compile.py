"""A decoding step over a KVzap-pruned cache under torch.compile: one whole graph (no host read in judging,
compaction or attention while the rows have spare slots, which `reserve_room` makes ahead), and the eager
step's tokens and logits."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import DynamicCache

from kvzap.pruning import KVzapPress, PrunedLayer, reserve_room
from kvzap.pruning.cache import MIN_ROW_SLACK
from kvzap.pruning.segments import kernels_served
from tiny_pruning import WINDOW, pruning_model, random_tokens, scorer

PROMPT = 64


def _prompt(batch: str):
    """One row, or two with the second's first 10 tokens padding (left padding, as generate pads)."""
    if batch == "one":
        return random_tokens(PROMPT), None
    ids = torch.cat([random_tokens(PROMPT), random_tokens(PROMPT, seed=3)])
    mask = torch.ones_like(ids)
    mask[1, :10] = 0
    return ids, mask


def _greedy(model, surrogate, ids, mask, steps: int, compile_step=None, reserve: int = 0):
    """Prefill eagerly, then `steps` greedy decoding steps through `compile_step(step)` (or eagerly); reserve > 0:
    make room for that many steps before every that many (as docs/library.md shows)."""
    press = KVzapPress(scorer(surrogate), threshold=0.0, window=WINDOW, decoding=True)
    cache, tokens, logits = DynamicCache(), [], []
    with torch.no_grad(), press(model), kernels_served() as kernels:
        out = model(ids, attention_mask=mask, past_key_values=cache)

        def step(token, mask):
            return model(token, attention_mask=mask, past_key_values=cache).logits[:, -1]

        run = compile_step(step) if compile_step else step
        token = out.logits[:, -1:].argmax(-1)
        for i in range(steps):
            mask = None if mask is None else torch.cat([mask, torch.ones_like(token)], -1)
            if reserve and i % reserve == 0:
                reserve_room(cache, reserve)
            logits.append(run(token, mask))
            token = logits[-1].argmax(-1, keepdim=True)
            tokens.append(token)
    assert all(isinstance(layer, PrunedLayer) for layer in cache.layers)
    return torch.cat(tokens, -1), torch.stack(logits), press.compression_ratio, kernels


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("batch", ["one", "padded"])
def test_decoding_step_compiles_whole_and_decodes_as_eager(family, batch, surrogate):
    torch._dynamo.reset()
    model = pruning_model(family)
    ids, mask = _prompt(batch)
    steps = MIN_ROW_SLACK  # the prefill's verdict leaves every row at least this many spare slots
    # fullgraph=True raises at the first graph break; aot_eager also checks the in-place cache writes as traced
    whole = lambda step: torch.compile(step, fullgraph=True, backend="aot_eager")
    compiled, compiled_logits, compiled_ratio, kernels = _greedy(model, surrogate, ids, mask, steps, whole)
    eager, eager_logits, eager_ratio, eager_kernels = _greedy(model, surrogate, ids, mask, steps)
    assert torch.equal(compiled, eager)
    assert (compiled_logits - eager_logits).abs().max() <= 1e-4
    assert compiled_ratio == eager_ratio > 0.2
    assert eager_kernels["decode"] == steps * model.config.num_hidden_layers  # the kernel the traced step runs
    assert kernels["decode"] == 0  # traced: not counted (a count would be a guard that recompiles every step)


def test_generation_through_growth_steps_equals_eager(surrogate):
    """Past the spare slots a row's segment may have to grow: that step reads the lengths (a graph break, once
    per MIN_ROW_SLACK steps or more), and the tokens stay the eager ones."""
    torch._dynamo.reset()
    counters.clear()
    model = pruning_model("llama")
    ids, mask = _prompt("one")
    steps = MIN_ROW_SLACK + 2  # past the first step that reads the lengths
    split = lambda step: torch.compile(step, backend="eager")
    compiled, _, compiled_ratio, _ = _greedy(model, surrogate, ids, mask, steps, split)
    assert sum(counters["graph_break"].values()) > 0  # a step read the lengths (the eager prefill is not traced)
    eager, _, eager_ratio, _ = _greedy(model, surrogate, ids, mask, steps)
    assert torch.equal(compiled, eager) and compiled_ratio == eager_ratio


def test_generation_compiles_whole_with_room_reserved_ahead(surrogate):
    """Room made ahead every 10 steps, outside the step: a generation past where rows would have grown (and past a
    re-pack that reserving made) runs through fullgraph=True (which raises at any graph break) and gives the eager
    tokens."""
    torch._dynamo.reset()
    model = pruning_model("llama")
    ids, mask = _prompt("padded")
    steps = 3 * MIN_ROW_SLACK + 1
    whole = lambda step: torch.compile(step, fullgraph=True, backend="eager")  # dynamo's graph, run eagerly
    compiled, compiled_logits, compiled_ratio, _ = _greedy(model, surrogate, ids, mask, steps, whole, reserve=10)
    eager, eager_logits, eager_ratio, _ = _greedy(model, surrogate, ids, mask, steps)
    assert torch.equal(compiled, eager)
    assert (compiled_logits - eager_logits).abs().max() <= 1e-4
    assert compiled_ratio == eager_ratio > 0.2


def test_reserve_makes_room_without_moving_what_rows_keep(surrogate):
    """reserve_room gives every row `steps` spare slots (a re-pack that keeps each row's entries in order) and
    refuses what it cannot serve by name."""
    model = pruning_model("llama")
    ids, _ = _prompt("one")
    cache = DynamicCache()
    with torch.no_grad(), KVzapPress(scorer(surrogate), threshold=0.0, window=WINDOW, decoding=True)(model):
        model(ids, past_key_values=cache)
    layer = cache.layers[0]
    before = [layer.packed_keys[s : s + n] for s, n in zip(layer.rows.starts, layer.rows.lengths)]
    reserve_room(cache, 50)
    assert layer.room >= 50
    assert all(c - n >= 50 for c, n in zip(layer.rows.capacities, layer.rows.lengths))
    after = [layer.packed_keys[s : s + n] for s, n in zip(layer.rows.starts, layer.rows.lengths)]
    assert all(torch.equal(a, b) for a, b in zip(after, before))
    capacities = layer.rows.capacities
    reserve_room(cache, 10)  # room enough already: nothing moves
    assert layer.rows.capacities == capacities
    with pytest.raises(ValueError, match="tokens must be an integer >= 0"):
        reserve_room(cache, -1)
    with pytest.raises(ValueError, match="run the prefill under the press first"):
        reserve_room(DynamicCache(), 8)


def _chunks(model, surrogate, ids, mask, chunks, compile_step=None):
    """Prefill eagerly, then feed `chunks` (each (B, T) ids) one forward each, through `compile_step(step)` with
    room made before each (outside the step), or eagerly; each chunk's leaving tokens are judged at once."""
    press = KVzapPress(scorer(surrogate), threshold=0.0, window=WINDOW, decoding=True)
    cache, logits = DynamicCache(), []
    with torch.no_grad(), press(model):
        model(ids, attention_mask=mask, past_key_values=cache)

        def step(chunk, mask):
            return model(chunk, attention_mask=mask, past_key_values=cache).logits

        run = compile_step(step) if compile_step else step
        for chunk in chunks:
            mask = None if mask is None else torch.cat([mask, torch.ones_like(chunk)], -1)
            if compile_step:
                reserve_room(cache, chunk.shape[1])
            logits.append(run(chunk, mask))
    return torch.cat(logits, 1), press.compression_ratio


def test_a_chunk_step_compiles_whole_and_equals_eager(surrogate):
    """Multi-token forwards over a pruned cache (a prefill's later chunks, a question after a context): causal
    attention over the kept rows and their windows, and the in-place verdict on each chunk's leaving tokens,
    one graph under fullgraph=True, the eager logits and ratio."""
    torch._dynamo.reset()
    model = pruning_model("qwen3")
    ids, mask = _prompt("padded")
    chunks = [random_tokens(12, seed=10 + i).expand(ids.shape[0], -1) for i in range(3)]
    whole = lambda step: torch.compile(step, fullgraph=True, backend="eager")  # dynamo's graph, run eagerly
    compiled, compiled_ratio = _chunks(model, surrogate, ids, mask, chunks, whole)
    eager, eager_ratio = _chunks(model, surrogate, ids, mask, chunks)
    assert (compiled - eager).abs().max() <= 1e-4
    assert compiled_ratio == eager_ratio > 0.2
