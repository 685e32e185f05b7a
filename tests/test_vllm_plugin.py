"""The vLLM plugin (plugins/vllm) on vLLM's CPU backend, with the demo's real model (SmolLM2-135M from its PyPI
GGUF, a LlamaForCausalLM) and tiny random models of the paper's other families (Qwen3, Qwen2, Mistral): at tau = -inf
an engine with the plugin generates exactly plain vLLM's tokens; at a fixed tau it generates the transformers path's
tokens and frees the blocks; the scores it computes inside vLLM equal the surrogate's scores of the attention inputs
transformers computes (an independent forward); bad settings and unsupported engine settings are refused by name.
The engine runs in its own environment (vLLM pins transformers >= 5.16, kvpress < 5.3): `make setup-vllm` builds
it, and these tests run it as a subprocess."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from family_models import build
from kvzap.pruning import KVzapPress
from kvzap.surrogate.model import Surrogate
from tiny_models import TEXT, tiny_tokenizer
from vllm_served import (
    VLLM_PYTHON,
    attention_inputs,
    demo_served,
    needs_vllm,
    press_generate,
    press_generate_in_steps,
    score_quantile,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "plugins" / "vllm" / "src"))  # settings and refusals import no vLLM

from kvzap_vllm.architectures import ARCHITECTURES  # noqa: E402
from kvzap_vllm.refusals import attention_refusal, refusal, sliding_refusal  # noqa: E402
from kvzap_vllm.requests import check_request, request_threshold  # noqa: E402
from kvzap_vllm.settings import KVzapSettings  # noqa: E402


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return demo_served(tmp_path_factory)


# The paper's other families, as tiny random models (tests/family_models.py builds them as the family matrix does),
# sized for vLLM's CPU attention kernels: head_dim 64 (Qwen3: 128, as Qwen3-8B), 4 query heads over 2 KV heads.
# Random weights give flat logits; tied embeddings of std 0.15 over a 400-token vocabulary keep greedy decoding
# decisive: the smallest top-2 logit gap of the pruned generations below is 1.9e-3, where vLLM's and transformers'
# float32 logits differ by at most ~3e-5.
FAMILIES = {"qwen3": dict(head_dim=128), "qwen2": {}, "mistral": {}}


@pytest.fixture(scope="module")
def tiny_families(tmp_path_factory):
    """family -> what `demo` holds, for a tiny random model of the family saved to (and loaded back from) a folder,
    built on first use. The surrogate names the folder as its base model, so both sides check it."""
    built = {}

    def get(family: str) -> SimpleNamespace:
        if family not in built:
            folder, name, tokenizer = tmp_path_factory.mktemp(family), f"tiny-{family}", tiny_tokenizer()
            sizes = dict(hidden_size=256, num_attention_heads=4, head_dim=64, intermediate_size=512)
            sizes |= dict(initializer_range=0.15, tie_word_embeddings=True, **FAMILIES[family])
            build(family, 400, **sizes).save_pretrained(folder / name)
            tokenizer.save_pretrained(folder / name)
            model = AutoModelForCausalLM.from_pretrained(folder / name, dtype=torch.float32).eval()
            torch.manual_seed(0)
            config = model.config
            surrogate = Surrogate(config.hidden_size, config.num_key_value_heads, config.num_hidden_layers, 32)
            surrogate.base_model = name
            surrogate.save_pretrained(folder / "surrogate")
            prompts = [tokenizer(TEXT).input_ids[:320], tokenizer("Paul Graham wrote essays about").input_ids]
            built[family] = SimpleNamespace(
                folder=folder, hf=str(folder / name), model=model, surrogate=surrogate, prompts=prompts
            )
        return built[family]

    return get


@pytest.fixture(params=["llama", *FAMILIES])
def served(request):
    """The model an engine test serves: the demo's SmolLM2 (llama), or a tiny random model of another family."""
    if request.param == "llama":
        return request.getfixturevalue("demo")
    return request.getfixturevalue("tiny_families")(request.param)


def run_engine(
    served, name: str, prompts, kvzap: dict | None = None, engine: dict | None = None, extra: tuple = ()
) -> dict:
    (served.folder / f"{name}.prompts.json").write_text(json.dumps(prompts))
    out = served.folder / f"{name}.json"
    command = [str(VLLM_PYTHON), str(ROOT / "tests" / "vllm" / "run_engine.py"), "--model", served.hf]
    command += ["--prompts", str(served.folder / f"{name}.prompts.json"), "--out", str(out)]
    command += ["--kvzap", json.dumps(kvzap)] if kvzap else []
    command += ["--engine", json.dumps(engine)] if engine else []
    command += list(extra)
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(out.read_text())


@needs_vllm
def test_plugin_at_minus_infinity_generates_plain_vllms_tokens(served):
    plain = run_engine(served, "plain", served.prompts)
    kvzap = run_engine(served, "kvzap", served.prompts, {"surrogate": str(served.folder / "surrogate")})
    architecture = type(served.model).__name__  # transformers' class: the architecture vLLM serves
    assert plain["model_class"] == kvzap["model_class"] == f"KVzap{architecture}"  # the override, scoring or not
    assert not plain["has_scorer"] and kvzap["has_scorer"]
    assert kvzap["tokens"] == plain["tokens"]
    assert all(len(tokens) == 16 for tokens in plain["tokens"])  # the prompts do not stop at once


@needs_vllm
def test_scores_inside_vllm_equal_the_surrogates_on_transformers_attention_inputs(demo):
    settings = {"surrogate": str(demo.folder / "surrogate"), "record_scores": True}
    record = run_engine(demo, "scores", demo.prompts[:1], settings)
    scores = torch.load((demo.folder / "scores.json").with_suffix(".scores.pt"))
    ids = torch.tensor([demo.prompts[0] + record["tokens"][0][:-1]])  # the last token is sampled, never fed
    inputs = attention_inputs(demo.model, ids)
    assert sorted(scores) == list(range(demo.model.config.num_hidden_layers))
    for layer, forwards in scores.items():
        positions = torch.cat([p for p, _ in forwards])
        got = torch.cat([s for _, s in forwards])
        assert torch.equal(positions, torch.arange(ids.shape[1]))  # the prefill, then one token per step
        expected = demo.surrogate.score_layer(layer, inputs[layer][None])[0].T  # (tokens, H_kv)
        assert torch.allclose(got, expected, atol=2e-4, rtol=1e-4), (layer, (got - expected).abs().max())


def assert_blocks_fit_the_kept_entries(record) -> dict:
    """Every block cut leaves exactly the blocks a layer's kept entries fill, and all come back at the end; returns
    each (request, layer)'s last (held, dense) block counts."""
    size, last = record["block_size"], {}
    for request, group, removed, seen, held in record["shrinks"]:
        assert held == -(-(seen - removed) // size)
        last[request, group] = (held, -(-seen // size))
    assert record["blocks"]["free_after"] == record["blocks"]["total"] - 1  # all back but vLLM's null block
    return last


@needs_vllm
def test_pruning_in_vllm_generates_the_transformers_tokens_and_frees_the_blocks(served):
    """At a fixed threshold the engine prunes as KVzapLayerFillPress (the same fill policy) does in transformers: the
    same greedy tokens, the same entries removed per (request, layer), and each layer holds exactly the blocks its
    kept entries fill. The prompts cover a prompt judged at prefill and one judged only while decoding. For each of
    the paper's families: the demo's Llama and tiny Qwen3, Qwen2 and Mistral models."""
    prompts = [served.prompts[0], served.prompts[0][100:], served.prompts[1]]
    new_tokens = 150  # past the window for the short prompt too
    tau = score_quantile(served, 0.6)  # every head keeps ~40 %: the fill policy keeps more, KVzap's ratio less
    settings = {"surrogate": str(served.folder / "surrogate"), "threshold": tau}
    extra = ("--max-tokens", str(new_tokens), "--ignore-eos")
    record = run_engine(served, "pruned", prompts, settings, {"block_size": 32}, extra)

    held, dense = (sum(x) for x in zip(*assert_blocks_fit_the_kept_entries(record).values()))
    assert held < 0.9 * dense, (held, dense)  # fewer blocks than the dense cache would hold
    assert record["preemptions"] == []
    for row, prompt in enumerate(prompts):
        tokens, press = press_generate(served, prompt, tau, new_tokens)
        assert record["tokens"][row] == tokens, row
        removed = {layer: counts[0][0] for layer, counts in press.removed_counts.items()}  # (H,) per layer
        assert [int(removed[layer][0]) for layer in sorted(removed)] == record["removed"][str(row)], row
        assert all(bool((removed[layer] == removed[layer][0]).all()) for layer in removed)  # one count per layer
        assert 0 < press.compression_ratio < 0.9, press.compression_ratio  # it pruned, decoding too


def per_head_groups(record: dict, config) -> list[tuple[int, int]]:
    """(layer, KV head) of each KV cache group of a per-head engine's record; every pair has exactly one group."""
    names = [re.fullmatch(r"model\.layers\.(\d+)\.self_attn\.attn\.h(\d+)", group[0]) for group in record["groups"]]
    assert all(names) and all(len(group) == 1 for group in record["groups"]), record["groups"][:3]
    sources = [(int(found.group(1)), int(found.group(2))) for found in names]
    heads = config.num_key_value_heads
    assert sorted(sources) == [(layer, head) for layer in range(config.num_hidden_layers) for head in range(heads)]
    return sources


@needs_vllm
def test_the_per_head_layout_generates_kvzaps_own_tokens_and_frees_each_heads_blocks(served):
    """With `"layout": "per_head"` each (layer, KV head) is its own KV cache group, judged by KVzap's own rule (keep
    an entry iff its score >= tau once out of the window) with no fill: the engine generates KVzapPress's greedy
    tokens (decoding=True, the same window and threshold), removes the same entries per (request, layer, head),
    and each head holds exactly the blocks its kept entries fill. For each of the paper's families."""
    prompts = [served.prompts[0], served.prompts[0][100:], served.prompts[1]]
    new_tokens = 150  # past the window for the short prompt too
    tau = score_quantile(served, 0.6)  # every head keeps ~40 %
    settings = {"surrogate": str(served.folder / "surrogate"), "threshold": tau, "layout": "per_head"}
    extra = ("--max-tokens", str(new_tokens), "--ignore-eos")
    record = run_engine(served, "per-head", prompts, settings, {"block_size": 32}, extra)

    sources = per_head_groups(record, served.model.config)
    held, dense = (sum(x) for x in zip(*assert_blocks_fit_the_kept_entries(record).values()))
    assert held < 0.9 * dense, (held, dense)
    assert record["preemptions"] == []
    uneven = 0
    for row, prompt in enumerate(prompts):
        tokens, press = press_generate(served, prompt, tau, new_tokens, KVzapPress)
        assert record["tokens"][row] == tokens, row
        removed = {layer: counts[0][0] for layer, counts in press.removed_counts.items()}  # (H,) per layer
        assert [int(removed[layer][head]) for layer, head in sources] == record["removed"][str(row)], row
        uneven += sum(bool((removed[layer] != removed[layer][0]).any()) for layer in removed)
        assert 0 < press.compression_ratio < 0.9, press.compression_ratio
    assert uneven > 0  # some layer's heads kept different counts: no fill


@needs_vllm
def test_the_per_head_layout_keeping_every_entry_generates_plain_vllms_tokens(served):
    """A threshold below every score: each (layer, KV head) has its own KV cache group and the compaction runs, but
    keeps every entry, so the per-head attention layers over their own caches generate plain vLLM's greedy tokens.
    (At tau = -inf the plugin does not prune, and the engine keeps vLLM's own layout.)"""
    extra, engine = ("--max-tokens", "40", "--ignore-eos"), {"block_size": 32}
    plain = run_engine(served, "plain-40", served.prompts, None, engine, extra)
    settings = {"surrogate": str(served.folder / "surrogate"), "threshold": -1e30, "layout": "per_head"}
    record = run_engine(served, "per-head-all", served.prompts, settings, engine, extra)
    per_head_groups(record, served.model.config)
    assert record["removed"] and all(count == 0 for counts in record["removed"].values() for count in counts)
    assert record["tokens"] == plain["tokens"]


@needs_vllm
@pytest.mark.parametrize("per_head", [False, True], ids=["per_layer", "per_head"])
@pytest.mark.parametrize(("per_step", "prompt_chunk"), [(1, None), (3, None), (7, None), (1, 7), (3, 5)])
def test_the_compaction_holds_exactly_what_each_judgement_keeps(tmp_path, per_step, prompt_chunk, per_head):
    """The compaction driven without an engine (tests/vllm/judge_steps.py): a prompt prefilled whole or in chunks
    that are each judged (`judge_chunks`), then decoding tokens arriving 1, 3 or 7 per step, the tokens leaving the
    window at each step one judgement: each (layer, head) holds in its front slots exactly the positions the fill
    policy keeps (per head: KVzap's own verdicts, each head its own KV cache group), and its block table exactly the
    blocks they fill. Several tokens leaving in one step were an engine-killing RuntimeError."""
    out = tmp_path / "judged.json"
    command = [str(VLLM_PYTHON), str(ROOT / "tests" / "vllm" / "judge_steps.py"), "--per-step", str(per_step)]
    command += ["--prompt-chunk", str(prompt_chunk)] if prompt_chunk else []
    command += ["--per-head"] if per_head else []
    run = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    record = json.loads(out.read_text())
    assert record["held"] == record["kept"]
    assert 0 < min(record["removed"])  # every group dropped some
    fill = [-(-len(group[0]) // 4) for group in record["kept"]]  # blocks of 4 slots
    assert record["blocks"] == record["table_blocks"] == fill
    if per_head:  # KVzap's verdicts, not the fill's: some layer's two heads keep different counts
        counts = [len(group[0]) for group in record["kept"]]
        assert len(counts) == 6 and any(a != b for a, b in zip(counts[::2], counts[1::2]))


@needs_vllm
def test_a_chunked_prefill_judged_chunk_by_chunk_generates_the_transformers_tokens_of_those_chunks(demo):
    """With `judge_chunks`, each chunk vLLM's scheduler cuts from a prompt (a 64-token budget shared by three
    requests) is judged once computed, so the next chunk attends to the pruned cache and the request's blocks are
    cut before its prefill ends. The reference is the transformers press fed the same chunks, each one forward: the
    same greedy tokens and entries removed per (request, layer); every block cut fits the kept entries."""
    prompts = [demo.prompts[0], demo.prompts[0][100:], demo.prompts[0][:150]]
    new_tokens, budget = 24, 64
    tau = score_quantile(demo, 0.6)
    settings = {"surrogate": str(demo.folder / "surrogate"), "threshold": tau, "judge_chunks": True}
    engine = {"block_size": 32, "max_num_batched_tokens": budget, "enable_chunked_prefill": True}
    extra = ("--max-tokens", str(new_tokens), "--ignore-eos")
    record = run_engine(demo, "chunk-judged", prompts, settings, engine, extra)

    assert record["preemptions"] == []
    assert_blocks_fit_the_kept_entries(record)
    early = 0
    for row, prompt in enumerate(prompts):
        steps = record["scheduled"][str(row)]
        chunks, decoding = steps[: len(steps) - new_tokens + 1], steps[len(steps) - new_tokens + 1 :]
        assert sum(chunks) == len(prompt) and len(chunks) > 1 and max(chunks) <= budget and set(decoding) == {1}
        tokens, press = press_generate_in_steps(demo, prompt, tau, steps)
        assert record["tokens"][row] == tokens, row
        removed = [int(counts[0][0][0]) for _, counts in sorted(press.removed_counts.items())]
        assert removed == record["removed"][str(row)], row
        # judged while prefilling, as soon as a chunk ends past the window: cut at fewer tokens than the prompt's
        judged_early = any(end > 128 for end in itertools.accumulate(chunks[:-1]))
        assert judged_early == any(r == row and seen < len(prompt) for r, _, _, seen, _ in record["shrinks"]), row
        early += judged_early
    assert early >= 2  # the long prompts'


@needs_vllm
def test_a_preempted_request_is_judged_again_as_the_prompt_it_is_recomputed_from(demo):
    """A KV memory that admits three prompts but not their growth: vLLM preempts the newest request and later
    recomputes it from its prompt and the tokens it had generated. The plugin forgets the request's pruning and
    judges that longer prompt afresh, so its tokens after the preemption are the transformers path's continuation
    of it; every block cut still fits the kept entries, and all blocks come back."""
    prompts = [demo.prompts[0][i:] for i in (0, 20, 40)]  # 278-318 tokens: 9-10 blocks per layer at admission
    new_tokens = 150
    tau = score_quantile(demo, 0.3)  # the layers keep most entries, so decoding outgrows the pool
    settings = {"surrogate": str(demo.folder / "surrogate"), "threshold": tau}
    engine = {"block_size": 32, "kv_cache_memory_bytes": 47 * 2**20, "max_model_len": 512}  # ~1000 layer blocks
    record = run_engine(demo, "preempted", prompts, settings, engine, ("--max-tokens", str(new_tokens), "--ignore-eos"))

    assert record["preemptions"], "the KV memory was meant to force a preemption"
    assert_blocks_fit_the_kept_entries(record)
    generated = dict(record["preemptions"])  # the tokens each preempted request had at its last preemption
    for row, prompt in enumerate(prompts):
        done = generated.get(row, 0)
        tokens, _ = press_generate(demo, prompt + record["tokens"][row][:done], tau, new_tokens - done)
        assert record["tokens"][row][done:] == tokens, (row, done)


@needs_vllm
@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"enable_prefix_caching": True}, "prefix caching is on: start the engine with --no-enable-prefix-caching"),
        ({"enforce_eager": False}, "start the engine with --enforce-eager"),
    ],
)
def test_the_engine_refuses_settings_kvzap_cannot_serve_under(demo, engine, message):
    record = run_engine(demo, "refused", demo.prompts[:1], {"surrogate": str(demo.folder / "surrogate")}, engine)
    assert message in record["error"] and "KVzap cannot serve this engine" in record["error"]


@needs_vllm
def test_a_kvzap_section_on_an_architecture_without_an_override_is_refused(tmp_path):
    """vLLM runs its own class for an architecture the plugin does not override: the worker refuses the engine by
    name instead of serving it without KVzap."""
    tokenizer = tiny_tokenizer()
    sizes = dict(hidden_size=256, num_attention_heads=4, intermediate_size=512)
    build("phi3", 400, **sizes).save_pretrained(tmp_path / "tiny-phi3")
    tokenizer.save_pretrained(tmp_path / "tiny-phi3")
    phi3 = SimpleNamespace(folder=tmp_path, hf=str(tmp_path / "tiny-phi3"))
    record = run_engine(phi3, "phi3", [tokenizer(TEXT).input_ids[:50]], {"surrogate": str(tmp_path / "none")})
    assert (
        "KVzap cannot serve this engine: the model architecture Phi3ForCausalLM has no KVzap override"
        in (record["error"])
    )


@needs_vllm
def test_pruning_refuses_sliding_window_layers_and_names_the_fix(tiny_families):
    """Mistral v0.1's config slides every layer over 4096 tokens: vLLM gives those layers a bounded cache
    (SlidingWindowSpec), which the pruning cannot take, so the engine refuses at start and names the fix."""
    mistral = tiny_families("mistral")
    settings = {"surrogate": str(mistral.folder / "surrogate"), "threshold": 0.0}
    engine = {"hf_overrides": {"sliding_window": 4096}}
    record = run_engine(mistral, "sliding", mistral.prompts[:1], settings, engine)
    assert "KVzap cannot serve this engine: 2 of 2 attention layers" in record["error"]
    assert "slide over a 4096-token window" in record["error"] and "--disable-sliding-window" in record["error"]


def test_sliding_refusal_names_the_sliding_layers():
    assert sliding_refusal({"model.layers.0.self_attn.attn": None, "model.layers.1.self_attn.attn": None}) is None
    mixed = sliding_refusal({"model.layers.0.self_attn.attn": None, "model.layers.1.self_attn.attn": 512})
    assert mixed.startswith("1 of 2 attention layers (model.layers.1.self_attn.attn, ...) slide over a 512-token")


def _engine_config(**changes):
    config = SimpleNamespace(
        cache_config=SimpleNamespace(enable_prefix_caching=False),
        speculative_config=None,
        model_config=SimpleNamespace(enforce_eager=True),
    )
    for key, value in changes.items():
        owner, _, name = key.partition("__")
        if name:
            setattr(getattr(config, owner), name, value)
        else:
            setattr(config, owner, value)
    return config


@pytest.mark.parametrize(
    ("changes", "architecture", "message"),
    [
        ({}, "Gemma3ForCausalLM", "Gemma3ForCausalLM has no KVzap override (supported: LlamaForCausalLM, Qwen3"),
        ({"cache_config__enable_prefix_caching": True}, "Qwen3ForCausalLM", "prefix caching is on"),
        ({"speculative_config": object()}, "Qwen2ForCausalLM", "speculative decoding is configured"),
        ({"model_config__enforce_eager": False}, "MistralForCausalLM", "--enforce-eager"),
    ],
)
def test_refusal_names_the_setting(changes, architecture, message):
    assert message in refusal(_engine_config(**changes), architecture, tuple(ARCHITECTURES))
    for supported in ("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"):
        assert refusal(_engine_config(), supported, tuple(ARCHITECTURES)) is None


def _attention_group(builder_updates_tables=False, kernel_block_size=None):
    builder = type("FlashAttentionMetadataBuilder", (), {"supports_update_block_table": builder_updates_tables})()
    return SimpleNamespace(
        get_metadata_builder=lambda ubatch: builder,
        kernel_block_size=kernel_block_size,
        kv_cache_spec=SimpleNamespace(block_size=32),
    )


def test_attention_that_would_drop_the_per_layer_lengths_is_refused_by_name():
    assert attention_refusal([[_attention_group()], [_attention_group()]]) is None
    reused = attention_refusal([[_attention_group()], [_attention_group(builder_updates_tables=True)]])
    assert "FlashAttentionMetadataBuilder reuses one KV cache group's metadata" in reused
    assert "--block-size 16" in attention_refusal([[_attention_group(kernel_block_size=16)]])


def test_settings_read_the_kvzap_section():
    assert KVzapSettings.read({}) is None and KVzapSettings.read(None) is None
    settings = KVzapSettings.read({"kvzap": {"surrogate": "nvidia/KVzap-mlp-Qwen3-8B", "threshold": -4}})
    assert (settings.surrogate, settings.threshold, settings.window) == ("nvidia/KVzap-mlp-Qwen3-8B", -4.0, 128)
    assert KVzapSettings.read({"kvzap": {"surrogate": "s"}}).threshold == -math.inf
    assert (
        not settings.judge_chunks
        and KVzapSettings.read({"kvzap": {"surrogate": "s", "judge_chunks": True}}).judge_chunks
    )
    assert settings.layout == "per_layer"
    assert KVzapSettings.read({"kvzap": {"surrogate": "s", "layout": "per_head"}}).layout == "per_head"


@pytest.mark.parametrize(("groups", "held"), [(1, 60), (30, 2), (90, 2 / 3)])
def test_the_footprint_counts_per_layer_blocks_whatever_the_groups(groups, held):
    """One group (a pool block spans the 30 layers), a group per layer, a group per (layer, KV head) with 3 heads:
    2 pool blocks in use are 60, 2 and 2/3 per-layer blocks; the dense count is the running tokens' blocks per layer."""
    from kvzap_vllm.metrics import footprint

    config = SimpleNamespace(
        num_blocks=11, kv_cache_groups=[SimpleNamespace(kv_cache_spec=SimpleNamespace(block_size=32))] * groups
    )
    pool = SimpleNamespace(get_num_free_blocks=lambda: 8)  # 2 in use, and vLLM's null block
    scheduler = SimpleNamespace(
        kv_cache_config=config,
        kv_cache_manager=SimpleNamespace(block_pool=pool),
        running=[SimpleNamespace(num_computed_tokens=33), SimpleNamespace(num_computed_tokens=32)],
    )
    assert footprint(scheduler, 30) == (pytest.approx(held), 3 * 30)


@needs_vllm
def test_under_prometheus_multiprocess_mode_the_footprint_reaches_the_servers_registry(tmp_path):
    """With PROMETHEUS_MULTIPROC_DIR set (vLLM's several API servers, or set by hand) the server serves that folder's
    value files, not its own registry: the engine core's footprint must be there, the latest values and the freed
    blocks counted once."""
    env = os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    script = [str(VLLM_PYTHON), str(ROOT / "tests" / "vllm" / "shared_metrics.py")]
    for side in ("publish", "collect"):  # two processes, as the engine core and the API server are
        run = subprocess.run(script + [side], capture_output=True, text=True, env=env, timeout=300)
        assert run.returncode == 0, run.stderr[-3000:]
    served = dict(line.rsplit(" ", 1) for line in run.stdout.splitlines() if line.startswith("kvzap:"))
    assert {name: float(value) for name, value in served.items()} == {
        "kvzap:held_blocks": 5.0,
        "kvzap:dense_blocks": 360.0,
        "kvzap:compression": 72.0,
        "kvzap:freed_blocks_total": 7.0,
    }


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"surrogate": "s", "tau": 1}, "unknown keys ['tau']"),
        ({"threshold": -4}, "a surrogate folder or Hub id is needed"),
        ({"surrogate": "s", "threshold": "low"}, "a number (a log score)"),
        ({"surrogate": "s", "threshold": float("nan")}, "a number (a log score)"),
        ({"surrogate": "s", "window": -1}, "an integer >= 0"),
        ({"surrogate": "s", "record_scores": "yes"}, "true or false"),
        ({"surrogate": "s", "judge_chunks": 1}, '["judge_chunks"]: true or false'),
        ({"surrogate": "s", "layout": "per-head"}, "[\"layout\"]: one of ['per_layer', 'per_head']"),
        ("s", "must be a mapping"),
    ],
)
def test_settings_refuse_bad_values_by_name(section, message):
    with pytest.raises(ValueError, match="additional_config") as info:
        KVzapSettings.read({"kvzap": section})
    assert message in str(info.value)


PRUNING = SimpleNamespace(additional_config={"kvzap": {"surrogate": "s", "threshold": 0.5}})


def test_a_requests_own_threshold_overrides_the_engines():
    assert request_threshold({"kvzap_threshold": -2}, 0.5) == -2.0
    assert request_threshold({"other": 1}, 0.5) == request_threshold(None, 0.5) == 0.5
    check_request({"kvzap_threshold": -2, "unrelated": "x"}, PRUNING)  # accepted; others' arguments pass through


@pytest.mark.parametrize(
    ("extra_args", "config", "message"),
    [
        ({"kvzap_threshold": "high"}, PRUNING, "kvzap_threshold must be a number"),
        ({"kvzap_threshold": True}, PRUNING, "kvzap_threshold must be a number"),
        ({"kvzap_threshold": float("nan")}, PRUNING, "kvzap_threshold must be a number"),
        ({"kvzap_treshold": 0}, PRUNING, "unknown KVzap request arguments ['kvzap_treshold']"),
        ({"kvzap_threshold": 0}, SimpleNamespace(additional_config={"kvzap": {"surrogate": "s"}}), "does not prune"),
        ({"kvzap_threshold": 0}, SimpleNamespace(additional_config=None), "does not prune"),
    ],
)
def test_bad_request_arguments_are_refused_by_name(extra_args, config, message):
    with pytest.raises(ValueError) as info:
        check_request(extra_args, config)
    assert message in str(info.value)


def serving_claims(record: dict) -> list[str]:
    """What the plugin README says of a serving record, as the record gives it."""
    dense, kvzap = record["records"]
    ratio = lambda key: kvzap[key] / dense[key]  # noqa: E731
    checked = {r["same_tokens_as_transformers"] for r in record["records"]}
    prompts = record["prompt_tokens"]
    claims = [
        f"{min(prompts)}–{max(prompts)}-token prompts, {record['new_tokens']} new tokens",
        f"mean running sequences {ratio('mean_running'):.2f}× dense",
        f"output tokens/s {ratio('output_tokens_per_s'):.2f}× dense",
        f"TPOT {ratio('alone_tpot_s'):.2f}× dense",
        f"step p95 {1e3 * kvzap['alone_step_p95_s']:.1f} against {1e3 * dense['alone_step_p95_s']:.1f} ms",
        f"realised compression {kvzap['realised_compression']:.2f}× against the fill policy's logical "
        f"{kvzap['logical_compression']:.2f}×, ratio {kvzap['kvzap_ratio']:.3f}",
        f"{dense['score']:.1f} dense, {kvzap['score']:.1f} with the plugin",
    ]
    if len(checked) == 1 and (n := next(iter(checked)).split("/"))[0] == n[1]:
        claims.append(f"{n[0]} of {n[1]} token sequences equal the transformers path's")
    if kvzap["blocks_leaked"] == 0:
        claims.append("no block leaked")
    return claims


@pytest.mark.parametrize("workload", ["decode", "prefill", "prefill_chunks", "prefill_chunks_mild"])
def test_the_plugin_readmes_serving_claims_are_the_records(workload):
    """Each number the text gives comes from the record (its table: benchmarks/doc_tables.py)."""
    record = json.loads((ROOT / "benchmarks" / "cpu" / f"vllm_serving_{workload}.json").read_text())
    text = (ROOT / "plugins" / "vllm" / "README.md").read_text(encoding="utf-8")
    flat = " ".join(text.split())
    assert [claim for claim in serving_claims(record) if claim not in flat] == []
    dense, kvzap = record["records"]
    ratio = lambda key: kvzap[key] / dense[key]  # noqa: E731
    kept = f"it keeps {ratio('mean_running'):.2f}× the mean running sequences of dense vLLM"
    readme_sentences = {  # the project README's serving figures
        "decode": f"{kept} at one KV memory, gives {ratio('output_tokens_per_s'):.2f}× its output tokens/s, and scores "
        f"as dense does ({dense['score']:.1f} and {kvzap['score']:.1f})",
        "prefill_chunks_mild": f"{kept} and gives {ratio('output_tokens_per_s'):.2f}× its output tokens/s, scoring "
        f"{kvzap['score']:.1f} where dense scores {dense['score']:.1f}",
    }
    if workload in readme_sentences:
        assert readme_sentences[workload] in " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())


def test_the_plugin_readmes_per_head_claims_are_the_record():
    """The per-head layout against the per-layer plugin, in one run: the ratios the text gives."""
    record = json.loads((ROOT / "benchmarks" / "cpu" / "vllm_serving_decode_per_head.json").read_text())
    text = (ROOT / "plugins" / "vllm" / "README.md").read_text(encoding="utf-8")
    dense, layer, head = record["records"]
    ratio = lambda key: head[key] / layer[key]  # noqa: E731
    claims = [
        f"per head holds {ratio('mean_running'):.2f}× the per-layer plugin's mean running sequences",
        f"{ratio('output_tokens_per_s'):.2f}× the per-layer plugin's output tokens/s",
        f"realised compression of {head['realised_compression']:.2f}× against {layer['realised_compression']:.2f}×",
        f"{head['score']:.1f} against {layer['score']:.1f}",
    ]
    assert [claim for claim in claims if claim not in " ".join(text.split())] == []


def test_the_plugin_readmes_per_head_claims_at_equal_accuracy_are_the_record():
    """Each layout at its own headline τ, dense in the same run: the ratios and figures the text gives."""
    record = json.loads((ROOT / "benchmarks" / "cpu" / "vllm_serving_decode_per_head_matched.json").read_text())
    dense, layer, head = record["records"]
    ratio = lambda key: head[key] / layer[key]  # noqa: E731
    ms = lambda value: f"{1e3 * value:.0f}"  # noqa: E731
    claims = [
        f"{ratio('mean_running'):.2f}× the per-layer plugin's mean running sequences** "
        f"({head['mean_running']:.2f} against {layer['mean_running']:.2f}), and all three engines score "
        f"{dense['score']:.1f}",
        f"realised compression is {head['realised_compression']:.2f}× against {layer['realised_compression']:.2f}× "
        f"(logical ratio {head['kvzap_ratio']:.3f} against the fill's {layer['kvzap_ratio']:.3f}): "
        f"{100 * (1 - layer['realised_compression'] / head['realised_compression']):.0f} % fewer blocks held",
        f"(peak {head['peak_running']} against {layer['peak_running']})",
        f"{ratio('output_tokens_per_s'):.2f}× the per-layer plugin's output tokens/s** "
        f"({head['output_tokens_per_s']:.1f} against {layer['output_tokens_per_s']:.1f}), TPOT p50 "
        f"{ms(head['tpot_p50_s'])} against {ms(layer['tpot_p50_s'])} ms; alone, {1e3 * head['alone_tpot_s']:.1f} "
        f"against {1e3 * layer['alone_tpot_s']:.1f} ms per token",
        f"--threshold {layer['threshold']:g} {head['threshold']:g}",
        f"(ratios {head['kvzap_ratio']:.3f} and {layer['kvzap_ratio']:.3f} on the decode-heavy prompts) and hold the "
        f"same sequences, the per-head layout {100 * (1 - ratio('output_tokens_per_s')):.0f} % slower",
    ]
    assert {r["score"] for r in record["records"]} == {dense["score"]}  # "all three engines score" it
    assert {r["same_tokens_as_transformers"] for r in record["records"]} == {"8/8"}
    assert {layer["blocks_leaked"], head["blocks_leaked"]} == {0}
    text = " ".join((ROOT / "plugins" / "vllm" / "README.md").read_text(encoding="utf-8").split())
    assert [claim for claim in claims if claim not in text] == []


NAMES = {"linear": "Linear", "mlp": "MLP"}  # the surrogates as the README names them


ACCURACY_PAIR = ("vllm_accuracy", "vllm_accuracy_per_head")  # the per-layer layout's record, the per-head one's


@pytest.mark.parametrize("name", [*ACCURACY_PAIR, "vllm_accuracy_chunks"])
def test_the_plugin_readmes_accuracy_headlines_are_the_records(name):
    """The headline τ the text names is the record's (its table: benchmarks/doc_tables.py)."""
    record = json.loads((ROOT / "benchmarks" / "cpu" / f"{name}.json").read_text())
    layout = " per head" if record.get("layout") == "per_head" else ""
    layout += " judged chunk by chunk" if record.get("judge_chunks") else ""
    flat = " ".join((ROOT / "plugins" / "vllm" / "README.md").read_text(encoding="utf-8").split())
    for surrogate, tau in record["headline_threshold"].items():
        said = "no τ inside" if tau is None else "τ = " + f"{tau:.1f}".replace("-", "−")
        assert f"headline for KVzap-{NAMES[surrogate]}{layout}: {said}" in flat


def test_the_per_head_headline_is_set_beside_the_per_layer_one():
    """What the text says of the two layouts at their own headlines, and at the same τ 0, is the two records'."""
    layer, head = (json.loads((ROOT / "benchmarks" / "cpu" / f"{n}.json").read_text()) for n in ACCURACY_PAIR)
    row = lambda record, tau: next(  # noqa: E731
        r for r in record["records"] if r["surrogate"] == "mlp" and r["threshold"] == tau
    )
    at_head, at_layer = row(head, head["headline_threshold"]["mlp"]), row(layer, layer["headline_threshold"]["mlp"])
    tau = f"{at_layer['threshold']:.1f}".replace("-", "−").removesuffix(".0")
    claims = [
        f"at KVzap ratio {at_head['kvzap_ratio']:.3f}",
        f"(fill ratio {at_layer['fill_ratio']:.3f} at τ {tau})",
        f"The per-head τ 0 scores {row(head, 0.0)['score']:.1f}, where the per-layer τ 0 scores "
        f"{row(layer, 0.0)['score']:.1f}",
    ]
    flat = " ".join((ROOT / "plugins" / "vllm" / "README.md").read_text(encoding="utf-8").split())
    assert [claim for claim in claims if claim not in flat] == []
