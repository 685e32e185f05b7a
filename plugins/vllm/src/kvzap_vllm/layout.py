"""Where a token's entry sits inside a block: attention kernels pack their blocks in ISA-specific layouts (vLLM's CPU
backend passes the ISA, e.g. AMX, to its cache write), so the compaction does not assume one. It asks the layer's own
cache write: a probe writes each token's index, then each element's index, into a scratch block, and reads back which
element of the block's memory holds which (token, key/value, dimension). Values stay below 257, exact in bf16."""

from __future__ import annotations

import torch


def entry_offsets(layer: torch.nn.Module, block: torch.Tensor) -> torch.Tensor:
    """(block_size, 2 * head_dim) offsets into a flattened (head's) block of `block`'s shape (1, H, ...): a token
    slot's key elements, then its value elements, in dimension order. Raises if heads share memory or a token's
    entry is not 2 * head_dim elements of every head's block."""
    scratch = torch.zeros_like(block)
    heads, size = scratch.shape[1], scratch[0, 0].numel()
    head_dim = layer.impl.head_size
    block_size = size // (2 * head_dim)
    slots = torch.arange(block_size)

    def write(key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        scratch.zero_()
        layer.impl.do_kv_cache_update(layer, key.to(scratch.dtype), value.to(scratch.dtype), scratch, slots)
        return scratch.reshape(heads, size).float().clone()

    ones = torch.ones(block_size, heads, head_dim)
    token = write(ones * (slots + 1.0)[:, None, None], ones * (slots + 1.0)[:, None, None]) - 1
    dims = (torch.arange(head_dim) + 1.0).expand(block_size, heads, head_dim)
    element = write(dims, -dims)  # key dimension d as d + 1, value dimension d as -(d + 1)
    if not (torch.equal(token, token[:1].expand_as(token)) and torch.equal(element, element[:1].expand_as(element))):
        raise ValueError("KVzap: this attention backend's blocks interleave KV heads; the compaction cannot move them.")
    component = torch.where(element[0] > 0, element[0] - 1, head_dim - element[0] - 1)  # keys 0..d-1, values d..2d-1
    index = token[0] * 2 * head_dim + component
    if token[0].min() < 0 or not torch.equal(index.sort().values, torch.arange(size, dtype=index.dtype)):
        raise ValueError("KVzap: this attention backend's block layout is not one entry per token slot.")
    offsets = torch.empty(size, dtype=torch.long)
    offsets[index.long()] = torch.arange(size)
    return offsets.view(block_size, 2 * head_dim)
