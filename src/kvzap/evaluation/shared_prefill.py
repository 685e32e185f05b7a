"""One prefill per sample for every cell whose method prunes after attention, and one batched decode for them all.

A press that prunes after each attention op changes only what later tokens see, so the prefill of a context (every
layer's attention input, keys and values) is the same for the full cache, every KVzap threshold, the top-k presses
and every kvpress scorer baseline at every ratio. This module runs that prefill once (`record`), lets each cell's
press choose its kept entries from it by calling the press's own hook on the recorded layer (`kept_rows`, a
`KeptCell` of `KeptLayer`s), and
decodes the question and answer of all cells as one batch whose row i holds cell i's kept entries
(`PrunedLayer.from_rows`). Several samples can decode together (rows: samples x cells): a shorter context counts
as left padding that no pruned layer stores, each row reads its question at its own positions, and questions of
different lengths are fed one column at a time past their common part (`decode`), so no row holds padding after
its context. The per-cell path (`job.run_greedy`, kvpress's pipeline) stays the reference; the greedy answers agree
with it, batched or not (tests/test_shared_prefill.py).

On hybrid models the sliding-window layers are the same for every cell (no press touches them): the prefill keeps
transformers' bounded layer, and every row of the batch gets a copy of it (left-padded with zeros to the longest
sample's, hidden by the decode's attention mask).

A cell's `kv_bytes` are those of the entries it keeps (its rows and the sliding windows): the per-cell path's held
bytes, less what a layer holds besides them (our pruned layers' spare slots and window scores, the entries a kvpress
masking press only masks). `full_kv_bytes` are the recorded prefill's, as in the per-cell path.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import DynamicCache, pipeline
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from kvzap.introspection import attention_modules
from kvzap.layer_types import skipped_layers
from kvzap.pruning.attention import use_kvzap_attention
from kvzap.pruning.cache import JudgedLayer, PrunedLayer


@dataclass
class Prefill:
    """One context's prefill: per layer, the attention module's keyword arguments (its input h, positions, mask)
    and the dense keys and values (1, H, T, D) it cached; sliding layers' bounded cache layers, by index."""

    kwargs: list[dict]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    sliding: dict[int, DynamicLayer]
    length: int

    @property
    def nbytes(self) -> int:
        """The full cache's KV bytes: every layer's keys and values (a sliding layer's window)."""
        return sum(k.nbytes + v.nbytes for k, v in zip(self.keys, self.values))


@dataclass
class KeptLayer:
    """What one cell keeps of one full-attention layer: each kv-head's kept (n_h, D) keys and values."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for part in (self.keys, self.values) for t in part)


@dataclass
class KeptCell:
    """What one cell (one press) keeps of one prefill: a layer per full-attention layer (None for a sliding layer,
    which no press prunes, and which every cell shares), and the cell's compression ratio as the per-cell path reads
    it (0 for the full cache)."""

    layers: list[KeptLayer | None]
    ratio: float

    def kv_bytes(self, prefill: Prefill) -> int:
        """The KV bytes the cell keeps: its full-attention layers' rows, and the sliding layers' windows."""
        windows = sum(prefill.keys[i].nbytes + prefill.values[i].nbytes for i in prefill.sliding)
        return windows + sum(layer.nbytes for layer in self.layers if layer is not None)


@torch.no_grad()
def record(model, context_ids: torch.Tensor) -> Prefill:
    """Prefill (1, T) context ids with the plain model, keeping what every press's hook reads."""
    kwargs = []

    def keep(module, args, layer_kwargs, output):
        kwargs.append({k: v for k, v in layer_kwargs.items() if k != "past_key_values"})

    hooks = [m.register_forward_hook(keep, with_kwargs=True) for m in attention_modules(model)]
    cache = DynamicCache(config=model.config)
    try:
        model.model(input_ids=context_ids, past_key_values=cache)
    finally:
        for hook in hooks:
            hook.remove()
    keys, values = [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]
    sliding = {i: cache.layers[i] for i in skipped_layers(model.config)}
    return Prefill(kwargs, keys, values, sliding, context_ids.shape[1])


def _dense_layer(keys: torch.Tensor, values: torch.Tensor) -> DynamicLayer:
    layer = DynamicLayer()
    layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys, values
    return layer


def _kept_layer(layer, module) -> KeptLayer:
    """The kept keys and values of each kv-head of a one-sample layer after its press's hook."""
    if isinstance(layer, PrunedLayer):  # ours: packed kept tokens, then the window (kept: answers are not judged)
        packed, window_k, window_v = layer.packed(), layer.dense_keys[0], layer.dense_values[0]
        rows = [(s, s + n) for s, n in zip(packed.rows.starts, packed.rows.lengths)]
        keys = [torch.cat([packed.keys[a:b], window_k[h]]) for h, (a, b) in enumerate(rows)]
        values = [torch.cat([packed.values[a:b], window_v[h]]) for h, (a, b) in enumerate(rows)]
        return KeptLayer(keys, values)
    if isinstance(layer, JudgedLayer):
        raise TypeError(f"{type(layer).__name__} keeps every entry dense: share prefills with evict=True presses")
    keys, values = layer.keys[0], layer.values[0]  # (H, n, D): a kvpress press gathered the kept entries
    keep = torch.ones(keys.shape[:2], dtype=torch.bool, device=keys.device)
    masked = getattr(module, "masked_key_indices", None)  # AdaKV, DuoAttention: entries masked, not removed
    if masked is not None:
        _, heads, positions = masked
        keep[heads, positions] = False
        module.masked_key_indices = None
    return KeptLayer([k[m] for k, m in zip(keys, keep)], [v[m] for v, m in zip(values, keep)])


def _run_hook(press, module, kwargs: dict, cache: DynamicCache) -> None:
    """The one seam to a press: its forward hook, called as its `with press(model)` block would after the module's
    attention, on the recorded inputs (kvpress's presses, and ours, read only the keyword arguments and the cache).
    A kvpress press that masks (AdaKV, DuoAttention) leaves its verdict on the module, reset here first."""
    module.masked_key_indices = None
    press.forward_hook(module, (), {**kwargs, "past_key_values": cache}, (None, None))


@torch.no_grad()
def kept_rows(model, prefill: Prefill, press) -> KeptCell:
    """What one cell keeps: its press's hook run on the recorded prefill, layer by layer."""
    modules = attention_modules(model)
    if press is None:
        return KeptCell(
            [
                None if i in prefill.sliding else KeptLayer(list(k[0]), list(v[0]))
                for i, (k, v) in enumerate(zip(prefill.keys, prefill.values))
            ],
            0.0,
        )
    cache = DynamicCache()
    cache.layers = [_dense_layer(k, v) for k, v in zip(prefill.keys, prefill.values)]
    layers = []
    with press(model):
        for module, kwargs in zip(modules, prefill.kwargs):
            if module.layer_idx in prefill.sliding:
                layers.append(None)
                continue
            _run_hook(press, module, kwargs, cache)
            layers.append(_kept_layer(cache.layers[module.layer_idx], module))
            cache.layers[module.layer_idx] = None  # freed as soon as its rows are taken
    return KeptCell(layers, float(press.compression_ratio))


def batched_cache(groups: list[tuple[Prefill, list[KeptCell]]], heads: int) -> DynamicCache:
    """One cache holding, prefill by prefill, a batch row per cell with that cell's kept entries, layer by layer (a
    sliding layer: the prefill's bounded layer, repeated for its cells). Prefills shorter than the longest are
    left-padded to it: in a pruned layer the padding is counted, never stored; in a sliding layer it is zeros that
    the decode's attention mask hides."""
    length = max(prefill.length for prefill, _ in groups)
    pads = [length - prefill.length for prefill, cells in groups for _ in cells]
    cache = DynamicCache()
    cache.layers = [
        _stacked([(prefill.sliding[layer], len(cells)) for prefill, cells in groups], length)
        if layer in groups[0][0].sliding
        else PrunedLayer.from_rows(
            [k for _, cells in groups for cell in cells for k in cell.layers[layer].keys],
            [v for _, cells in groups for cell in cells for v in cell.layers[layer].values],
            heads,
            length,
            pads,
        )
        for layer in range(len(groups[0][0].keys))
    ]
    return cache


def _stacked(parts: list[tuple[DynamicLayer, int]], length: int) -> DynamicLayer:
    """One dense layer from one-sample layers, each repeated for its cells and left-padded with zeros to the
    longest, which holds the last entries of `length` positions (the prefills' own layers are left as they are)."""
    layers = [layer for layer, _ in parts]
    if len({layer.get_seq_length() for layer in layers}) > 1 and not isinstance(layers[0], DynamicSlidingWindowLayer):
        raise NotImplementedError(
            f"Prefills of different lengths cannot share a {type(layers[0]).__name__}: decode one sample at a time "
            "(--batch-size no larger than the cells decoded together)."
        )
    held = max(layer.keys.shape[-2] for layer in layers)

    def rows(name: str) -> torch.Tensor:
        padded = [(F.pad(getattr(layer, name), (0, 0, held - layer.keys.shape[-2], 0)), n) for layer, n in parts]
        return torch.cat([x.repeat_interleave(n, 0) for x, n in padded])

    out = copy.copy(layers[0])
    out.keys, out.values = rows("keys"), rows("values")
    if isinstance(out, DynamicSlidingWindowLayer):
        out.cumulative_length = length
    return out


def _padding_mask(cache, context_lengths: list[int], device) -> torch.Tensor | None:
    """(B, seen) ones after each row's padding, for caches whose dense layers hold padding (a hybrid model's
    sliding layers); None where no layer does (a pruned layer stores none, so nothing needs hiding)."""
    seen = cache.get_seq_length()
    pads = [seen - n for n in context_lengths]
    if not any(pads) or all(isinstance(layer, JudgedLayer) for layer in cache.layers):
        return None
    return (torch.arange(seen, device=device)[None] >= torch.tensor(pads, device=device)[:, None]).long()


@torch.no_grad()
def decode(
    model, cache, questions: list[list[int]], context_lengths: list[int], max_new_tokens: list[int]
) -> list[list[int]]:
    """Greedy answers of every row, as kvpress's pipeline decodes one: row b's question at the positions after its
    context, then one token at a time until an end-of-sequence token (kept) or its max_new_tokens.

    Rows' questions may differ in length: the part they all have runs as one forward, then every step feeds each
    row its next question token or its last answer token, so no row holds padding after its context."""
    device = model.device
    stop = model.generation_config.eos_token_id
    stops = set(stop if isinstance(stop, list) else [stop])
    offsets = torch.tensor(context_lengths, device=device)[:, None]  # each row's first question position
    mask = _padding_mask(cache, context_lengths, device)
    common = min(len(q) for q in questions)

    def forward(ids: list[list[int]], fed: int):
        nonlocal mask
        width = len(ids[0])
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones(len(ids), width)], -1)
        positions = offsets + torch.arange(fed, fed + width, device=device)
        ids = torch.tensor(ids, device=device)
        return model(
            input_ids=ids, past_key_values=cache, position_ids=positions, attention_mask=mask, logits_to_keep=1
        )

    logits = forward([q[:common] for q in questions], 0).logits
    answers, done, fed = [[] for _ in questions], [False] * len(questions), common
    while True:
        chosen = logits[:, -1].argmax(-1).tolist()
        for b, (question, answer) in enumerate(zip(questions, answers)):
            if not done[b] and fed >= len(question):
                answer.append(chosen[b])
                done[b] = chosen[b] in stops or len(answer) >= max_new_tokens[b]
        if all(done):
            return answers
        ids = [[q[fed]] if fed < len(q) else [a[-1]] for q, a in zip(questions, answers)]
        logits = forward(ids, fed).logits
        fed += 1


def run_greedy_shared(
    model, tokenizer, rows: pd.DataFrame, presses: list, decode_batch: int = 16, samples: int = 1
) -> list[pd.DataFrame]:
    """`job.run_greedy` for many cells at once: one prefill per sample, and one decode per `decode_batch` cells of
    `samples` samples together (rows: samples x cells). Returns one outputs frame per press (None: the full cache),
    in order."""
    for name, value in (("decode_batch", decode_batch), ("samples", samples)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number of at least 1 (rows of one decode), got {value!r}")
    if rows["sample_id"].duplicated().any():  # answers are keyed by (sample, cell)
        raise ValueError(f"sample ids repeat: {sorted(rows['sample_id'][rows['sample_id'].duplicated()].unique())}")
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device=model.device)
    use_kvzap_attention(model)  # the batched cache is read by the "kvzap" attention
    heads = model.config.num_key_value_heads
    out, todo = [[] for _ in presses], list(rows.itertuples())
    progress = tqdm(total=len(todo), desc=f"samples ({len(presses)} cells, one prefill each, {samples} per batch)")
    for start in range(0, len(todo), samples):
        batch = todo[start : start + samples]
        prompts = [pipeline_prompt(pipe, row, model.device) for row in batch]
        prefills = [record(model, context_ids) for context_ids, _ in prompts]
        for first in range(0, len(presses), decode_batch):
            cells = list(range(first, min(first + decode_batch, len(presses))))
            chosen = {
                (row.sample_id, c): kept_rows(model, p, presses[c]) for row, p in zip(batch, prefills) for c in cells
            }
            groups = [(p, [chosen[row.sample_id, c] for c in cells]) for row, p in zip(batch, prefills)]
            order = [(row.sample_id, c) for row in batch for c in cells]  # the decode's rows: samples x cells
            answers = dict(
                zip(
                    order,
                    decode(
                        model,
                        batched_cache(groups, heads),
                        [question for _, question in prompts for _ in cells],
                        [prefill.length for prefill in prefills for _ in cells],
                        [int(row.max_new_tokens) for row in batch for _ in cells],
                    ),
                )
            )
            for row, prefill in zip(batch, prefills):
                for c in cells:
                    kept = chosen[row.sample_id, c]
                    text = tokenizer.decode(answers[row.sample_id, c], skip_special_tokens=True)
                    memory = {"kv_bytes": kept.kv_bytes(prefill), "full_kv_bytes": prefill.nbytes}
                    out[c].append(
                        {"sample_id": row.sample_id, "prediction": text, "compression_ratio": kept.ratio, **memory}
                    )
        progress.update(len(batch))
    progress.close()
    return [pd.DataFrame(cell) for cell in out]


def pipeline_prompt(pipe, row, device) -> tuple[torch.Tensor, list[int]]:
    """(1, T) context ids and the question's ids, with the pipeline's own chat template, question suffix and
    truncation, as the per-cell path gets them."""
    options = pipe._sanitize_parameters(question=row.question, answer_prefix=row.answer_prefix)[0]
    inputs = pipe.preprocess(row.context, **options)
    return inputs["context_ids"].to(device), inputs["questions_ids"][0][0].tolist()
