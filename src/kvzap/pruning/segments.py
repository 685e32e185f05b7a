"""Segment ("varlen") attention over a packed cache: each (batch, kv-head) row is its own key sequence.

Row r's keys are its used slots `keys[starts[r] : starts[r] + lengths[r]]` (`Rows`) followed by its dense window; its
G * T queries (a GQA group's heads over the T new tokens) see only those, so work and transient memory follow
the kept cache. Four implementations, each exact against the masking reference, three of them serving:
- `_varlen` (CUDA, half precision): two calls of PyTorch's flash varlen kernel for all rows at once, one over
  the kept slots (`seqused_k` skips the spare ones) and one over the windows, merged through their
  log-sum-exps: a fixed number of kernels per layer, whatever the number of rows. Its first use on a device
  is checked against the row loop (`kernel_trusted`); a mismatch stops the job (`KernelMismatch`).
- `_decode` (every device, any mask; named for its first use, a decoding step's one new token): the windows'
  scores and values in one batched matmul each, one softmax over a padded (Q, R, widest + W) score buffer (in
  query blocks within the budget), and per row only the two matmuls over its segment, written in place
  through views made in bulk, on one thread: two ops per row instead of the row loop's dozen, whose overhead
  dominates a decoding step of small rows. It reads no length on the host, so a step it serves needs no device
  sync for it and compiles whole: it serves CPU decoding, any masked or padded-window forward but the CPU's
  causal chunks, and under torch.compile every forward that varlen does not.
- `_flash_rows` (CPU, causal multi-token forwards, eager): row by row with the CPU flash kernel.
- `_rows`: row by row, a chunk of queries at a time so that no score matrix exceeds the budget: the plain
  reference the others are tested against, and that varlen's first use is checked against. Rows never share a
  matmul in it: a block of n rows scoring every row's queries against all their slots (other rows' masked)
  wastes (n - 1) / n of its work, and needs a per-slot owner to mask with.
Each eager call counts the kernel that served it (`SERVED`, `kernels_served`): a run's provenance names its
kernels (calls inside a torch.compile'd step are not counted).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from copy import copy
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

try:  # PyTorch's flash varlen attention (CUDA only, float16/bfloat16)
    from torch.nn.attention.varlen import AuxRequest, varlen_attn
except ImportError:  # an older torch: the row paths serve CUDA too
    varlen_attn = None

VARLEN_DTYPES = (torch.float16, torch.bfloat16)
KERNELS = ("varlen", "decode", "flash", "rows")
# Calls each kernel served in this process, by name: read it, or take a block's share with `kernels_served`.
SERVED: Counter[str] = Counter()


@contextmanager
def kernels_served() -> Iterator[Counter]:
    """The calls each kernel served inside the block, by name, filled in when the block ends (blocks may nest):
    a slow or suspicious run can then be traced to the kernel that served it, e.g. the row loop standing in for
    an untrusted varlen kernel."""
    before = SERVED.copy()
    used = Counter()
    try:
        yield used
    finally:
        used.update(SERVED - before)


@dataclass(frozen=True)
class Rows:
    """Where each row's segment of a packed buffer lies: row r owns `capacity[r]` slots from `start[r]` on and uses
    the first `length[r]`. Starts and capacities change only when the buffer is re-packed, so their host lists
    (which the Python loops slice by) are made here, with their (R,) device tensors, and never change. The lengths
    change every decoding step and stay on the device: a kernel that needs them on the host reads them
    (`lengths`), the decoding kernel does not (a host read per layer and step is a device sync on a GPU and a
    graph break under torch.compile)."""

    start: torch.Tensor
    capacity: torch.Tensor
    length: torch.Tensor
    starts: list[int] = field(init=False, repr=False)
    capacities: list[int] = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "starts", self.start.tolist())
        object.__setattr__(self, "capacities", self.capacity.tolist())

    @property
    def lengths(self) -> list[int]:
        """The used slots per row, read off the device."""
        return self.length.tolist()

    @classmethod
    def segments(cls, capacity: torch.Tensor, length: torch.Tensor) -> Rows:
        """Rows laid out back to back from slot 0, each with its capacity."""
        return cls(capacity.cumsum(0) - capacity, capacity, length)

    def with_length(self, length: torch.Tensor) -> Rows:
        """The same segments, now using `length[r]` slots each (no device read)."""
        rows = copy(self)
        object.__setattr__(rows, "length", length)
        return rows


class Packed(NamedTuple):
    """Kept keys and values (slots, D) of all rows, and where each row's segment lies."""

    keys: torch.Tensor
    values: torch.Tensor
    rows: Rows


class Window(NamedTuple):
    """Each row's dense recent tokens, keys and values (R, W, D), and which of the m newest the queries see: `mask`
    (B|1, 1, Q, m) bool (the T new tokens, or the whole window while it holds padding), or None (all visible)."""

    keys: torch.Tensor
    values: torch.Tensor
    mask: torch.Tensor | None


def segment_attention(
    q, packed: Packed, window: Window, heads: int, budget: int, kernel: str | None = None
) -> torch.Tensor:
    """Exact softmax attention of each row's queries over its used slots and its window.

    q (R, Q, D), already scaled, R = B * H rows, Q = G * T queries per row (G heads of T tokens, head-major); a
    window mask over the whole window (padding in it) needs kernel="decode" (or "rows"). `heads` (H) maps a row to
    its batch entry's mask, `budget` caps the score elements of a query block. Scores are float32, as in the
    masking reference. kernel: "varlen", "decode", "flash" or "rows" (None: the fastest that applies). Returns
    (R, Q, D).
    """
    if kernel is None:
        kernel = applicable_kernels(q, window.mask)[0]
        if kernel == "varlen":
            kernel_trusted(q, packed, window, heads, budget)
    if not torch.compiler.is_compiling():  # a count read by a traced step would recompile it at every call
        SERVED[kernel if kernel in KERNELS else "rows"] += 1  # any other name falls through to the row loop
    if kernel == "varlen":
        return _varlen(q, packed, window)
    if kernel == "decode":
        return _decode(q, packed, window, heads, budget)
    if kernel == "flash":
        return _flash_rows(q, packed, window)
    return _rows(q, packed, window, heads, budget)


def applicable_kernels(q, new_mask) -> list[str]:
    """The kernels that can serve these queries and this mask, fastest first. Traced by torch.compile, a mask
    is not read to see whether it is causal (a host read): masked queries then take the decoding kernel."""
    if torch.compiler.is_compiling():
        causal_or_single = new_mask is None
    else:
        causal_or_single = new_mask is None or _is_causal(new_mask, q.shape[1])
    found = []
    if q.is_cuda and q.dtype in VARLEN_DTYPES and varlen_attn is not None and causal_or_single:
        found.append("varlen")
    if q.device.type == "cpu" and new_mask is not None and causal_or_single:
        found.append("flash")  # a causal chunk: no score buffer, no copy of the kept keys per block
    return found + ["decode"]


# (device, dtype, causal) -> how far the varlen kernel's first outputs there were from the row loop's, and their scale
TRUSTED: dict[tuple, tuple[float, float]] = {}
# How far bf16/fp16 kernels may differ from the float32 row loop, relative to the output's magnitude (rounding
# gives about 1e-2; a kernel that reads other keys, e.g. another causal alignment, differs by order one).
TRUST_TOLERANCE = 0.05


class KernelMismatch(RuntimeError):
    """A fused kernel disagreed with the row loop on its first inputs: results would change, so the job stops."""


def kernel_trusted(q, packed: Packed, window: Window, heads: int, budget: int) -> None:
    """Compare the varlen kernel with the float32 row loop on its first inputs per (device, dtype, causal).

    Its use of `varlen_attn` follows the documentation and is tested on CPU against an emulation of it. A
    kernel that behaves otherwise on some GPU or torch version must neither change results nor run 12-15x
    slower unseen (the row loop's cost on a long cache), so it raises KernelMismatch, every time it is chosen.
    """
    key = (str(q.device), q.dtype, window.mask is not None)
    if key not in TRUSTED:
        got = _varlen(q, packed, window).float()
        want = float32_rows(q, packed, window, heads, budget)
        TRUSTED[key] = (got - want).abs().max().item(), want.abs().max().item()
    error, scale = TRUSTED[key]
    if error > TRUST_TOLERANCE * max(1.0, scale):
        raise KernelMismatch(
            f"Segment attention kernel 'varlen' (torch.nn.attention.varlen.varlen_attn, torch {torch.__version__}) "
            f"differs from the exact row loop by {error:.3g} (outputs up to {scale:.3g}) on {key}. Fix: a torch "
            "build whose varlen_attn passes this check, or the model in float32 (`dtype: float32`), which segment "
            "attention serves with the exact row loop."
        )


def float32_rows(q, packed: Packed, window: Window, heads: int, budget: int):
    """The row loop on float32 copies of everything: the reference that half-precision kernels are held to."""
    upcast = packed._replace(keys=packed.keys.float(), values=packed.values.float())
    return _rows(q.float(), upcast, _float(window), heads, budget)


def _float(window: Window) -> Window:
    return window._replace(keys=window.keys.float(), values=window.values.float())


def _rows(q, packed: Packed, window: Window, heads, budget):
    rows, queries, _ = q.shape
    width, new_mask = window.keys.shape[1], window.mask
    out = torch.empty_like(q)
    lengths = packed.rows.lengths
    for r in range(rows):
        n = lengths[r]
        used = slice(packed.rows.starts[r], packed.rows.starts[r] + n)
        keys, values = packed.keys[used], packed.values[used]
        visible = None if new_mask is None else new_mask[r // heads if new_mask.shape[0] > 1 else 0, 0]  # (Q, T)
        step = max(1, budget // (n + width))  # at least one query: a single row of scores may exceed the budget
        for q0 in range(0, queries, step):
            block = q[r, q0 : q0 + step]  # (m, D)
            scores = torch.cat([block @ keys.T, block @ window.keys[r].T], -1).float()  # (m, n + W)
            if visible is not None:
                scores[:, n + width - visible.shape[-1] :].masked_fill_(~visible[q0 : q0 + step], -math.inf)
            p = torch.softmax(scores, -1)
            if visible is not None:
                p.nan_to_num_(0.0)  # a padding query sees nothing: output 0, as sdpa gives
            p = p.to(q.dtype)
            torch.addmm(p[:, n:] @ window.values[r], p[:, :n], values, out=out[r, q0 : q0 + step])  # a contiguous block
    return out


def _used_views(tensor: torch.Tensor, starts: list[int], sizes: list[int], dim: int = 0) -> list[torch.Tensor]:
    """Each row's part of a packed tensor (slots along `dim`; row r's from starts[r], sizes[r] of them), as views
    made by one split instead of a slice per row: the parts alternate unused (before the first row, what lies
    between rows) and used, and only the used ones are kept."""
    ends = starts[1:] + [tensor.shape[dim]]
    parts = [starts[0] if starts else tensor.shape[dim]]
    for start, n, end in zip(starts, sizes, ends):
        parts += [n, end - start - n]
    return list(tensor.split(parts, dim))[1::2]


def _decode(q, packed: Packed, window: Window, heads: int, budget: int):
    """Each row's queries over its segment and window, the window's newest tokens masked by `window.mask`.

    Scores live in a (Q, R, widest + W) buffer: row r's segment (all its `capacity[r]` slots) fills its first
    key positions, its window the last W, and every position past the row's used slots is set to -inf (weight
    0) by one mask made on the device from the lengths. Queries come first so that one split of the buffer seen
    as (Q, R * (widest + W)) yields every row's (Q, capacity) block at once, which mm writes in place, and the
    softmax runs over the contiguous last dim. The windows' scores and values take one batched matmul each; each
    row's segment a matmul each, two in all. Sizing by capacity, which changes only at a re-pack, instead of
    by the used length, which changes every step, costs the spare slots' few percent of work and keeps the step
    free of host reads (no device sync per layer on a GPU, no graph break under torch.compile); the spare
    slots hold finite values (zeros, or a dropped token), which weight 0 cancels. Queries go in blocks whose
    buffer stays within `budget` elements (a decoding step's few queries are one block).

    bf16 and fp16 run in float32: on a CPU one row's small matmul costs several times more in bf16 (the library's
    per-call set-up) than casting its few hundred slots (without the cast, the demo's bf16 prefill-group job took
    2.1x its bare forwards).
    """
    rows, queries, _ = q.shape
    with _one_thread():
        wide = (q, packed, window)
        if q.dtype != torch.float32:
            wide = (q.float(), packed._replace(keys=packed.keys.float(), values=packed.values.float()), _float(window))
        width = max([0, *packed.rows.capacities]) + window.keys.shape[1]
        block = max(1, budget // max(1, rows * width))
        if block >= queries:
            return _decode_rows(*wide, _row_mask(window.mask, slice(None), heads, rows)).to(q.dtype)
        out = torch.empty_like(q)
        for q0 in range(0, queries, block):
            part = slice(q0, q0 + block)
            out[:, part] = _decode_rows(wide[0][:, part], *wide[1:], _row_mask(window.mask, part, heads, rows))
        return out


def _row_mask(mask: torch.Tensor | None, queries: slice, heads: int, rows: int) -> torch.Tensor | None:
    """A (B|1, 1, Q, m) window mask -> (q, R, m) for the queries in `queries`: row r (= b * H + h) sees what batch
    entry b's queries see (a view when one mask serves every row)."""
    if mask is None:
        return None
    part = mask[:, 0, queries]  # (B|1, q, m)
    if part.shape[0] == 1:
        return part[0, :, None].expand(-1, rows, -1)
    return part[:, None].expand(-1, heads, -1, -1).reshape(rows, *part.shape[1:]).transpose(0, 1)


@contextmanager
def _one_thread():
    """Run on one intra-op thread: every op of `_decode` is small (one row's matmul reads a few hundred
    slots), and a multi-threaded BLAS call waits for its second thread at each of them; on a loaded
    machine that wait is a scheduler time slice per op (measured: 90 row matmuls 1.4 s on 2 threads with
    another process running, 5 ms on one). Compiled code runs its own kernels: left as it is."""
    if torch.compiler.is_compiling():
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _decode_rows(q, packed: Packed, window: Window, visible: torch.Tensor | None):
    rows, queries, _ = q.shape
    starts, capacities = packed.rows.starts, packed.rows.capacities
    widest = max([0, *capacities])
    width = widest + window.keys.shape[1]
    layout = list(range(0, rows * width, width))  # where row r's part of a buffer row starts
    scores = q.new_empty(queries, rows, width)
    scores[..., widest:] = torch.bmm(q, window.keys.transpose(1, 2)).transpose(0, 1)
    used = [r for r, n in enumerate(capacities) if n]
    kept_scores = _used_views(scores.view(queries, -1), layout, capacities, 1)  # (Q, capacity) each
    keys_t = _used_views(packed.keys.T, starts, capacities, 1)  # (D, capacity) each
    q_rows = q.unbind(0)  # views made in one call, as the splits' (a slice per row costs as much as its matmul)
    compiling = torch.compiler.is_compiling()  # a traced graph takes no out= views: it fuses the copy instead
    for r in used:
        if compiling:
            kept_scores[r].copy_(q_rows[r] @ keys_t[r])
        else:
            torch.mm(q_rows[r], keys_t[r], out=kept_scores[r])
    unused = torch.arange(widest, device=q.device) >= packed.rows.length[:, None]  # (R, widest): spare, or no slot
    scores[..., :widest].masked_fill_(unused, -math.inf)
    if visible is not None:
        scores[..., width - visible.shape[-1] :].masked_fill_(~visible, -math.inf)
    p = torch.softmax(scores.float(), -1).to(q.dtype)  # a row sees its window's newest token at least...
    if visible is not None:
        p.nan_to_num_(0.0)  # ...but a padding query sees nothing: output 0, as sdpa gives
    out = torch.bmm(p[..., widest:].transpose(0, 1), window.values)  # (R, Q, D)
    weights = _used_views(p.view(queries, -1), layout, capacities, 1)
    values = _used_views(packed.values, starts, capacities)
    outs = out.unbind(0)
    for r in used:
        outs[r].addmm_(weights[r], values[r])
    return out


def _is_causal(new_mask: torch.Tensor, queries: int) -> bool:
    """Whether each of the G query heads' T queries sees exactly the new tokens up to itself."""
    new = new_mask.shape[-1]
    tril = torch.ones(new, new, dtype=torch.bool, device=new_mask.device).tril()
    return bool((new_mask.view(-1, queries // new, new, new) == tril).all())


def _merge(a, lse_a, b, lse_b):
    """Attention outputs over two disjoint key sets -> the output over their union (lse: float32, broadcastable
    to the outputs without their last dim; -inf = no key)."""
    total = torch.logaddexp(lse_a, lse_b)
    return (a.float() * (lse_a - total).exp()[..., None] + b.float() * (lse_b - total).exp()[..., None]).to(a.dtype)


def _varlen(q, packed: Packed, window: Window):
    """Every row is a sequence of T tokens with G query heads and one kv head: one kernel over the kept slots
    (the rows' segments, of which `seqused_k` reads the used part), one over the windows (causal for new
    tokens, bottom-right aligned as in flash attention), merged exactly."""
    rows, queries, dim = q.shape
    width = window.keys.shape[1]
    new = 1 if window.mask is None else window.mask.shape[-1]
    group = queries // new
    tokens = q.view(rows, group, new, dim).transpose(1, 2).reshape(rows * new, group, dim)  # (R*T, G, D)
    q_bounds = torch.arange(0, (rows + 1) * new, new, dtype=torch.int32, device=q.device)
    aux = AuxRequest(lse=True)
    w_bounds = torch.arange(0, (rows + 1) * width, width, dtype=torch.int32, device=q.device)
    out, own_lse = varlen_attn(
        tokens,
        window.keys.reshape(-1, 1, dim),
        window.values.reshape(-1, 1, dim),
        q_bounds,
        w_bounds,
        new,
        width,
        return_aux=aux,
        scale=1.0,
        enable_gqa=True,
        window_size=(-1, -1) if window.mask is None else (-1, 0),
    )
    if packed.keys.shape[0]:  # else nothing was judged yet (a prompt within the window): the windows are all
        bounds = torch.nn.functional.pad(packed.rows.capacity.cumsum(0), (1, 0)).int()
        used = packed.rows.length.int()
        longest = max(b - a for a, b in zip(packed.rows.starts, packed.rows.starts[1:] + [packed.keys.shape[0]]))
        kept, kept_lse = varlen_attn(
            tokens,
            packed.keys[:, None],
            packed.values[:, None],
            q_bounds,
            bounds,
            new,
            longest,
            return_aux=aux,
            scale=1.0,
            enable_gqa=True,
            seqused_k=used,
        )
        # A row without used slots had no keys in this call, whatever the kernel reported for it (its lse
        # may be +inf or -inf, its output 0 or NaN): it gets the window's output alone.
        empty = (used == 0).repeat_interleave(new)  # (R*T,)
        kept = kept.masked_fill(empty[:, None, None], 0)
        kept_lse = kept_lse.float().masked_fill(empty[None], -math.inf)  # (G, R*T)
        out = _merge(kept, kept_lse.T, out, own_lse.float().T)  # (R*T, G, D)
    return out.view(rows, new, group, dim).transpose(1, 2).reshape(rows, queries, dim)


def _flash(q, k, v, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(1, h, m, D) attention (q pre-scaled) -> output (1, h, m, D), float32 log-sum-exp (1, h, m)."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=1.0)[:2]
    return out, lse


def _flash_rows(q, packed: Packed, window: Window):
    """Row by row: flash attention over [kept slots, older window] (all visible) and over the mask's new
    window tokens (causal per query head), merged exactly."""
    rows, queries, dim = q.shape
    new = window.mask.shape[-1]
    group, old = queries // new, window.keys.shape[1] - new
    out = torch.empty_like(q)
    lengths = packed.rows.lengths
    for r in range(rows):
        kept = slice(packed.rows.starts[r], packed.rows.starts[r] + lengths[r])
        own, own_lse = _flash(
            q[r].view(1, group, new, dim),
            window.keys[r, old:].expand(1, group, new, dim),
            window.values[r, old:].expand(1, group, new, dim),
            causal=True,
        )
        own, own_lse = own.reshape(queries, dim), own_lse.reshape(queries)
        if lengths[r] + old == 0:
            out[r] = own
            continue
        keys = torch.cat([packed.keys[kept], window.keys[r, :old]])[None, None]
        values = torch.cat([packed.values[kept], window.values[r, :old]])[None, None]
        past, past_lse = _flash(q[r][None, None], keys, values, causal=False)
        out[r] = _merge(past[0, 0], past_lse[0, 0], own, own_lse)
    return out
