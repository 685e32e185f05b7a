"""Observe which attention serves a model's forwards (kvzap.evaluation.attention_record says what is recorded).

Observed at the calls, not read from settings: a press switches the implementation for its block and may leave
"kvzap" for the question pass (kvzap.pruning.entry), and only the calls show which kernel served and whether the
step was compiled.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from kvzap.introspection import attention_modules
from kvzap.pruning.segments import kernels_served


@contextmanager
def attention_served(model) -> Iterator[dict]:
    """The attention record of the model's forwards inside the block, filled in when the block ends.

    Each attention module notes, as it is called, the implementation it is about to read from its config and
    whether torch.compile is tracing it (one set insertion per layer and forward)."""
    seen: set[tuple[str, bool]] = set()

    def note(module, args):
        seen.add((module.config._attn_implementation, torch.compiler.is_compiling()))

    handles = [module.register_forward_pre_hook(note) for module in attention_modules(model)]
    record = {}
    try:
        with kernels_served() as kernels:
            yield record
    finally:
        for handle in handles:
            handle.remove()
    record.update(
        implementations=sorted({implementation for implementation, _ in seen}),
        segment_kernels=sorted(kernels),
        devices=[model.device.type],
        compiled=any(compiled for _, compiled in seen),
    )
