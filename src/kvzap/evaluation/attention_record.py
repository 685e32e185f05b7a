"""The attention that served an evaluation cell, as its metrics.json records it (field `attention`), so that a slow
or suspicious cell can be traced to its kernel:

implementations   the attention implementations the model's layers ran under ("kvzap", "sdpa", "eager", ...)
segment_kernels   the kernels of kvzap.pruning.segments that served kvzap's attention over pruned layers ("varlen",
                  "decode", "flash", "rows"); none where no layer was pruned by a KVzap press (the full cache,
                  kvpress's presses, which mask or drop in dense caches, or "kvzap" routing dense layers to sdpa)
compiled          whether any attention call ran under torch.compile
devices           the device types the model ran on ("cpu", "cuda")

Names only, sorted, no call counts: a batched run's calls follow its batches (one per layer per forward, for as
long as the batch's longest sample runs), so counts would differ between an unsplit cell and the merge of its
shards, while the names are what a trace needs. Torch-free: the merge and the report read it.
"""

from __future__ import annotations

FIELD = "attention"
NAMES = ("implementations", "segment_kernels", "devices")
VARLEN_MISSING_ON_GPU = "⚠ no varlen on GPU"


def union(records: list[dict | None]) -> dict | None:
    """The record of a cell served by several runs (its shards, its surrogate seeds): every name any of them used.
    None where one has no record (written before cells recorded their attention): a part would pass for the whole."""
    if any(record is None for record in records):
        return None
    return {
        **{name: sorted(set().union(*(record[name] for record in records))) for name in NAMES},
        "compiled": any(record["compiled"] for record in records),
    }


def varlen_missing_on_gpu(record: dict) -> bool:
    """Whether a GPU cell's pruned layers were served, but never by the fused varlen kernel: it was unavailable there
    (a float32 model, an older torch; one that fails its first-use check stops the job instead), so the decoding
    kernel (or, in records written before it, the row loop) served every forward, at a speed no benchmark has
    measured on a GPU. Beside varlen, the decoding kernel is by design: it serves windows that still hold padding."""
    kernels = record["segment_kernels"]
    return "cuda" in record["devices"] and bool(kernels) and "varlen" not in kernels


def describe(record: dict | None) -> str:
    """One line for a table, e.g. "kvzap (decode, flash) on cpu", "sdpa on cpu", "kvzap (varlen) on cuda, compiled";
    "" for a cell without a record."""
    if record is None:
        return ""
    kernels = f" ({', '.join(record['segment_kernels'])})" if record["segment_kernels"] else ""
    compiled = ", compiled" if record["compiled"] else ""
    return f"{', '.join(record['implementations'])}{kernels} on {', '.join(record['devices'])}{compiled}"
