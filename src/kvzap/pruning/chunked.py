"""Chunked prefill: a long prompt goes through the base model `chunk` tokens at a time over one cache.

With a press pruning between chunks, each chunk attends to the cache already pruned, so the prefill's peak
memory is the kept cache plus one chunk's activations, and its attention work follows the kept count. The
base model's forward is wrapped (for the press's context only); positions continue across chunks and the
chunks' final hidden states are written into one (B, T, D) output, as the whole-prompt forward returns.
Chunks are counted from the prompt's end (the first one is the short one), so in a left-padded batch every
row meets the same chunk boundaries as it would alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from transformers import DynamicCache, PreTrainedModel

from kvzap.introspection import decoder


def check_chunk(chunk) -> None:
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"prefill_chunk must be None or an integer >= 1 (tokens per prefill chunk), got {chunk!r}")


@contextmanager
def chunked_prefill(model: PreTrainedModel, chunk: int, judging: Callable[[bool], None]) -> Iterator[None]:
    """While active, a prefill (empty cache) longer than `chunk` runs chunk by chunk; `judging(True)` is called
    before the chunks and `judging(False)` after them, so the press knows to judge chunks 2.. as well."""
    base = decoder(model)  # kvpress's pipeline calls the decoder directly for the context
    forward = base.forward
    signature = inspect.signature(forward)
    extra = next((p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None)

    def chunked_forward(*args, **kwargs):
        bound = signature.bind(*args, **kwargs).arguments
        named = {**bound, **bound.pop(extra, {})}
        tokens = _tokens(named)
        cache = named.get("past_key_values")
        use_cache = named.get("use_cache")
        use_cache = base.config.use_cache if use_cache is None else use_cache
        if (
            tokens is None
            or tokens.shape[1] <= chunk
            or not use_cache
            or (cache is not None and cache.get_seq_length() > 0)
        ):
            return forward(*args, **kwargs)
        named["past_key_values"] = DynamicCache(config=base.config) if cache is None else cache
        judging(True)
        try:
            return _run_chunks(forward, base.config, named, tokens.shape[1], chunk)
        finally:
            judging(False)

    had_own = "forward" in vars(base)
    base.forward = chunked_forward
    try:
        yield
    finally:
        if had_own:
            base.forward = forward
        else:
            del base.forward


def _run_chunks(forward, config, named: dict, length: int, chunk: int):
    for flag in ("output_attentions", "output_hidden_states"):
        if named.get(flag, getattr(config, flag, False)):
            raise NotImplementedError(f"Chunked prefill returns the last hidden states only: {flag} is not supported.")
    mask = named.get("attention_mask")
    if mask is not None:
        _check_left_padding(mask)
    positions, cache_positions = named.get("position_ids"), named.get("cache_position")
    hidden = None
    for end in range(length % chunk or chunk, length + 1, chunk):
        begin = max(end - chunk, 0)
        part = dict(named)
        for key in ("input_ids", "inputs_embeds"):
            if named.get(key) is not None:
                part[key] = named[key][:, begin:end]
        if mask is not None:
            part["attention_mask"] = mask[:, :end]
        if positions is not None:
            part["position_ids"] = positions[..., begin:end]
        part["cache_position"] = (
            cache_positions[begin:end]
            if cache_positions is not None
            else torch.arange(begin, end, device=_tokens(named).device)
        )
        out = forward(**part)
        states = out.last_hidden_state
        if hidden is None:
            hidden = states.new_empty(states.shape[0], length, states.shape[-1])
        hidden[:, begin:end] = states
    out.last_hidden_state = hidden
    return out


def _check_left_padding(mask: torch.Tensor) -> None:
    """A (B, T) mask of ones after each row's padding, and at least one token per row."""
    if mask.dim() != 2:
        raise NotImplementedError(f"Chunked prefill takes a 2D attention mask (batch, tokens), got {mask.dim()}D.")
    ones = mask.bool()
    if not torch.equal(ones, ones.cummax(-1).values):
        raise NotImplementedError(
            "Chunked prefill takes left-padded batches only (padding before each row's tokens, as generate uses)."
        )
    if not bool(ones[:, -1].all()):
        raise ValueError("A row of the batch is all padding: give every row a token.")


def _tokens(named: dict) -> torch.Tensor | None:
    return named["input_ids"] if named.get("input_ids") is not None else named.get("inputs_embeds")
