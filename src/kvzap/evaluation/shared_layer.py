"""A prefill group's decode reads its cells' kept entries through masks over the one prefill they were chosen from.

Every cell of a prefill group keeps a subset of the same prefill's keys and values (kvzap.evaluation.shared_prefill).
Stored apart, one packed row per cell and kv-head (`PrunedLayer.from_rows`), a decoding step reads each cell's kept
entries on its own: for n cells, n reads of up to the whole prefill, in small matmuls whose fixed cost dominates
(measured on a 4k RULER row, SmolLM2-135M, 13 cells, one AVX2 thread: 0.45 s a step, as much as 19 prefill tokens).
`SharedPrefillLayer` keeps the prefill once per sample, with a (cells, heads, tokens) mask of what each cell kept:
one batched matmul per sample serves all of its cells, and a dropped entry gets weight 0 as in kvpress's masking
presses, so the answers are the per-cell path's (tests/test_shared_prefill.py). The memory a cell would hold is
counted from its kept entries (`KeptCell.kv_bytes`), not from this layer.

The mask is found from the kept entries themselves: a press gathers the entries it keeps (copies, in any order), so
each kept key and value equals the prefill's at one position, and a key carries its position (RoPE). `kept_mask`
finds every position by value and checks the copies bit for bit; a press whose kept entries are not copies (one
that re-rotates or merges keys) gets None, and its group decodes from packed rows instead.
"""

from __future__ import annotations

import math

import torch

from kvzap.evaluation.attention_record import SHARED_KERNEL
from kvzap.pruning.cache import JudgedLayer
from kvzap.pruning.segments import SERVED

# Elements of one float32 score block of a group's queries (64 MiB): a long question over a long prefill, many
# cells at once, goes in blocks of queries that stay within it.
SCORE_BLOCK = 1 << 24


def kept_masks(keys: torch.Tensor, values: torch.Tensor, cells: list) -> torch.Tensor | None:
    """(C, H, T) bool: which of the prefill's (H, T, D) entries each cell kept, from each cell's per-head kept (n_h, D)
    keys and values (a `KeptLayer`); None where one is not a copy of a prefill entry, or where two prefill entries
    are equal (a copy could be either)."""
    heads, length, dim = keys.shape
    probe = torch.randn(dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(keys.device)
    masks = torch.zeros(len(cells), heads, length, dtype=torch.bool, device=keys.device)
    for h in range(heads):
        signature = (keys[h].double() * probe).sum(-1)  # one value per position; equal rows give equal values
        order = signature.argsort()
        ranked = signature[order]
        if bool((ranked[1:] == ranked[:-1]).any()):
            return None
        for c, cell in enumerate(cells):
            found = (cell.keys[h].double() * probe).sum(-1)
            positions = order[torch.searchsorted(ranked, found).clamp(max=length - 1)]
            copies = torch.equal(keys[h, positions], cell.keys[h]) and torch.equal(values[h, positions], cell.values[h])
            if not copies:
                return None
            masks[c, h, positions] = True
    return masks


class SharedPrefillLayer(JudgedLayer):
    """Rows samples x cells: each sample's prefill keys and values (H, T_s, D) once, each row's (H, T_s) mask of the
    entries its cell kept, and every row's new tokens in the window (never judged: no press runs while a group
    decodes). Samples shorter than the longest count as left padding (`pads`), as in `PrunedLayer.from_rows`."""

    def __init__(self, groups: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], seen: int):
        """groups: per sample, its keys and values (H, T_s, D) and its cells' masks (C_s, H, T_s)."""
        first_keys = groups[0][0]
        heads, dim = first_keys.shape[0], first_keys.shape[-1]
        batch = sum(mask.shape[0] for _, _, mask in groups)
        empty = first_keys.new_empty(batch, heads, 0, dim)
        pads = [seen - keys.shape[1] for keys, _, mask in groups for _ in range(mask.shape[0])]
        super().__init__(empty, empty.clone(), pads)
        self.groups = groups
        self.seen = seen

    @property
    def removed(self) -> torch.Tensor:
        kept = torch.cat([mask.sum(-1) for _, _, mask in self.groups])  # (B, H)
        own = torch.tensor([keys.shape[1] for keys, _, mask in self.groups for _ in range(mask.shape[0])])
        return own.to(kept.device)[:, None] - kept

    def _attend(self, q, new_mask, scaling, padded):
        batch, heads, queries, dim = q.shape
        if not torch.compiler.is_compiling():
            SERVED[SHARED_KERNEL] += 1  # counted as the segment kernels are
        q = q * scaling
        out = torch.empty_like(q)
        first = 0
        for keys, values, kept in self.groups:
            rows = slice(first, first + kept.shape[0])
            mask = None if new_mask is None else new_mask[rows] if new_mask.shape[0] > 1 else new_mask
            width = keys.shape[1] + self.window_len
            block = max(1, SCORE_BLOCK // (kept.shape[0] * heads * width))
            for start in range(0, queries, block):
                part = slice(start, start + block)
                out[rows, :, part] = self._attend_sample(
                    q[rows, :, part], keys, values, kept, rows, None if mask is None else mask[:, :, part]
                )
            first += kept.shape[0]
        return out

    def _attend_sample(self, q, keys, values, kept, rows, new_mask):
        """One sample's C rows: (C, H, Q, D) queries over its prefill, as each cell's mask leaves it, and each
        row's window, in one softmax."""
        cells, heads, queries, dim = q.shape
        length = keys.shape[1]
        per_head = q.transpose(0, 1).reshape(heads, cells * queries, dim)  # every cell's queries of a kv-head
        shared = (per_head @ keys.transpose(1, 2)).view(heads, cells, queries, length).transpose(0, 1)
        window_keys, window_values = self.dense_keys[rows], self.dense_values[rows]
        scores = torch.cat([shared, q @ window_keys.transpose(-1, -2)], -1).float()  # (C, H, Q, T_s + W)
        scores[..., :length].masked_fill_(~kept[:, :, None, :], -math.inf)
        if new_mask is not None:
            scores[..., scores.shape[-1] - new_mask.shape[-1] :].masked_fill_(~new_mask, -math.inf)
        p = torch.softmax(scores, -1).to(q.dtype)
        if new_mask is not None:
            p.nan_to_num_(0.0)  # a padding query sees nothing: output 0, as sdpa gives
        weights = p[..., :length].transpose(0, 1).reshape(heads, cells * queries, length)
        out = (weights @ values).view(heads, cells, queries, dim).transpose(0, 1)
        return out + p[..., length:] @ window_values

    @property
    def nbytes(self) -> int:
        """Bytes held: each sample's prefill once, the masks and the window."""
        shared = sum(k.nbytes + v.nbytes + m.nbytes for k, v, m in self.groups)
        return shared + self._keys.nbytes + self._values.nbytes + self._scores.nbytes
