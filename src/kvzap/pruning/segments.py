"""Segment ("varlen") attention over a packed cache: each (batch, kv-head) row is its own key sequence.

A row's GQA query heads score only its own slots plus its dense window, so the work and the transient
memory follow what is kept rather than (all queries) x (all rows' slots). Rows are contiguous segments of
the packed buffer, so a block of consecutive rows is one slice (no copy): decoding steps run many rows per
matmul (other rows' slots masked, cheap for few queries), long forwards go row by row and, where one
row's scores would still exceed the budget, a chunk of queries at a time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch


def plan_blocks(capacity: list[int], window: int, queries: int, budget: int) -> Iterator[tuple[int, int, int, int]]:
    """(first row, end row, first query, end query) chunks whose score matrix has at most `budget` elements.

    A block of rows r0..r1 scores every query of those rows against the block's slab of slots and the
    window: (r1 - r0) * queries * (slab + window) elements. Rows join a block while that fits; a single row
    that does not fit alone is split by queries (at least one query per chunk, so a budget smaller than one
    row of scores is exceeded by that one row, never more).
    """
    r0 = 0
    while r0 < len(capacity):
        r1, slab = r0 + 1, capacity[r0]
        while r1 < len(capacity) and (r1 + 1 - r0) * queries * (slab + capacity[r1] + window) <= budget:
            slab += capacity[r1]
            r1 += 1
        step = queries if r1 - r0 > 1 else max(1, budget // max(1, slab + window))
        for q0 in range(0, queries, step):
            yield r0, r1, q0, min(q0 + step, queries)
        r0 = r1


def segment_attention(q, packed_keys, packed_values, owner, start, capacity, window_keys, window_values,
                      new_mask, heads: int, budget: int) -> torch.Tensor:
    """Exact softmax attention of each row's queries over its packed segment and its window.

    q (R, Q, D), already scaled, R = B * H rows, Q = G * T queries per row (a GQA group's heads together);
    packed_* (slots, D) with owner (slots,) naming each slot's row (-1: spare) and row r owning slots
    [start[r], start[r] + capacity[r]); window_* (R, W, D); new_mask (B|1, 1, Q, T) bool over the T newest
    window tokens, or None. Scores are float32 (as in the masking reference). Returns (R, Q, D).
    """
    rows, queries, _ = q.shape
    window = window_keys.shape[1]
    out = torch.empty_like(q)
    starts, capacities = start.tolist(), capacity.tolist()
    for r0, r1, q0, q1 in plan_blocks(capacities, window, queries, budget):
        first, end = starts[r0], starts[r1 - 1] + capacities[r1 - 1]
        block_q = q[r0:r1, q0:q1]  # (n, m, D)
        packed_scores = (block_q @ packed_keys[first:end].T).float()  # (n, m, slab)
        row_ids = torch.arange(r0, r1, device=q.device, dtype=owner.dtype)
        packed_scores.masked_fill_(owner[None, None, first:end] != row_ids[:, None, None], -math.inf)
        window_scores = (block_q @ window_keys[r0:r1].transpose(-1, -2)).float()  # (n, m, W)
        if new_mask is not None:
            visible = new_mask[:, 0, q0:q1]  # (B|1, m, T)
            if visible.shape[0] > 1:
                visible = visible[torch.arange(r0, r1, device=q.device) // heads]
            window_scores[..., window - visible.shape[-1]:].masked_fill_(~visible, -math.inf)
        p = torch.softmax(torch.cat([packed_scores, window_scores], -1), -1).to(q.dtype)
        slab = end - first
        out[r0:r1, q0:q1] = p[..., :slab] @ packed_values[first:end] + p[..., slab:] @ window_values[r0:r1]
    return out
