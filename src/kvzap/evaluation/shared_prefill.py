"""One prefill per sample for every cell whose method prunes after attention, and one batched decode for them all.

A press that prunes after each attention op changes only what later tokens see, so the prefill of a context (every
layer's attention input, keys and values) is the same for the full cache, every KVzap threshold, the top-k presses
and every kvpress scorer baseline at every ratio. This module runs that prefill once (`record`), lets each cell's
press choose its kept entries from it by calling the press's own hook on the recorded layer (`kept_rows`), and
decodes the question and answer of all cells as one batch whose row i holds cell i's kept entries
(`PrunedLayer.from_rows`): same prompt, same positions, no padding. The per-cell path (`job.run_greedy`, kvpress's
pipeline) stays the reference; the greedy answers agree with it (tests/test_shared_prefill.py).

On hybrid models the sliding-window layers are the same for every cell (no press touches them): the prefill keeps
transformers' bounded layer, and every row of the batch gets a copy of it.

A cell's `kv_bytes` are those of the entries it keeps (its rows and the sliding windows): the per-cell path's held
bytes, less what a layer holds besides them (our pruned layers' spare slots and window scores, the entries a kvpress
masking press only masks). `full_kv_bytes` are the recorded prefill's, as in the per-cell path.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pandas as pd
import torch
from tqdm import tqdm
from transformers import DynamicCache, pipeline
from transformers.cache_utils import DynamicLayer

from kvzap.layer_types import skipped_layers
from kvzap.oracle.scores import attention_modules
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


def kept_bytes(rows: list, prefill: Prefill) -> int:
    """The KV bytes one cell keeps: its rows of the full-attention layers, and the sliding layers' windows."""
    windows = sum(prefill.keys[i].nbytes + prefill.values[i].nbytes for i in prefill.sliding)
    return windows + sum(row.nbytes for layer in rows if layer is not None for part in layer for row in part)


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


def _rows(layer, module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The kept (n_h, D) keys and values of each kv-head of a one-sample layer after its press's hook."""
    if isinstance(layer, PrunedLayer):  # ours: packed kept tokens, then the window (kept: answers are not judged)
        packed, window_k, window_v = layer.packed(), layer.dense_keys[0], layer.dense_values[0]
        rows = [(s, s + n) for s, n in zip(packed.starts, packed.lengths)]
        keys = [torch.cat([packed.keys[a:b], window_k[h]]) for h, (a, b) in enumerate(rows)]
        values = [torch.cat([packed.values[a:b], window_v[h]]) for h, (a, b) in enumerate(rows)]
        return keys, values
    if isinstance(layer, JudgedLayer):
        raise TypeError(f"{type(layer).__name__} keeps every entry dense: share prefills with evict=True presses")
    keys, values = layer.keys[0], layer.values[0]  # (H, n, D): a kvpress press gathered the kept entries
    keep = torch.ones(keys.shape[:2], dtype=torch.bool, device=keys.device)
    masked = getattr(module, "masked_key_indices", None)  # AdaKV, DuoAttention: entries masked, not removed
    if masked is not None:
        _, heads, positions = masked
        keep[heads, positions] = False
        module.masked_key_indices = None
    return [k[m] for k, m in zip(keys, keep)], [v[m] for v, m in zip(values, keep)]


@torch.no_grad()
def kept_rows(model, prefill: Prefill, press) -> tuple[list, float]:
    """Per layer, the kept rows of one cell (its press's hook run on the recorded prefill; None for a sliding
    layer, which no press prunes), and the cell's compression ratio as the per-cell path reads it (0 for the full
    cache)."""
    modules = attention_modules(model)
    if press is None:
        return [
            None if i in prefill.sliding else (list(k[0]), list(v[0]))
            for i, (k, v) in enumerate(zip(prefill.keys, prefill.values))
        ], 0.0
    cache = DynamicCache()
    cache.layers = [_dense_layer(k, v) for k, v in zip(prefill.keys, prefill.values)]
    rows = []
    with press(model):
        for module, kwargs in zip(modules, prefill.kwargs):
            if module.layer_idx in prefill.sliding:
                rows.append(None)
                continue
            module.masked_key_indices = None
            press.forward_hook(module, (), {**kwargs, "past_key_values": cache}, (None, None))
            rows.append(_rows(cache.layers[module.layer_idx], module))
            cache.layers[module.layer_idx] = None  # freed as soon as its rows are taken
    return rows, float(press.compression_ratio)


def batched_cache(cells: list[list], heads: int, prefill: Prefill) -> DynamicCache:
    """One cache whose batch row i holds cell i's kept entries, layer by layer (a sliding layer: its bounded
    prefill layer, repeated for every row)."""
    cache = DynamicCache()
    cache.layers = [
        _repeated(prefill.sliding[layer], len(cells))
        if layer in prefill.sliding
        else PrunedLayer.from_rows(
            [k for cell in cells for k in cell[layer][0]],
            [v for cell in cells for v in cell[layer][1]],
            heads,
            prefill.length,
        )
        for layer in range(len(cells[0]))
    ]
    return cache


def _repeated(layer: DynamicLayer, batch: int) -> DynamicLayer:
    """A copy of a one-sample dense layer with `batch` rows (the prefill's own layer is left as it is)."""
    rows = copy.copy(layer)
    rows.batch_repeat_interleave(batch)
    return rows


@torch.no_grad()
def decode(model, cache, question_ids: torch.Tensor, context_length: int, max_new_tokens: int) -> list[list[int]]:
    """Greedy answers of every row, as kvpress's pipeline decodes one: the question at positions after the
    context, then one token at a time until an end-of-sequence token (kept) or max_new_tokens."""
    batch = next(layer for layer in cache.layers if isinstance(layer, PrunedLayer)).removed_shape[0]
    positions = torch.arange(context_length, context_length + question_ids.shape[1], device=model.device)
    positions = positions.expand(batch, -1)
    logits = model(
        input_ids=question_ids.expand(batch, -1), past_key_values=cache, position_ids=positions, logits_to_keep=1
    ).logits
    stop = model.generation_config.eos_token_id
    stop = torch.tensor(stop if isinstance(stop, list) else [stop], device=model.device)
    tokens = [logits[:, -1].argmax(-1)]
    done = torch.isin(tokens[-1], stop)
    next_position = positions[:, -1:] + 1
    for step in range(max_new_tokens - 1):
        if bool(done.all()):
            break
        logits = model(input_ids=tokens[-1][:, None], past_key_values=cache, position_ids=next_position + step).logits
        tokens.append(logits[:, -1].argmax(-1))
        done |= torch.isin(tokens[-1], stop)
    stops, answers = set(stop.tolist()), []
    for row in torch.stack(tokens, 1).tolist():
        end = next((i for i, token in enumerate(row) if token in stops), len(row) - 1)
        answers.append(row[: end + 1])
    return answers


def run_greedy_shared(
    model, tokenizer, rows: pd.DataFrame, presses: list, decode_batch: int = 16
) -> list[pd.DataFrame]:
    """`job.run_greedy` for many cells at once: per sample, one prefill and one decode per `decode_batch` cells.
    Returns one outputs frame per press (None: the full cache), in order."""
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device=model.device)
    use_kvzap_attention(model)  # the batched cache is read by the "kvzap" attention
    heads = model.config.num_key_value_heads
    out = [[] for _ in presses]
    for row in tqdm(list(rows.itertuples()), desc=f"samples ({len(presses)} cells, one prefill each)"):
        # the pipeline's own chat template, question suffix and truncation, as the per-cell path gets them
        options = pipe._sanitize_parameters(question=row.question, answer_prefix=row.answer_prefix)[0]
        inputs = pipe.preprocess(row.context, **options)
        context_ids = inputs["context_ids"].to(model.device)
        prefill = record(model, context_ids)
        for first in range(0, len(presses), decode_batch):
            chosen = [kept_rows(model, prefill, press) for press in presses[first : first + decode_batch]]
            cache = batched_cache([rows_ for rows_, _ in chosen], heads, prefill)
            answers = decode(
                model, cache, inputs["questions_ids"][0].to(model.device), prefill.length, int(row.max_new_tokens)
            )
            for i, ((kept, ratio), answer) in enumerate(zip(chosen, answers)):
                text = tokenizer.decode(answer, skip_special_tokens=True)
                memory = {"kv_bytes": kept_bytes(kept, prefill), "full_kv_bytes": prefill.nbytes}
                out[first + i].append(
                    {"sample_id": row.sample_id, "prediction": text, "compression_ratio": ratio, **memory}
                )
    return [pd.DataFrame(cell) for cell in out]
