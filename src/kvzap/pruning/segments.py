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

# Rows share a matmul only while their block has at most this many scores: a shared block scores each row's
# queries against every row's slots (masking the others'), wasting (n - 1) / n of its work, which pays only
# where the per-op cost dominates (short rows, decoding); longer rows go one by one, over their own slots.
ROW_BLOCK = 1 << 15


def plan_blocks(capacity: list[int], window: int, queries: int, budget: int) -> Iterator[tuple[int, int, int, int]]:
    """(first row, end row, first query, end query) chunks whose score matrix has at most `budget` elements.

    A block of rows r0..r1 scores every query of those rows against the block's slab of slots and the
    window: (r1 - r0) * queries * (slab + window) elements. Rows join a block while that fits in the budget
    and in ROW_BLOCK; a single row
    that does not fit alone is split by queries (at least one query per chunk, so a budget smaller than one
    row of scores is exceeded by that one row, never more).
    """
    r0 = 0
    while r0 < len(capacity):
        r1, slab = r0 + 1, capacity[r0]
        while (r1 < len(capacity)
               and (r1 + 1 - r0) * queries * (slab + capacity[r1] + window) <= min(budget, ROW_BLOCK)):
            slab += capacity[r1]
            r1 += 1
        step = queries if r1 - r0 > 1 else max(1, budget // max(1, slab + window))
        for q0 in range(0, queries, step):
            yield r0, r1, q0, min(q0 + step, queries)
        r0 = r1


def segment_attention(q, packed_keys, packed_values, owner, starts: list[int], capacities: list[int],
                      lengths: list[int], window_keys, window_values, new_mask, heads: int, budget: int,
                      fused: bool | None = None) -> torch.Tensor:
    """Exact softmax attention of each row's queries over its packed segment and its window.

    q (R, Q, D), already scaled, R = B * H rows, Q = G * T queries per row (a GQA group's heads together);
    packed_* (slots, D) with owner (slots,) naming each slot's row (-1: spare) and row r owning slots
    [starts[r], starts[r] + capacities[r]), the first lengths[r] used (lists: no device read per call);
    window_* (R, W, D); new_mask (B|1, 1, Q, T) bool over the T newest window tokens, or None. Scores are float32 (as in the masking reference).
    fused: the flash-kernel path for causal multi-token forwards (None: on CPU). Returns (R, Q, D).
    """
    rows, queries, _ = q.shape
    window = window_keys.shape[1]
    if (q.device.type == "cpu" if fused is None else fused) and _is_causal(new_mask, queries):
        return _flash_rows(q, packed_keys, packed_values, starts, lengths, window_keys, window_values,
                           new_mask.shape[-1])
    out = torch.empty_like(q)
    for r0, r1, q0, q1 in plan_blocks(capacities, window, queries, budget):
        first = starts[r0]
        block_q = q[r0:r1, q0:q1]  # (n, m, D)
        if r1 - r0 == 1:  # the row's used slots only: nothing to mask
            end = first + lengths[r0]
            packed_scores = (block_q @ packed_keys[first:end].T).float()  # (1, m, length)
        else:
            end = starts[r1 - 1] + capacities[r1 - 1]
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


def _is_causal(new_mask: torch.Tensor | None, queries: int) -> bool:
    """Whether each of the G query heads' T queries sees exactly the new tokens up to itself."""
    if new_mask is None:
        return False  # a single new token: the row-block path serves decoding steps
    new = new_mask.shape[-1]
    tril = torch.ones(new, new, dtype=torch.bool, device=new_mask.device).tril()
    return bool((new_mask.view(-1, queries // new, new, new) == tril).all())


def _flash(q, k, v, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(1, h, m, D) attention (q pre-scaled) -> output (1, h, m, D), float32 log-sum-exp (1, h, m)."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=1.0)[:2]
    return out, lse


def _flash_rows(q, packed_keys, packed_values, starts, lengths, window_keys, window_values, new):
    """Row by row: flash attention over [kept slots, older window] (all visible) and over the `new` newest
    window tokens (causal per query head), combined exactly through the two log-sum-exps."""
    rows, queries, dim = q.shape
    group, old = queries // new, window_keys.shape[1] - new
    out = torch.empty_like(q)
    for r in range(rows):
        kept = slice(starts[r], starts[r] + lengths[r])
        own, own_lse = _flash(q[r].view(1, group, new, dim), window_keys[r, old:].expand(1, group, new, dim),
                              window_values[r, old:].expand(1, group, new, dim), causal=True)
        own, own_lse = own.reshape(queries, dim), own_lse.reshape(queries, 1)
        if lengths[r] + old == 0:
            out[r] = own
            continue
        keys = torch.cat([packed_keys[kept], window_keys[r, :old]])[None, None]
        values = torch.cat([packed_values[kept], window_values[r, :old]])[None, None]
        past, past_lse = _flash(q[r][None, None], keys, values, causal=False)
        past, past_lse = past[0, 0], past_lse[0, 0, :, None]
        total = torch.logaddexp(past_lse, own_lse)
        out[r] = (past.float() * (past_lse - total).exp() + own.float() * (own_lse - total).exp()).to(q.dtype)
    return out
