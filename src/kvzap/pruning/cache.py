"""Cache layers whose (batch, kv-head) rows hold different numbers of tokens.

Every layer keeps the unjudged recent tokens (the window) dense, with a score per (batch, kv-head, token);
a press judges the oldest window tokens once and the layer stores the verdict:
- `PrunedLayer` (physical eviction): kept tokens move to a packed buffer (a segment per row), dropped ones
  are freed, so held bytes follow the kept count, not the sequence length.
- `MaskedLayer` (the kvpress way, our reference): everything stays dense and dropped tokens are masked.
Both attend exactly (every query head of a GQA group sees its kv-head's row) through `attend`, which the
"kvzap" attention function calls; `get_seq_length` is the unpruned length, so RoPE positions continue from it.

Padded batches: row b's first `pads[b]` positions are padding (left padding; a right-padded prefill is moved
into that layout, `left_layout`). Padding is hidden from every query, dropped when it leaves the window, never
stored in the packed buffer and never counted: ratios are over each row's own tokens (`removed_fraction`).
"""

from __future__ import annotations

import math

import torch
from transformers.cache_utils import CacheLayerMixin

from kvzap.pruning.segments import Packed, Rows, Window, segment_attention
from kvzap.pruning.sliding import SlidingBuffer

# Spare slots a packed row gets when it grows again (decoding): a share of what it keeps (at least MIN_ROW_SLACK),
# so unused bytes stay a few percent of the kept cache, and re-packs (each a copy of the layer) come once per that
# many kept tokens: amortized constant work per token, as in a growing array.
ROW_SLACK = 1 / 16
MIN_ROW_SLACK = 8
# Smallest score chunk (float32 elements, 4 MiB): below it, more chunks only cost Python overhead.
MIN_SCORE_CHUNK = 1 << 20


class _Crop:
    """What `layer.keys[:, :, :n]` returns: kvpress's pipeline assigns it back to drop the answer tokens."""

    def __init__(self, layer: JudgedLayer):
        self.layer = layer
        self.length = None

    def __getitem__(self, index):
        if not (isinstance(index, tuple) and len(index) == 3 and index[2].start is None and index[2].step is None):
            raise TypeError("A pruned cache layer only supports `layer.keys[:, :, :n]` (truncation to n tokens).")
        crop = _Crop(self.layer)
        crop.length = index[2].stop
        return crop


class JudgedLayer(CacheLayerMixin):
    """Shared bookkeeping: unpruned length, window scores (+inf = never judged); subclasses count what they
    removed per row (`removed`)."""

    is_sliding = False

    def __init__(self, window_keys: torch.Tensor, window_values: torch.Tensor, pads: list[int] | None = None):
        # No super().__init__(): `keys`/`values` are the truncation views below, not dense tensors.
        batch, heads, length, _ = window_keys.shape
        window_keys, window_values = window_keys.detach(), window_values.detach()  # cache state, not a graph
        self.is_initialized = True
        self.dtype, self.device = window_keys.dtype, window_keys.device
        self.seen = length  # tokens ever appended: the unpruned length
        # (B, H, window or seen, D) and (B, H, window): appended every step, consumed from the front
        self._keys, self._values = SlidingBuffer(window_keys, -2), SlidingBuffer(window_values, -2)
        self._scores = SlidingBuffer(torch.full((batch, heads, length), math.inf, device=self.device), -1)
        self._set_pads([0] * batch if pads is None else list(pads))

    def _set_pads(self, pads: list[int]) -> None:
        """Padding per row, as a host list (read per step without a device sync) and a (B,) tensor."""
        self.pads = pads
        self.pad_counts = torch.tensor(pads, device=self.device)

    def window_pads(self) -> list[int]:
        """Padding entries at the front of each row's window."""
        first = self.seen - self.window_len
        return [min(max(p - first, 0), self.window_len) for p in self.pads]

    def note_padding(self, attention_mask: torch.Tensor | None) -> None:
        """After a forward, take the padding among its new tokens from its (B, 1, T, seen) mask: a row may
        only gain padding while it holds nothing else (a chunked prefill of a left-padded batch)."""
        if attention_mask is None:
            return
        pads = hidden_counts(attention_mask).tolist()
        seen_before = self.seen - attention_mask.shape[-2]
        for row, (old, new) in enumerate(zip(self.pads, pads)):
            if new != old and not (new > old and old >= seen_before):
                raise NotImplementedError(f"{MASK_ERROR} (row {row} hides {new} tokens, {old} of them padding)")
        if pads != self.pads:
            self._mark_padding(self.pads, pads)
            self._set_pads(pads)

    def _mark_padding(self, old: list[int], new: list[int]) -> None:
        """Layers that mask in place (MaskedLayer) record newly arrived padding."""

    @property
    def dense_keys(self) -> torch.Tensor:
        return self._keys.data

    @property
    def dense_values(self) -> torch.Tensor:
        return self._values.data

    @property
    def scores(self) -> torch.Tensor:
        """(B, H, window) scores of the unjudged tokens (+inf until scored)."""
        return self._scores.data

    # kvpress pipeline compatibility: `layer.keys = layer.keys[:, :, :n]` crops to n tokens.
    @property
    def keys(self) -> _Crop:
        return _Crop(self)

    @keys.setter
    def keys(self, crop: _Crop) -> None:
        if not isinstance(crop, _Crop):
            raise TypeError("A pruned cache layer holds no dense keys; use crop(n) to truncate it.")
        self.crop(crop.length)

    values = keys

    def lazy_initialization(self, key_states, value_states) -> None:
        """Created from a filled dense layer, so never lazily."""

    @property
    def window_len(self) -> int:
        return self.scores.shape[-1]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, cache_kwargs=None):
        """Append new tokens (B, H, T, D) to the window, unscored; the attention function reads the layer itself."""
        self._append(key_states.detach(), value_states.detach())
        self._scores.append(torch.full(key_states.shape[:3], math.inf, device=self.device))
        self.seen += key_states.shape[2]
        return self, self

    def set_scores(self, scores: torch.Tensor) -> None:
        """Scores (B, H, T) of the T newest tokens, so the press can judge them when they leave the window."""
        self._scores.newest(scores.shape[-1]).copy_(scores)

    def judge(self, n: int, keep: torch.Tensor) -> None:
        """Settle the n oldest window tokens: keep (B, H, n) bool says which survive."""
        self._settle(n, keep)
        self._scores.drop_front(n)

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, cache_position: torch.Tensor) -> tuple[int, int]:
        return self.seen + cache_position.shape[0], 0

    def get_max_cache_shape(self) -> int:
        return -1

    def reset(self) -> None:
        raise NotImplementedError("A pruned cache cannot be reused: create a new cache for a new prompt.")

    def reorder_cache(self, beam_idx) -> None:
        raise NotImplementedError("Beam search is not supported with a pruned cache; use greedy or sampling.")

    batch_repeat_interleave = batch_select_indices = reorder_cache

    def crop(self, max_length: int) -> None:
        """Drop every token at position >= max_length (they must still be in the window, i.e. unjudged)."""
        if max_length < 0:
            max_length = self.seen + max_length
        n_drop = self.seen - max_length
        if n_drop <= 0:
            return
        if n_drop > self.window_len:
            raise ValueError(f"Cannot crop {n_drop} tokens: only the {self.window_len} unjudged ones can be removed.")
        self._drop_newest(n_drop)
        self._scores.drop_back(n_drop)
        self.seen = max_length

    def attend(self, query: torch.Tensor, attention_mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
        """query (B, Hq, T, D) of the T newest tokens -> attention output (B, T, Hq, D)."""
        batch, q_heads, length, dim = query.shape
        heads = self.scores.shape[1]
        group = q_heads // heads
        if attention_mask is not None:
            self._check_past(attention_mask, length)
        holds_real = all(pad < self.seen - length for pad in self.pads)  # so a single new token is no padding
        new_mask = _new_token_mask(attention_mask, self.seen, length, query.device, holds_real)
        window_pads = self.window_pads()
        padded = any(window_pads)
        if padded:  # padding still in the window: a mask over the whole window
            new_mask = _window_mask(new_mask, window_pads, self.window_len, length, query.device)
        if new_mask is not None:
            new_mask = new_mask.repeat(1, 1, group, 1)  # (B|1, 1, G*T, m): the queries of a row's heads together

        def attend(query):
            q = query.reshape(batch, heads, group * length, dim)  # (B, H, G*T, D): a row's queries together
            out = self._attend(q, new_mask, scaling, padded)
            return out.view(batch, heads, group, length, dim).reshape(batch, q_heads, length, dim).transpose(1, 2)

        if query.requires_grad and torch.is_grad_enabled():
            return _WithoutBackward.apply(query, attend)
        return attend(query)

    def _check_past(self, attention_mask: torch.Tensor, length: int) -> None:
        """The mask may hide earlier tokens only where they are padding: judged entries are gone or packed. The
        layer hides its padding itself, so a row's mask may also hide nothing (one built without the padding)."""
        hidden = hidden_counts(attention_mask[..., : self.seen - length])
        padding = self.pad_counts.clamp(max=self.seen - length).to(hidden.device)
        fits = ((hidden == padding) | (hidden == 0)).all()
        if torch.compiler.is_compiling():  # checked on the device: a host read would break the compiled graph
            torch._assert_async(fits, f"{MASK_ERROR} (the padding is {self.pads})")
        elif not bool(fits):
            raise NotImplementedError(
                f"{MASK_ERROR} (it hides {hidden.tolist()} earlier tokens per row, the padding is {self.pads})"
            )

    def newest(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, H, length, D) of the newest tokens, for scorers that read them."""
        return self._keys.newest(length), self._values.newest(length)

    def _append(self, key_states, value_states):
        self._keys.append(key_states)
        self._values.append(value_states)

    def _drop_newest(self, n):
        self._keys.drop_back(n)
        self._values.drop_back(n)

    @property
    def removed(self) -> torch.Tensor:
        """(B, H) entries removed so far: a new tensor, so it stays a snapshot."""
        raise NotImplementedError

    def compression(self) -> torch.Tensor:
        return removed_fraction(self.removed, self.seen, self.pad_counts)

    def padding_judged(self) -> torch.Tensor:
        """(B, 1) padding entries among the judged (no longer in the window) ones."""
        return self.pad_counts.clamp(max=self.seen - self.window_len).view(-1, 1)


class _WithoutBackward(torch.autograd.Function):
    """Attention over a pruned layer when gradients are on: computed without autograd (the row loop writes its
    output in place), and a backward stops with this error instead of a gradient missing the cached entries,
    which the layer holds detached."""

    @staticmethod
    def forward(ctx, query, attend):
        return attend(query)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError(
            "No gradient flows through a pruned KV cache (its entries are held detached): run the forward "
            "without the press, or under torch.no_grad() / torch.inference_mode() if no gradient is needed."
        )


def removed_fraction(removed: torch.Tensor, seen: int, pads: torch.Tensor) -> torch.Tensor:
    """Fraction removed per (batch, kv-head), over each row's unpruned length without its padding (kvpress
    DMSPress's denominator)."""
    return removed.double() / (seen - pads.clamp(max=seen)).view(-1, 1)


MASK_ERROR = (
    "A pruned cache takes attention masks that hide padding only (left padding, or right padding in a "
    "prefill), not other tokens"
)


def visible(attention_mask: torch.Tensor) -> torch.Tensor:
    """An sdpa-style mask (bool: True = visible, or additive float: 0 = visible) as bool."""
    return attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0


def _hidden(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) bool: what a (B, 1, T, L) mask hides from each row's last query: under causal attention, its
    padding (a padding query itself sees nothing, so a row of padding so far is hidden whole)."""
    return ~visible(attention_mask)[:, 0, -1, :]


def hidden_counts(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B,) padding tokens per row (`_hidden`)."""
    return _hidden(attention_mask).sum(-1)


def prefill_padding(attention_mask: torch.Tensor | None) -> tuple[list[int], bool]:
    """A prefill's (B, 1, T, T) mask -> (padding per row, whether it is on the right). Hidden tokens must be a
    prefix of the row (left padding) or a suffix (right padding), the same side for every padded row."""
    if attention_mask is None:
        return [], False
    hidden = _hidden(attention_mask)  # (B, T)
    counts = hidden.sum(-1)
    if not bool(counts.any()):
        return [], False
    columns = torch.arange(hidden.shape[-1], device=hidden.device)
    for right, pattern in ((False, columns < counts[:, None]), (True, columns >= hidden.shape[-1] - counts[:, None])):
        if torch.equal(hidden, pattern):
            return counts.tolist(), right
    raise NotImplementedError(f"{MASK_ERROR}: its rows hide tokens that are neither a prefix nor a suffix.")


def left_layout(x: torch.Tensor, pads: list[int], dim: int) -> torch.Tensor:
    """Move each row's right padding (along `dim`, batch first) to its front: a right-padded prefill's keys,
    values and attention inputs in the layout the layers keep."""
    length = x.shape[dim]
    index = (torch.arange(length, device=x.device)[None] - torch.tensor(pads, device=x.device)[:, None]) % length
    shape = [1] * x.dim()
    shape[0], shape[dim] = x.shape[0], length
    return x.gather(dim, index.view(shape).expand_as(x))


def _new_token_mask(attention_mask, seen: int, length: int, device, holds_real: bool) -> torch.Tensor | None:
    """(B|1, 1, T, T) bool: which new tokens each query may see (None: all); older tokens are visible to all.
    holds_real: every row already holds a token that is not padding, so a single new token is not padding (a row
    gains padding only while it holds nothing else) and its mask need not be read."""
    if length == 1 and (attention_mask is None or holds_real):
        return None  # one new token that is not padding: it sees itself
    if attention_mask is None:
        return torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]
    block = visible(attention_mask[..., seen - length :])  # sdpa-style mask over the unpruned positions
    if length == 1 and bool(block.all()):
        return None  # a decoding step with an all-ones mask (generate passes one): nothing to mask
    return block


def _window_mask(new_mask, window_pads: list[int], window: int, length: int, device) -> torch.Tensor:
    """(B, 1, T, window) bool: the new tokens' mask, widened to the whole window with each row's padding hidden."""
    older = torch.arange(window - length, device=device)[None] >= torch.tensor(window_pads, device=device)[:, None]
    new = torch.ones(1, 1, length, length, dtype=torch.bool, device=device) if new_mask is None else new_mask
    older = older[:, None, None, :].expand(len(window_pads), 1, length, window - length)
    return torch.cat([older, new.expand(len(window_pads), 1, length, length)], -1)


class PrunedLayer(JudgedLayer):
    """Physical eviction: kept tokens of all rows share one packed buffer, the window stays dense.

    Row r (= b * H + h) owns the contiguous slots [start[r], start[r] + capacity[r]) of `packed_keys`, the
    first length[r] of them used, the rest spare (read with weight 0 at most). Attention is segment attention
    (`kvzap.pruning.segments`): each row's queries see only its used slots and its window, in chunks of at
    most `score_budget()` scores, so time and transient memory follow the kept entries.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, pads: list[int] | None = None, grows: bool = False):
        """grows: rows will gain tokens after their first verdict (pruning while decoding), so that verdict
        leaves them spare slots; else it fits exactly."""
        super().__init__(keys, values, pads)  # the dense part is the window; _settle compacts it
        batch, heads, _, dim = keys.shape
        n_rows, self.removed_shape = batch * heads, (batch, heads)
        self.packed_keys, self.packed_values = keys.new_empty(0, dim), values.new_empty(0, dim)  # (slots, D)
        none = torch.zeros(n_rows, dtype=torch.long, device=keys.device)
        self.rows = Rows(none, none, none)  # each row's segment of packed_keys/values
        # Leaving tokens every row has spare slots for, known without reading the lengths (a verdict on n tokens
        # adds at most n per row): a decoding step (one per row) reads nothing off the device until they run out.
        self.room = 0
        self.grows = grows

    @classmethod
    def from_rows(
        cls, keys: list[torch.Tensor], values: list[torch.Tensor], heads: int, seen: int, pads: list[int] | None = None
    ) -> PrunedLayer:
        """A layer whose every token is judged: row r (= b * H + h) keeps keys[r], values[r] (n_r, D) of the `seen`
        tokens, the first pads[b] of them padding, and the window is empty. Serves rows pruned apart from this
        layer (one prefill, many presses; prefills of different lengths, left-padded to the longest)."""
        batch, dim = len(keys) // heads, keys[0].shape[-1]
        empty = keys[0].new_empty(batch, heads, 0, dim)
        layer = cls(empty, empty.clone(), pads)
        lengths = torch.tensor([k.shape[0] for k in keys], device=layer.device)
        layer.rows = Rows.segments(lengths, lengths)
        layer.packed_keys, layer.packed_values = torch.cat(keys), torch.cat(values)
        layer.seen = seen
        return layer

    def _settle(self, n, keep):
        if n <= self.room:
            self._settle_in_place(n, keep)
            return
        batch, heads = keep.shape[:2]
        needed = self.rows.length + keep.sum(-1).flatten()  # (B * H,)
        # The one host read: it sizes a re-pack (which moves the used slots) and the room after it.
        lengths, used = torch.stack([needed, self.rows.length]).tolist()
        if any(n > c for n, c in zip(lengths, self.rows.capacities)):
            # Re-pack: a prefill-only verdict fits exactly, rows that grow later get spare slots.
            grows = self.grows or self.packed_keys.shape[0] > 0
            self._repack(needed + (_spare(needed) if grows else 0), used)
        # The i-th kept token of row r goes to slot start[r] + length[r] + i.
        first_free = (self.rows.start + self.rows.length).view(batch, heads, 1)
        slots = (first_free + keep.cumsum(-1) - 1)[keep]
        self.packed_keys[slots] = self.dense_keys[:, :, :n][keep]
        self.packed_values[slots] = self.dense_values[:, :, :n][keep]
        self.rows = self.rows.with_length(needed)
        self._set_room(lengths)
        self._keys.drop_front(n)
        self._values.drop_front(n)

    def _settle_in_place(self, n, keep):
        """n leaving tokens per row that every row has spare slots for (`room`), in whole-tensor ops of fixed
        shapes (no host read, no boolean indexing): row r writes all n into its n first free slots, its kept ones
        first, in order, then its dropped ones, and counts only the kept (length); the dropped stay behind in spare
        slots, which later tokens overwrite."""
        self.room -= n
        kept = keep.cumsum(-1)  # (B, H, n)
        dropped = torch.arange(1, n + 1, device=keep.device) - kept
        offset = torch.where(keep, kept - 1, kept[..., -1:] + dropped - 1)
        slots = ((self.rows.start + self.rows.length).view(*keep.shape[:2], 1) + offset).flatten()
        dim = self.packed_keys.shape[1]
        self.packed_keys.index_copy_(0, slots, self.dense_keys[:, :, :n].reshape(-1, dim))
        self.packed_values.index_copy_(0, slots, self.dense_values[:, :, :n].reshape(-1, dim))
        self.rows = self.rows.with_length(self.rows.length + kept[..., -1].flatten())
        self._keys.drop_front(n)
        self._values.drop_front(n)

    def _set_room(self, lengths: list[int]) -> None:
        """`room` once row r uses lengths[r] slots: the fewest spare slots of any row (0 for a layer of no rows)."""
        self.room = min([c - n for c, n in zip(self.rows.capacities, lengths)] or [0])

    def reserve(self, tokens: int) -> None:
        """Spare slots in every row for `tokens` more leaving tokens (a decoding step's one, or a chunk's), made
        now: no forward among them re-packs or reads a length, so a compiled step over them is one graph. A
        re-pack adds the usual spare on top, so calling this before every chunk re-packs only now and then."""
        if tokens <= self.room:
            return
        used = self.rows.lengths
        if any(n + tokens > c for n, c in zip(used, self.rows.capacities)):
            wanted = self.rows.length + tokens
            self._repack(torch.maximum(self.rows.capacity, wanted + _spare(self.rows.length)), used)
        self._set_room(used)

    def _repack(self, capacity: torch.Tensor, used: list[int]) -> None:
        """Give row r `capacity[r]` slots; its `used[r]` used slots move to the head of its new segment, in order
        (one slice copy per row: a row's used slots are contiguous, so no per-slot index is needed). Spare slots
        start as zeros: the decoding kernel reads them (with weight 0, which must not meet a NaN)."""
        rows = Rows.segments(capacity, self.rows.length)
        keys = self.packed_keys.new_zeros(sum(rows.capacities), self.packed_keys.shape[1])
        values = torch.zeros_like(keys)
        for new, old, n in zip(rows.starts, self.rows.starts, used):
            keys[new : new + n], values[new : new + n] = (
                self.packed_keys[old : old + n],
                self.packed_values[old : old + n],
            )
        self.packed_keys, self.packed_values, self.rows = keys, values, rows

    @property
    def removed(self) -> torch.Tensor:
        judged = self.seen - self.window_len  # the same for every row, padding included
        return judged - self.padding_judged() - self.rows.length.view(self.removed_shape)

    def score_budget(self) -> int:
        """Elements of one float32 score chunk: a quarter of the kept keys' elements (floor MIN_SCORE_CHUNK),
        so the chunk and the softmax's few same-sized temporaries stay about the size of the kept cache."""
        return max(self.packed_keys.numel() // 4, MIN_SCORE_CHUNK)

    def packed(self) -> Packed:
        return Packed(self.packed_keys, self.packed_values, self.rows)

    def _attend(self, q, new_mask, scaling, padded):
        batch, heads, queries, dim = q.shape
        rows = batch * heads
        out = segment_attention(
            (q * scaling).reshape(rows, queries, dim),
            self.packed(),
            Window(self.dense_keys.reshape(rows, -1, dim), self.dense_values.reshape(rows, -1, dim), new_mask),
            heads,
            self.score_budget(),
            **({"kernel": "decode"} if padded else {}),  # a mask over the whole window: the kernel that takes any
        )
        return out.view(batch, heads, queries, dim)

    @property
    def nbytes(self) -> int:
        """Bytes held: packed keys and values (with spare slots), window, window scores."""
        packed = self.packed_keys.nbytes + self.packed_values.nbytes
        return packed + self._keys.nbytes + self._values.nbytes + self._scores.nbytes


def _spare(needed: torch.Tensor) -> torch.Tensor:
    return (needed * ROW_SLACK).long().clamp(min=MIN_ROW_SLACK)


class MaskedLayer(JudgedLayer):
    """Reference: dense storage of every token plus a dropped-token mask, applied at attention time."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, pads: list[int] | None = None):
        self.dropped = torch.zeros(keys.shape[:3], dtype=torch.bool, device=keys.device)  # (B, H, seen)
        super().__init__(keys, values, pads)
        self._mark_padding([0] * keys.shape[0], self.pads)

    def _mark_padding(self, old, new):
        for row, (a, b) in enumerate(zip(old, new)):
            self.dropped[row, :, a:b] = True

    def _append(self, key_states, value_states):
        super()._append(key_states, value_states)
        self.dropped = torch.cat([self.dropped, self.dropped.new_zeros(key_states.shape[:3])], dim=-1)

    def _drop_newest(self, n):
        super()._drop_newest(n)
        self.dropped = self.dropped[..., :-n]

    def _settle(self, n, keep):
        start = self.seen - self.window_len
        self.dropped[..., start : start + n] = ~keep

    @property
    def removed(self) -> torch.Tensor:
        return self.dropped.sum(-1) - self.pad_counts.clamp(max=self.seen).view(-1, 1)

    def _attend(self, q, new_mask, scaling, padded):
        scores = (q @ self.dense_keys.transpose(-1, -2)).float() * scaling  # (B, H, G*T, seen)
        scores.masked_fill_(self.dropped[:, :, None, :], -math.inf)
        if new_mask is not None:
            scores[..., self.seen - new_mask.shape[-1] :].masked_fill_(~new_mask, -math.inf)
        p = torch.softmax(scores, dim=-1)
        if padded or new_mask is not None:
            p = p.nan_to_num_(0.0)  # a padding query sees nothing: output 0, as sdpa gives
        return p.to(q.dtype) @ self.dense_values

    @property
    def nbytes(self) -> int:
        return self._keys.nbytes + self._values.nbytes + self.dropped.nbytes + self._scores.nbytes


def reserve_room(cache, tokens: int) -> None:
    """Make room in every pruned layer for `tokens` more leaving tokens per row (`tokens` decoding steps, or a
    chunk of that many), outside the step: a loop that calls this every `tokens` tokens runs a step compiled with
    torch.compile(fullgraph=True) throughout, where a step that had to grow a row would read its length (a graph
    break). Costs at most `tokens` slots per row, plus the spare any re-pack adds."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be an integer >= 0 (leaving tokens to make room for), got {tokens!r}")
    layers = [layer for layer in getattr(cache, "layers", []) if isinstance(layer, PrunedLayer)]
    if not layers:
        raise ValueError("reserve_room takes a cache a press has pruned (run the prefill under the press first)")
    for layer in layers:
        layer.reserve(tokens)


def held_kv_bytes(cache) -> int:
    """Bytes a cache holds for keys and values over every layer: pruned layers' `nbytes`, dense and sliding-window
    layers' tensors (a hybrid model's sliding layers are left alone by KVzap but still hold memory)."""
    if not isinstance(getattr(cache, "layers", None), list):
        raise TypeError(f"held_kv_bytes takes a transformers Cache (e.g. a DynamicCache), got {type(cache).__name__}")
    total = 0
    for layer in cache.layers:
        if isinstance(layer, JudgedLayer):
            total += layer.nbytes
        elif getattr(layer, "is_initialized", False):
            total += layer.keys.nbytes + layer.values.nbytes
    return total
