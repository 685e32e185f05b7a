"""kvpress baselines on hybrid sliding-window models, and what cannot run there refused before any job.

A tiny Gemma 3 (one sliding layer with a window far shorter than the prompts, one full layer, in either order):
each baseline, built by `presses.build` and prefilled into the cache the job gives kvpress's pipeline, leaves the
sliding layer as the plain model leaves it, removes its set ratio from the full layer, and answers the question as
one forward over context and question that masks the removed entries does. The plan refuses, with the model, the
method and the fix, every method a family's config rules out; the jobs refuse the same from the loaded config.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from huggingface_hub import constants
from tests.rehearsal.hub_cache import write_repo
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, pipeline
from transformers.cache_utils import DynamicSlidingWindowLayer

from kvzap import families
from kvzap.evaluation import job, merge, presses, refusals, shared_prefill
from kvzap.evaluation.prefill_cache import prefill_cache
from kvzap.evaluation.spec import CellSpec, JobError, JobSpec, parse_cell
from kvzap.introspection import attention_modules
from kvzap.layer_types import pruned_layers, skipped_layers
from kvzap.plan import errors, model_configs
from kvzap.prepare.assets import OFFLINE_MODELS
from kvzap.report import aggregate
from plan_helpers import BASE, planned
from tiny_models import TEXT, TINY_SIZES, tiny_tokenizer

TOK = tiny_tokenizer()
# head_dim 32: AdaKV's masking (kvpress's fake keys) needs more dimensions than the usual tiny model's 16
SHAPE = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32)
WINDOW = 16
SLIDING_FIRST = ["sliding_attention", "full_attention"]  # Gemma 3's order: the model reads positions from layer 0
FULL_FIRST = ["full_attention", "sliding_attention"]
BASELINES = ["knorm", "snapkv", "streaming_llm", "expected_attention"]
RATIO = 0.5
QUESTION = " What is the special magic number?"


def hybrid(layer_types=SLIDING_FIRST, model_type="gemma3_text"):
    sizes = {**TINY_SIZES, **SHAPE, "sliding_window": WINDOW, "layer_types": layer_types}
    config = AutoConfig.for_model(model_type, vocab_size=len(TOK), **sizes)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval().requires_grad_(False)


def _kept(layer, dense, module) -> torch.Tensor:
    """(H, T) entries a press kept: gathered (physical) or not masked (AdaKV)."""
    if layer.keys.shape == dense.keys.shape:
        kept = torch.ones(dense.keys.shape[1:3], dtype=torch.bool)
        if module.masked_key_indices is not None:
            _, heads, positions = module.masked_key_indices
            kept[heads, positions] = False
        return kept
    return (dense.keys[0][:, :, None] == layer.keys[0][:, None]).all(-1).any(-1)


def _masked_forward(model, ids, question, kept: torch.Tensor) -> torch.Tensor:
    """Question logits of one forward over context + question: causal, the sliding layers within their window, the
    full layer's question rows blind to the entries its press removed."""
    n, total = ids.shape[1], ids.shape[1] + question.shape[1]
    q, k = torch.arange(total)[:, None], torch.arange(total)[None]
    causal = k <= q
    group = model.config.num_attention_heads // kept.shape[0]
    full_mask = causal.repeat(model.config.num_attention_heads, 1, 1)
    full_mask[:, n:, :n] &= kept.repeat_interleave(group, 0)[:, None]
    masks = {"full_attention": full_mask[None], "sliding_attention": (causal & (q - k < WINDOW))[None, None]}
    return model(torch.cat([ids, question], 1), attention_mask=masks).logits[:, n:]


@pytest.mark.parametrize("layout", [SLIDING_FIRST, FULL_FIRST], ids=["sliding-first", "full-first"])
@pytest.mark.parametrize("name", BASELINES)
def test_a_baseline_prunes_the_full_layer_only_and_attends_as_the_masked_model(name, layout):
    model = hybrid(layout)
    ids = TOK(TEXT[:300], return_tensors="pt").input_ids
    question = TOK(QUESTION, return_tensors="pt").input_ids
    n = ids.shape[1]
    assert n > 4 * WINDOW
    plain = DynamicCache(config=model.config)
    model.model(input_ids=ids, past_key_values=plain)
    press = presses.build(name, RATIO, {})
    cache = prefill_cache(model, press)
    with press(model):
        model.model(input_ids=ids, past_key_values=cache)
    (sliding,), (full,) = skipped_layers(model.config), pruned_layers(model.config)
    assert isinstance(cache.layers[sliding], DynamicSlidingWindowLayer)
    assert torch.equal(cache.layers[sliding].keys, plain.layers[sliding].keys)
    assert torch.equal(cache.layers[sliding].values, plain.layers[sliding].values)
    kept = _kept(cache.layers[full], plain.layers[full], attention_modules(model)[full])
    assert kept.sum() == kept.shape[0] * int(n * (1 - RATIO))  # per head, or (AdaKV) as many over the heads
    logits = model(input_ids=question, past_key_values=cache, position_ids=torch.arange(n, n + question.shape[1])[None])
    torch.testing.assert_close(logits.logits, _masked_forward(model, ids, question, kept), atol=1e-4, rtol=1e-4)


def _rows(n: int = 2) -> pd.DataFrame:
    contexts = [TEXT[i * 13 :] for i in range(n)]
    return pd.DataFrame(
        [
            {"sample_id": f"s{i}", "context": c, "question": QUESTION, "answer_prefix": " Answer:", "max_new_tokens": 4}
            for i, c in enumerate(contexts)
        ]
    )


def test_the_job_path_answers_and_counts_the_bytes_of_every_layer():
    """Per-cell path (kvpress's pipeline) and prefill group agree on answers and, for presses that remove entries,
    on bytes: the sliding window is held whole, the full layer keeps its ratio's share."""
    model, rows = hybrid(), _rows()
    cells = {"full": None, **{name: presses.build(name, RATIO, {}) for name in BASELINES}}
    alone = {name: job.run_greedy(model, TOK, rows, press) for name, press in cells.items()}
    removing = [name for name in cells if name != "expected_attention"]  # AdaKV masks: the group drops, kvpress holds
    together = shared_prefill.run_greedy_shared(model, TOK, rows, [cells[name] for name in removing])
    for name, shared in zip(removing, together):
        assert alone[name].equals(shared), name
    assert all(text for frame in alone.values() for text in frame["prediction"])
    assert all(alone[name]["compression_ratio"].tolist() == [RATIO] * len(rows) for name in BASELINES)
    position = 2 * SHAPE["num_key_value_heads"] * SHAPE["head_dim"] * 4  # key + value bytes of one float32 position
    window = (WINDOW - 1) * position  # transformers keeps the last window - 1 positions
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=TOK, device=model.device)
    for i, row in enumerate(rows.itertuples()):
        n = pipe.preprocess(row.context, **pipe._sanitize_parameters(question=row.question)[0])["context_ids"].shape[1]
        assert alone["full"].kv_bytes[i] == alone["full"].full_kv_bytes[i] == window + n * position
        assert alone["knorm"].kv_bytes[i] == window + int(n * (1 - RATIO)) * position
        assert alone["knorm"].full_kv_bytes[i] == alone["full"].full_kv_bytes[i]
        assert alone["expected_attention"].kv_bytes[i] == alone["full"].kv_bytes[i]  # kvpress's masking frees nothing


def _config(model_type: str, **fields) -> SimpleNamespace:
    """A model stand-in for the run-time checks, which read only its config."""
    return SimpleNamespace(config=AutoConfig.for_model(model_type, **fields))


@pytest.mark.parametrize(
    "model_type, fields, reason",
    [
        ("gemma3_text", {}, "KVzipPress is not supported for Gemma3ForCausalLM"),
        ("cohere2", {"layer_types": SLIDING_FIRST, "num_hidden_layers": 2}, "cuts each layer's cache back"),
    ],
)
def test_kvzip_on_a_hybrid_is_refused_when_its_press_starts(model_type, fields, reason):
    for name in families.KVZIP:
        with pytest.raises(ValueError, match=f"KVzipPress cannot run on this {model_type} model: .*{reason}"):
            with presses.build(name, RATIO, {})(_config(model_type, **fields)):
                pass


def test_a_baseline_on_a_model_whose_layers_all_slide_is_refused_when_its_press_starts():
    with pytest.raises(ValueError, match="KnormPress cannot run on this mistral model: every layer is sliding"):
        with presses.build("knorm", RATIO, {})(_config("mistral", sliding_window=4096)):
            pass


@pytest.mark.parametrize(
    "model_type, method, reason",
    [
        ("gpt_oss", "kvzap_mlp", "uses attention sinks"),
        ("gpt_oss", "expected_attention", "runs eager attention"),
        ("gemma2", "kvzap_linear", "uses soft-capped logits"),
        ("gemma2", "pyramidkv", "uses soft-capped logits"),
        ("gemma3_text", "kvzip_plus", "KVzipPress is not supported for Gemma3ForCausalLM"),
    ],
)
def test_a_job_refuses_what_its_model_cannot_run(model_type, method, reason):
    refusal = f"cannot run on model m \\({model_type}\\): .*{reason}.*Fix: add {method} to models.m.skip_methods"
    with pytest.raises(JobError, match=refusal):
        job.check_family(_config(model_type), "m", ["full", method])


def _loaded(cells, runs_per_cell=1):
    return job.Loaded(cells, [[(None, None)] * runs_per_cell for _ in cells], None, None, None, None)


def test_a_group_runs_cell_by_cell_where_the_batched_decode_would_drop_soft_caps_or_sinks():
    group = _loaded([("full", None), ("knorm", RATIO)])
    assert job.shares_prefill(_config("gemma3_text"), group) and job.shares_prefill(_config("llama"), group)
    assert not job.shares_prefill(_config("gemma2"), group) and not job.shares_prefill(_config("gpt_oss"), group)


def test_one_cell_with_several_surrogate_seeds_shares_its_prefill():
    assert job.shares_prefill(_config("llama"), _loaded([("kvzap_mlp", -4.0)], runs_per_cell=3))
    assert not job.shares_prefill(_config("llama"), _loaded([("kvzap_mlp", -4.0)]))
    assert not job.shares_prefill(_config("llama"), _loaded([("kvzip", RATIO)], runs_per_cell=3))


# config.json of Hub models, as the Hub serves them (the keys kvzap.families reads)
HUB_CONFIGS = {
    "google/gemma-3-1b-it": {"model_type": "gemma3_text", "num_hidden_layers": 26, "sliding_window_pattern": 6},
    "openai/gpt-oss-20b": {"model_type": "gpt_oss", "num_hidden_layers": 2, "layer_types": SLIDING_FIRST},
    "google/gemma-2-2b-it": {"model_type": "gemma2", "num_hidden_layers": 26, "attn_logit_softcapping": 50.0},
    "CohereLabs/c4ai-command-r7b-12-2024": {"model_type": "cohere2", "num_hidden_layers": 2, "layer_types": FULL_FIRST},
    "deepseek-ai/DeepSeek-V2-Lite-Chat": {"model_type": "deepseek_v2", "num_hidden_layers": 27, "kv_lora_rank": 512},
    "ai21labs/AI21-Jamba-Mini-1.5": {"model_type": "jamba", "num_hidden_layers": 32, "mamba_d_state": 16},
    "Qwen/Qwen3-Next-80B-A3B-Instruct": {
        "model_type": "qwen3_next",
        "num_hidden_layers": 4,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    },
    "mistralai/Ministral-8B-Instruct-2410": {
        "model_type": "mistral",
        "num_hidden_layers": 2,
        "layer_types": ["sliding_attention"] * 2,
    },
    "Qwen/Qwen3-8B": {"model_type": "qwen3", "num_hidden_layers": 36, "sliding_window": None},
}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A local Hub cache with HUB_CONFIGS, the Hub itself offline; the planner's lookups start empty."""
    for repo, config in HUB_CONFIGS.items():
        write_repo(tmp_path, repo, {"config.json": json.dumps(config).encode()})
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    model_configs.model_config.cache_clear()
    yield
    model_configs.model_config.cache_clear()


def _plan(model_id: str, methods: list[str], skip: list[str] = ()) -> dict:
    """ci.yaml with another model id, evaluated on the full cache and `methods` (no fixed Table 2 entry)."""
    config = json.loads(json.dumps(BASE))
    config["models"]["smollm2-135m"].update(id=model_id, skip_methods=list(skip))
    config["evaluation"]["methods"] = ["full", *methods]
    config["tables"] = {}
    return planned(config)


def _refused(model_id: str, methods: list[str]) -> str:
    with pytest.raises(errors.ConfigError) as info:
        _plan(model_id, methods)
    return str(info.value)


REFUSED_METHODS = [
    ("google/gemma-3-1b-it", "kvzip", "KVzipPress is not supported for Gemma3ForCausalLM"),
    ("google/gemma-3-1b-it", "kvzip_plus", "KVzipPress is not supported for Gemma3ForCausalLM"),
    ("google/gemma-3-1b-it", "duo_attention_on_the_fly", "without a layer type"),
    ("CohereLabs/c4ai-command-r7b-12-2024", "kvzip", "cuts each layer's cache back"),
    ("openai/gpt-oss-20b", "kvzap_mlp", "uses attention sinks"),
    ("openai/gpt-oss-20b", "adakv_compactor", "runs eager attention"),
    ("google/gemma-2-2b-it", "kvzap_linear", r"uses soft-capped logits \(attn_logit_softcapping=50.0\)"),
    ("google/gemma-2-2b-it", "pyramidkv", "uses soft-capped logits"),
]


@pytest.mark.parametrize("model_id, method, reason", REFUSED_METHODS)
def test_the_plan_refuses_a_method_the_family_cannot_run(hub, model_id, method, reason):
    message = _refused(model_id, [method])
    assert message.startswith(f"Invalid configuration: evaluation.benchmarks.ruler-512.methods = {method!r}: ")
    assert f"cannot run on {model_id} (models.smollm2-135m): " in message
    assert re.search(reason, message), message
    assert message.endswith(f"Fix: add {method} to models.smollm2-135m.skip_methods")
    _plan(model_id, [method], skip=[method])  # the fix is accepted


@pytest.mark.parametrize(
    "model_id, reason",
    [
        (
            "deepseek-ai/DeepSeek-V2-Lite-Chat",
            "deepseek_v2 models: its multi-head latent attention caches a compressed",
        ),
        ("ai21labs/AI21-Jamba-Mini-1.5", "jamba models: it has state-space or linear-attention layers (mamba_d_"),
        ("Qwen/Qwen3-Next-80B-A3B-Instruct", "its layers of type linear_attention keep a recurrent state"),
        ("mistralai/Ministral-8B-Instruct-2410", "every layer is sliding-window (or chunked) attention"),
    ],
)
def test_the_plan_refuses_a_family_out_of_reach(hub, model_id, reason):
    message = _refused(model_id, [])
    assert message.startswith(f"Invalid configuration: models.smollm2-135m.id = {model_id!r}: KVzap cannot serve ")
    assert reason in message and "Fix: remove models.smollm2-135m" in message


def test_the_plan_accepts_what_runs_and_skips_what_it_cannot_read(hub):
    _plan("Qwen/Qwen3-8B", ["kvzip", "kvzap_mlp", "expected_attention", "pyramidkv"])
    _plan("google/gemma-3-1b-it", ["kvzap_mlp", "knorm", "snapkv", "streaming_llm", "expected_attention"])
    _plan("google/gemma-3-27b-it", ["kvzip"])  # not in the cache and the Hub offline: the job refuses it


def test_every_offline_model_has_its_facts():
    assert set(OFFLINE_MODELS) <= set(model_configs.OFFLINE_CONFIGS)
    gemma, smollm = (model_configs.model_config(f"offline/{n}") for n in ("gemma-3-270m", "SmolLM2-135M-Instruct"))
    assert pruned_layers(SimpleNamespace(**gemma)) == [5, 11, 17]
    assert "KVzipPress is not supported" in refusals.refusal(gemma, "kvzip")
    assert refusals.refusal(gemma, "kvzap_mlp") is None and families.out_of_reach(gemma) is None
    assert all(refusals.refusal(smollm, name) is None for name in ("kvzip", "kvzap_mlp", "expected_attention"))


def test_metrics_json_records_the_kv_bytes_beside_the_ratio(tmp_path):
    """A prefill group, a cell alone and a sharded cell's merge each write kv_bytes and full_kv_bytes (means per
    sample); the results table carries them."""
    model = hybrid()
    model.save_pretrained(tmp_path / "hf")
    TOK.save_pretrained(tmp_path / "hf")
    record = tmp_path / "model.json"
    record.write_text(json.dumps({"model_id": "tiny-gemma3", "path": str(tmp_path / "hf"), "revision": "r0"}))

    def run(cells, outs, shard=(0, 1)):
        cells = tuple(CellSpec(*parse_cell(c), {"256": str(out)}) for c, out in zip(cells, outs))
        spec = JobSpec(str(record), "ruler", ("256",), cells, "m", "r", tasks=("niah_single_2",), n_samples=2)
        return job.evaluate(replace(spec, max_new_tokens=4, shard=shard[0], n_shards=shard[1]))

    full, knorm = run(["full", "knorm=0.5"], [tmp_path / "full", tmp_path / "knorm"])
    (snapkv,) = run(["snapkv=0.5"], [tmp_path / "snapkv"])
    shards = [run(["snapkv=0.5"], [tmp_path / f"shard{i}"], shard=(i, 2))[0] for i in range(2)]
    merged = merge.merge([tmp_path / "shard0", tmp_path / "shard1"], tmp_path / "merged")
    assert full["kv_bytes"] == full["full_kv_bytes"] == knorm["full_kv_bytes"] == snapkv["full_kv_bytes"]
    assert knorm["kv_bytes"] == snapkv["kv_bytes"] < full["kv_bytes"] and knorm["compression_ratio"] == RATIO
    assert merged["kv_bytes"] == pytest.approx(sum(s["kv_bytes"] for s in shards) / 2) == snapkv["kv_bytes"]
    row = aggregate.cell_row(tmp_path / "merged" / "metrics.json")
    assert (row["kv_bytes"], row["full_kv_bytes"]) == (merged["kv_bytes"], merged["full_kv_bytes"])
