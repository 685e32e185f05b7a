"""Which attention served a run: the segment kernels' counts (kvzap.pruning.segments), the record observed on a
model (kvzap.evaluation.attention_served) and its union and warning (kvzap.evaluation.attention_record)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from kvzap.evaluation import attention_record
from kvzap.evaluation.attention_served import attention_served
from kvzap.pruning import segments
from tiny_models import tiny_model


def _inputs(new: int, mask: str):
    """Two batch rows of 2 kv heads, queries of G=2 heads over `new` tokens, a 6-token window, and the new tokens'
    mask: none (every query sees all: one new token), causal, or causal with the first query blind to itself
    (no fast kernel takes that)."""
    gen = torch.Generator().manual_seed(0)
    rows, dim, lengths = 4, 8, torch.tensor([3, 0, 5, 2])
    packed = segments.Packed(
        *torch.randn(2, int(lengths.sum()), dim, generator=gen), segments.Rows.segments(lengths, lengths)
    )
    q = torch.randn(rows, 2 * new, dim, generator=gen)
    causal = torch.ones(new, new, dtype=torch.bool).tril().repeat(2, 1)
    if mask == "other":
        causal[1:, 0] = False
    new_mask = None if mask == "none" else causal[None, None]
    return q, packed, segments.Window(*torch.randn(2, rows, 6, dim, generator=gen), new_mask)


@pytest.mark.parametrize("new, mask, kernel", [(1, "none", "decode"), (3, "causal", "flash"), (3, "other", "decode")])
def test_each_cpu_kernel_is_counted_by_name_where_it_is_chosen(new, mask, kernel):
    q, packed, window = _inputs(new, mask)
    before = segments.SERVED[kernel]
    with segments.kernels_served() as outer:
        segments.segment_attention(q, packed, window, 2, 10**9)
        with segments.kernels_served() as inner:
            segments.segment_attention(q, packed, window, 2, 10**9)
            segments.segment_attention(q, packed, window, 2, 10**9, kernel="rows")  # a caller's choice counts too
    assert inner == Counter([kernel, "rows"]) and outer == Counter([kernel, kernel, "rows"])
    assert segments.SERVED[kernel] - before == outer[kernel]  # the process-wide count, read directly


def test_a_models_record_names_the_implementations_its_layers_ran_and_whether_compiled():
    model = tiny_model("llama")
    ids = torch.randint(0, 400, (1, 12), generator=torch.Generator().manual_seed(0))
    with attention_served(model) as served:
        model(ids)
        model.set_attn_implementation("eager")
        model(ids)
    assert served == {
        "implementations": ["eager", "sdpa"],
        "segment_kernels": [],
        "devices": ["cpu"],
        "compiled": False,
    }
    with attention_served(model) as served:
        torch.compile(model, backend="eager")(ids)  # traced by dynamo, run eagerly: the hooks see the tracing
    assert served["compiled"] and served["implementations"] == ["eager"]
    assert not model.model.layers[0].self_attn._forward_pre_hooks  # the block leaves no hook behind


def _record(kernels, devices=("cpu",), implementations=("kvzap",), compiled=False) -> dict:
    return {
        "implementations": list(implementations),
        "segment_kernels": list(kernels),
        "devices": list(devices),
        "compiled": compiled,
    }


def test_a_cells_record_is_the_union_of_its_runs():
    shards = [_record(["decode"]), _record(["flash", "rows"], implementations=["sdpa", "kvzap"], compiled=True)]
    assert attention_record.union(shards) == _record(
        ["decode", "flash", "rows"], implementations=["kvzap", "sdpa"], compiled=True
    )
    assert attention_record.union([shards[0], None]) is None  # a shard written before records: unknown, not partial


@pytest.mark.parametrize(
    "record, flagged",
    [
        (_record(["decode"], ["cuda"]), True),  # varlen unavailable: a float32 model, an older torch
        (_record(["rows"], ["cuda"]), True),  # a record from before the decoding kernel served GPUs
        (_record(["decode", "varlen"], ["cuda"]), False),  # the decoding kernel beside varlen: padded windows
        (_record(["varlen"], ["cuda"]), False),
        (_record(["decode", "flash"]), False),  # a CPU's kernels
        (_record([], ["cuda"], ["sdpa"]), False),  # no pruned layer
    ],
)
def test_only_a_gpu_cell_that_varlen_never_served_is_flagged(record, flagged):
    assert attention_record.varlen_missing_on_gpu(record) == flagged


def test_a_record_reads_as_one_line():
    assert attention_record.describe(_record(["decode", "flash"])) == "kvzap (decode, flash) on cpu"
    assert attention_record.describe(_record([], implementations=["sdpa"])) == "sdpa on cpu"
    assert attention_record.describe(_record(["varlen"], ["cuda"], compiled=True)) == "kvzap (varlen) on cuda, compiled"
    assert attention_record.describe(None) == ""
