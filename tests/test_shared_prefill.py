"""One prefill and one batched decode for many cells (kvzap.evaluation.shared_prefill) against the per-cell path:
kvpress's pipeline, one press at a time, which stays the reference."""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest
import torch
from kvpress.presses.knorm_press import KnormPress
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from kvzap.evaluation import job, methods, presses, shared_prefill
from kvzap.evaluation.spec import CellSpec, JobError, JobSpec, parse_cell
from kvzap.pruning import KVzapPress
from kvzap.pruning.cache import PrunedLayer
from kvzap.surrogate.model import Surrogate
from tiny_models import TEXT, TINY_SIZES, tiny_model, tiny_tokenizer

# head_dim 32: AdaKV's masking (kvpress's fake keys) needs more dimensions than the usual tiny model's 16
SHAPE = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32)
VALUES = {"threshold": (-0.5, 0.0), "ratio": (0.5,), "none": (None,)}
SHARED = [name for name, info in methods.METHODS.items() if info.shares_prefill and not info.needs_hub]


def _cells() -> list[tuple[str, float | None]]:
    cells = [(name, value) for name in SHARED for value in VALUES[methods.METHODS[name].parameter]]
    return cells + [("knorm", 0.25), ("streaming_llm", 0.75)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("shared")
    torch.manual_seed(0)
    Surrogate(SHAPE["hidden_size"], 2, 2).save_pretrained(root / "linear")
    Surrogate(SHAPE["hidden_size"], 2, 2, hidden_dim=16).save_pretrained(root / "mlp")
    return {"linear": root / "linear", "mlp": root / "mlp"}


def _rows(n: int = 3) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "sample_id": f"s{i}",
                "context": TEXT[i * 11 :] * 2,
                "question": "What is the special magic number?",
                "answer_prefix": " Answer:",
                "max_new_tokens": 10,
            }
            for i in range(n)
        ]
    )


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_one_prefill_and_one_batch_answer_as_every_cell_alone(family, setup):
    tok = tiny_tokenizer()
    model = tiny_model(family, len(tok), **SHAPE)
    rows, cells = _rows(), _cells()
    reference = []
    for name, value in cells:  # each press alone, under the attention its job would load
        model.config._attn_implementation = methods.METHODS[name].attn_implementation or "sdpa"
        reference.append(job.run_greedy(model, tok, rows, presses.build(name, value, setup)))
    model.config._attn_implementation = "sdpa"
    built = [presses.build(name, value, setup) for name, value in cells]
    shared = shared_prefill.run_greedy_shared(model, tok, rows, built, decode_batch=6)  # several batches
    for (name, value), alone, together in zip(cells, reference, shared):
        assert together["prediction"].tolist() == alone["prediction"].tolist(), (name, value)
        assert together["compression_ratio"].tolist() == pytest.approx(alone["compression_ratio"].tolist()), name
    answers = {tuple(frame["prediction"]) for frame in reference}
    assert len(answers) > 3, "the cells' caches differ, so must some of their answers"
    assert len(cells) >= 20


def test_from_rows_attends_over_exactly_its_rows():
    torch.manual_seed(1)
    heads, group, dim, seen = 2, 3, 8, 40
    lengths = [5, 17, 0, 9]  # two batch rows x two kv-heads; a row may keep nothing
    keys = [torch.randn(n, dim) for n in lengths]
    values = [torch.randn(n, dim) for n in lengths]
    layer = PrunedLayer.from_rows(keys, values, heads, seen)
    assert layer.get_seq_length() == seen and layer.removed.tolist() == [[seen - 5, seen - 17], [seen, seen - 9]]
    new_k, new_v = torch.randn(2, heads, 1, dim), torch.randn(2, heads, 1, dim)
    layer.update(new_k, new_v)
    query = torch.randn(2, heads * group, 1, dim)
    out = layer.attend(query, None, dim**-0.5)  # (B, T, Hq, D)
    for b in range(2):
        for q_head in range(heads * group):
            r = b * heads + q_head // group
            k = torch.cat([keys[r], new_k[b, q_head // group]])
            v = torch.cat([values[r], new_v[b, q_head // group]])
            expected = torch.softmax(query[b, q_head] @ k.T * dim**-0.5, -1) @ v
            torch.testing.assert_close(out[b, 0, q_head], expected[0], rtol=1e-5, atol=1e-6)


def test_a_group_job_writes_what_each_cell_alone_writes(tmp_path, setup):
    """Samples batched two at a time in the group, one at a time alone: the same bytes, but for the attention that
    served them: kvzap's kernels over the group's batched pruned cache serve each of its cells, sdpa a cell alone
    (kvpress's presses drop entries from a dense cache)."""
    tok = tiny_tokenizer()
    model = tiny_model("llama", len(tok), max_position_embeddings=2048, **SHAPE)
    model.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    model_json = tmp_path / "model.json"
    model_json.write_text(json.dumps({"model_id": "tiny", "path": str(tmp_path / "hf"), "revision": "r0"}))
    cells, subsets = ["full", "knorm=0.5", "streaming_llm=0.5"], ["256", "300"]

    def run(cell_tokens, out_root, batch_size=1):
        """The job as its rule runs it: its spec's JSON on the command line."""
        cells = [CellSpec(*parse_cell(c), {s: str(out_root / c / s) for s in subsets}) for c in cell_tokens]
        spec = JobSpec(str(model_json), "ruler", tuple(subsets), tuple(cells), "m", "r", tasks=("niah_single_2",))
        # byte equality: bf16 rounds a batch's rows differently
        spec = replace(spec, n_samples=3, max_new_tokens=4, dtype="float32", decode_batch=2, batch_size=batch_size)
        job.main(["--spec", spec.to_json()])

    run(cells, tmp_path / "group", batch_size=4)  # 2 samples x 2 cells per decode
    for cell in cells:
        run([cell], tmp_path / "alone")
    served = {"group": (["kvzap"], ["decode", "flash"]), "alone": (["sdpa"], [])}
    for cell in cells:
        for subset in subsets:
            group, alone = (tmp_path / root / cell / subset for root in ("group", "alone"))
            assert (group / "predictions.csv").read_bytes() == (alone / "predictions.csv").read_bytes(), (cell, subset)
            metrics = {
                root: json.loads((tmp_path / root / cell / subset / "metrics.json").read_text()) for root in served
            }
            for root, (implementations, kernels) in served.items():
                attention = metrics[root].pop("attention")
                assert (attention["implementations"], attention["segment_kernels"]) == (implementations, kernels)
            assert metrics["group"] == metrics["alone"], (cell, subset)


def _spec(tmp_path, cells, **settings) -> JobSpec:
    cells = tuple(CellSpec(*parse_cell(c), {"256": str(tmp_path / str(i))}) for i, c in enumerate(cells))
    return JobSpec(
        **{"model": "m.json", "benchmark": "ruler", "subsets": ("256",), "cells": cells, **settings},
        model_name="m",
        bench_name="r",
    )


def test_a_group_refuses_a_method_with_its_own_prefill(tmp_path):
    with pytest.raises(JobError, match="Only methods that prune after attention share a job"):
        job.evaluate(_spec(tmp_path, ["full", "kvzip=0.5"]))


@pytest.mark.parametrize(
    "cells, settings, message",
    [
        (["kvzapp=1"], {}, "unknown method 'kvzapp'"),
        (["knorm=half"], {}, "'half' is not a number"),
        (["full", "knorm=0.5"], {"decode_batch": 0}, "decode_batch 0: must be a whole number of at least 1"),
        (["full"], {"benchmark": "rulr"}, "benchmark 'rulr': unknown"),
        (["full"], {"shard": 2, "n_shards": 2}, "shard 2: must be one of 0..1"),
    ],
)
def test_bad_cells_and_batches_are_refused_with_the_fix(tmp_path, cells, settings, message):
    with pytest.raises(JobError, match=message):
        _spec(tmp_path, cells, **settings)


def test_a_spec_reads_back_what_it_wrote_and_refuses_what_it_does_not_know(tmp_path):
    spec = _spec(tmp_path, ["full", "knorm=0.5"], tasks=("vt",), decode_batch=2)
    assert JobSpec.read(spec.to_json()) == spec
    (tmp_path / "spec.json").write_text(spec.to_json())
    assert JobSpec.read(str(tmp_path / "spec.json")) == spec
    raw = json.loads(spec.to_json())
    with pytest.raises(JobError, match=r"unknown keys \['n_sample'\]"):
        JobSpec.read(json.dumps({**raw, "n_sample": 3}))
    with pytest.raises(JobError, match="no output folder for subsets \\['300'\\]"):
        JobSpec.read(json.dumps({**raw, "subsets": ["256", "300"]}))
    with pytest.raises(JobError, match="missing 1 required positional argument: 'model'"):
        JobSpec.read(json.dumps({k: v for k, v in raw.items() if k != "model"}))


def _hybrid_model(tok, window: int):
    """Gemma 3's layout in two layers: a sliding-window layer, then a full-attention one."""
    hybrid = dict(sliding_window=window, layer_types=["sliding_attention", "full_attention"])
    config = AutoConfig.for_model("gemma3_text", vocab_size=len(tok), **{**TINY_SIZES, **SHAPE, **hybrid})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval().requires_grad_(False)


def test_a_hybrid_model_shares_its_sliding_layers_across_cells():
    """Gemma 3's layout: a sliding layer (window far shorter than the contexts) keeps its bounded cache, copied
    for every row; the full layer holds each cell's kept entries. Answers equal the per-cell path's."""
    tok = tiny_tokenizer()
    model = _hybrid_model(tok, window=8)
    rows = _rows()
    cache = DynamicCache()
    model(tok(rows.context[0], return_tensors="pt").input_ids, past_key_values=cache)
    norms = cache.layers[1].keys.norm(dim=-1).flatten()  # Knorm's score is minus the key norm
    taus = [-norms.quantile(q).item() for q in (0.8, 0.5, 0.2)]
    cells = [None] + [KVzapPress(KnormPress(), threshold=tau, window=4) for tau in taus]
    reference = [job.run_greedy(model, tok, rows, press) for press in cells]
    shared = shared_prefill.run_greedy_shared(model, tok, rows, cells, decode_batch=3)
    for alone, together in zip(reference, shared):
        assert together["prediction"].tolist() == alone["prediction"].tolist()
        assert together["compression_ratio"].tolist() == pytest.approx(alone["compression_ratio"].tolist())
    ratios = [frame["compression_ratio"].mean() for frame in shared]
    assert ratios[0] == 0 and 0.05 < ratios[1] < ratios[2] < ratios[3] < 0.95, ratios


def _uneven_rows() -> pd.DataFrame:
    """Samples of different context lengths, question lengths and answer budgets (RULER mixes tasks in a cell)."""
    questions = ["What is the number?", "What is the special magic number for the long key mentioned above?"]
    return pd.DataFrame(
        [
            {
                "sample_id": f"u{i}",
                "context": TEXT[i * 37 :] * (1 + i % 3),
                "question": questions[i % 2] + " x" * (i % 4),
                "answer_prefix": " Answer:",
                "max_new_tokens": (6, 12, 9)[i % 3],
            }
            for i in range(5)
        ]
    )


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_samples_decoded_together_answer_as_each_sample_alone(family, setup):
    """Several samples per decode (left-padded contexts, ragged questions and answer budgets): every cell's answers,
    ratios and bytes equal those of one sample at a time, and of kvpress's per-cell pipeline."""
    tok = tiny_tokenizer()
    model = tiny_model(family, len(tok), **SHAPE)
    rows = _uneven_rows()
    lengths = {len(tok(context).input_ids) for context in rows.context}
    assert len(lengths) == len(rows), "the samples' contexts must differ in length"
    cells = [("full", None), ("kvzap_mlp", -0.5), ("kvzap_linear", 0.0), ("knorm", 0.5), ("kvzap_mlp_head", 0.5)]
    built = [presses.build(name, value, setup) for name, value in cells]
    alone = shared_prefill.run_greedy_shared(model, tok, rows, built, decode_batch=2, samples=1)
    together = shared_prefill.run_greedy_shared(model, tok, rows, built, decode_batch=2, samples=3)
    for (name, _), one, many in zip(cells, alone, together):
        pd.testing.assert_frame_equal(one, many, obj=name)
    reference = job.run_greedy(model, tok, rows, presses.build("kvzap_mlp", -0.5, setup))
    assert together[1]["prediction"].tolist() == reference["prediction"].tolist()
    assert len({len(answer) for answer in together[0]["prediction"]}) > 1, "the rows must end at different steps"


def test_a_hybrid_models_samples_decode_together_with_their_sliding_windows_padded():
    """Gemma 3's layout with samples shorter and longer than the sliding window: answers equal one sample at a time."""
    tok = tiny_tokenizer()
    model = _hybrid_model(tok, window=48)
    rows = _uneven_rows()
    rows.loc[0, "context"] = TEXT[:60]  # fewer tokens than the window
    assert min(len(tok(context).input_ids) for context in rows.context) < 48
    cells = [None, KVzapPress(KnormPress(), threshold=-1.0, window=4), KnormPress(0.5)]
    alone = shared_prefill.run_greedy_shared(model, tok, rows, cells, samples=1)
    together = shared_prefill.run_greedy_shared(model, tok, rows, cells, samples=5)
    for one, many in zip(alone, together):
        pd.testing.assert_frame_equal(one, many)
    reference = job.run_greedy(model, tok, rows, None)
    assert together[0]["prediction"].tolist() == reference["prediction"].tolist()


def test_a_padded_sliding_window_is_hidden_from_the_question():
    """Logits, not just answers (a tiny model's argmax rarely moves): the question of a sample shorter than the
    window, decoded beside a longer one, sees only its own entries."""
    tok = tiny_tokenizer()
    model = _hybrid_model(tok, window=48)
    shared_prefill.use_kvzap_attention(model)
    contexts = [tok(text, return_tensors="pt").input_ids for text in (TEXT[:60], TEXT[:900])]
    prefills = [shared_prefill.record(model, ids) for ids in contexts]
    question = tok(" What is the number?").input_ids

    def logits(chosen: list) -> torch.Tensor:
        groups = [(p, [shared_prefill.kept_rows(model, p, None)]) for p in chosen]
        cache = shared_prefill.batched_cache(groups, model.config.num_key_value_heads)
        lengths = [p.length for p in chosen]
        mask = shared_prefill._padding_mask(cache, lengths, model.device)
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones(len(chosen), len(question))], -1)
        positions = torch.tensor(lengths)[:, None] + torch.arange(len(question))
        ids = torch.tensor([question] * len(chosen))
        return model(input_ids=ids, past_key_values=cache, position_ids=positions, attention_mask=mask).logits

    together, alone = logits(prefills), logits(prefills[:1])
    assert prefills[0].length < 48 < prefills[1].length
    torch.testing.assert_close(together[0], alone[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bad", [{"samples": 0}, {"decode_batch": 0}, {"samples": 1.5}])
def test_bad_batch_sizes_are_refused_by_name(bad):
    name = next(iter(bad))
    with pytest.raises(ValueError, match=f"{name} must be a whole number of at least 1"):
        shared_prefill.run_greedy_shared(None, None, _rows(), [None], **bad)
