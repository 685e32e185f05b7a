"""A prefill group's decode through masks over its shared prefill (kvzap.evaluation.shared_layer), held to the
packed rows it replaces (`PrunedLayer.from_rows`, itself held to exact softmax attention in test_shared_prefill)."""

from __future__ import annotations

import pytest
import torch

from kvzap.evaluation import shared_layer
from kvzap.evaluation.shared_layer import SharedPrefillLayer, kept_masks
from kvzap.evaluation.shared_prefill import KeptCell, KeptLayer, Prefill, batched_cache
from kvzap.pruning.cache import PrunedLayer

HEADS, GROUP, DIM = 2, 3, 8


def _prefill(length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(HEADS, length, DIM, generator=generator), torch.randn(HEADS, length, DIM, generator=generator)


def _kept(keys, values, masks) -> KeptLayer:
    """What a press hands over: each head's kept entries, gathered in a shuffled order (order is not kept)."""
    chosen = [mask.nonzero().flatten() for mask in masks]
    chosen = [index[torch.randperm(len(index), generator=torch.Generator().manual_seed(7))] for index in chosen]
    return KeptLayer(
        [keys[h, i].clone() for h, i in enumerate(chosen)], [values[h, i].clone() for h, i in enumerate(chosen)]
    )


def test_each_cells_mask_is_found_from_its_kept_copies():
    keys, values = _prefill(50, 0)
    masks = (
        torch.rand(3, HEADS, 50, generator=torch.Generator().manual_seed(1))
        < torch.tensor([0.0, 0.4, 1.0])[:, None, None]
    )
    found = kept_masks(keys, values, [_kept(keys, values, m) for m in masks])
    assert torch.equal(found, masks)  # a cell keeping nothing, some, everything
    bent = _kept(keys, values, masks[1])
    bent.keys[0][0] += 1e-3  # a press that moved a key (re-rotated, merged): not a copy
    assert kept_masks(keys, values, [bent]) is None
    other_value = _kept(keys, values, masks[2])
    other_value.values[1][3] = values[1, 0]  # the right key with another position's value
    assert kept_masks(keys, values, [other_value]) is None
    twins = keys.clone()
    twins[0, 9] = twins[0, 4]  # two equal entries: a copy of one could be either
    assert kept_masks(twins, values, [_kept(twins, values, masks[2])]) is None


@pytest.mark.parametrize("block", [1 << 24, 40])  # one score block, or blocks of a few queries
def test_masks_over_shared_prefills_attend_as_packed_rows(block, monkeypatch):
    """Two samples of different lengths (the shorter left-padded), three cells each: a 4-token question chunk, then
    two single-token steps, give the packed rows' outputs."""
    monkeypatch.setattr(shared_layer, "SCORE_BLOCK", block)
    lengths, cells = (30, 44), 3
    seen = max(lengths)
    samples = [_prefill(n, seed) for seed, n in enumerate(lengths)]
    generator = torch.Generator().manual_seed(2)
    masks = [torch.rand(cells, HEADS, n, generator=generator) < 0.5 for n in lengths]
    masks[0][1] = False  # a cell that kept nothing of one sample
    shared = SharedPrefillLayer([(k, v, m) for (k, v), m in zip(samples, masks)], seen)
    rows = [_kept(k, v, cell) for (k, v), m in zip(samples, masks) for cell in m]
    pads = [seen - n for n in lengths for _ in range(cells)]
    packed = PrunedLayer.from_rows(
        [k for row in rows for k in row.keys], [v for row in rows for v in row.values], HEADS, seen, pads
    )
    assert torch.equal(shared.removed, packed.removed)
    batch = len(lengths) * cells
    for width in (4, 1, 1):
        new_k, new_v = torch.randn(batch, HEADS, width, DIM), torch.randn(batch, HEADS, width, DIM)
        shared.update(new_k, new_v)
        packed.update(new_k, new_v)
        query = torch.randn(batch, HEADS * GROUP, width, DIM)
        torch.testing.assert_close(
            shared.attend(query, None, DIM**-0.5), packed.attend(query, None, DIM**-0.5), rtol=1e-5, atol=1e-6
        )
    assert shared.get_seq_length() == packed.get_seq_length() == seen + 6


def test_a_cell_whose_entries_are_not_copies_decodes_from_packed_rows():
    keys, values = _prefill(20, 3)
    prefill = Prefill([], [keys[None], keys[None]], [values[None], values[None]], {}, 20)
    every = torch.ones(HEADS, 20, dtype=torch.bool)
    bent = _kept(keys, values, every)
    bent.keys[1][0] = bent.keys[1][0] * 2
    cells = [
        KeptCell([_kept(keys, values, every), _kept(keys, values, every)], 0.0),
        KeptCell([_kept(keys, values, every), bent], 0.0),
    ]
    cache = batched_cache([(prefill, cells)], HEADS)
    assert [type(layer) for layer in cache.layers] == [SharedPrefillLayer, PrunedLayer]
