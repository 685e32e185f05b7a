"""The family matrix: tiny random decoders built from transformers 5.2 configs, each checked end to end.

For every family: the oracle against an eager computation (tests/oracle_reference.py) from the model's own
attention weights (output_attentions), cached values, output projection and attention inputs; KVzapPress at
tau = -inf equal to the plain model; eviction equal to masking in greedy `generate`. Hybrids (a sliding layer with
a window shorter than the prompt, then a full one) prune the full layer only, in `generate`, chunked prefill,
kvpress's pipeline and tau calibration. Families out of reach get an asserted refusal.
docs/families.md's "Model families" table is this file's outcome.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from kvpress.pipeline import KVPressTextGenerationPipeline
from kvpress.presses.knorm_press import KnormPress
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer

from family_models import COMMON, EAGER_ONLY, FAMILIES, MOE, NOT_KVPRESS_LAYOUT, SLIDING_CACHE, build
from kvzap.evaluation import job, presses, shared_prefill
from kvzap.layer_types import pruned_layers
from kvzap.oracle.scores import build_repeat_prompt, oracle_scores
from kvzap.pruning import KVzapPress, PrecomputedScorerPress, PrunedLayer, held_kv_bytes
from kvzap.pruning.calibration import collect_scores, mean_ratio, threshold_for
from oracle_reference import eager_log_kvzip_plus
from tiny_models import TEXT, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

# Hybrids as they ship (a sliding layer, then a full one), with a window far shorter than the prompts here.
HYBRID = dict(sliding_window=16, layer_types=["sliding_attention", "full_attention"])
# Their full layers use what attention over a pruned cache does not apply (refused below, and at plan time).
SOFT_CAP_OR_SINKS = {"gemma2", "gpt_oss"}
HYBRID_PRUNED = sorted(SLIDING_CACHE - SOFT_CAP_OR_SINKS)


def build_hybrid(model_type: str, vocab_size: int):
    config = AutoConfig.for_model(model_type, vocab_size=vocab_size, **{**COMMON, **FAMILIES[model_type], **HYBRID})
    config._attn_implementation = "eager" if model_type in EAGER_ONLY else "sdpa"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).float().eval().requires_grad_(False)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_oracle_matches_eager_attention(model_type, tok):
    """Hybrids in their shipped layout, with a window far shorter than the prompt: the full layers are scored."""
    model = build_hybrid(model_type, len(tok)) if model_type in SLIDING_CACHE else build(model_type, len(tok))
    prompt = build_repeat_prompt(tok, TEXT[:200])
    keep = torch.tensor([0, 5, 9])
    ours = oracle_scores(model, prompt, keep_positions=keep, query_chunk=16, keep_kv=True)
    assert ours.layers == pruned_layers(model.config)
    reference, inputs = eager_log_kvzip_plus(model, prompt)
    error = (ours.kvzip_plus_log - reference[ours.layers]).abs().max().item()
    # what surrogate training reads: attention inputs at the kept positions, (L, H_kv, C) targets
    torch.testing.assert_close(ours.hidden, inputs[ours.layers][:, prompt.context][:, keep])
    assert ours.kv.shape[:3] == (len(ours.layers), reference.shape[1], len(keep))
    print(f"{model_type}: max |log KVzip+ - eager| = {error:.1e}")
    assert error <= 1e-3


def _threshold(model, ids) -> float:
    """Minus the median key norm of the pruned layers: a KnormPress threshold that removes about half of the judged
    entries."""
    cache = DynamicCache()
    model(ids, past_key_values=cache)
    norms = [cache.layers[i].keys.norm(dim=-1).flatten() for i in pruned_layers(model.config)]
    return -torch.cat(norms).median().item()


def _generate(model, ids, press=None) -> torch.Tensor:
    def run():
        return model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=3)[0, ids.shape[1] :]

    if press is None:
        return run()
    with press(model):
        return run()


PRUNED = sorted(set(FAMILIES) - SLIDING_CACHE - NOT_KVPRESS_LAYOUT)


def _exact_and_evict_equals_mask(model, ids) -> KVzapPress:
    """τ = −∞ gives the plain model's logits and greedy tokens; eviction equals masking in greedy decoding with
    about half the judged entries removed. Returns the evicting press (after its run)."""
    plain_logits = model(ids).logits
    with KVzapPress(KnormPress(), threshold=-math.inf, window=8)(model):
        kept_logits = model(ids, past_key_values=DynamicCache(config=model.config)).logits
    torch.testing.assert_close(kept_logits, plain_logits, atol=1e-5, rtol=1e-5)
    assert torch.equal(
        _generate(model, ids, KVzapPress(KnormPress(), threshold=-math.inf, window=8)), _generate(model, ids)
    )
    tau = _threshold(model, ids)
    press = lambda evict: KVzapPress(KnormPress(), threshold=tau, window=8, decoding=True, evict=evict)  # noqa: E731
    evicted = press(True)
    assert torch.equal(_generate(model, ids, evicted), _generate(model, ids, press(False)))
    assert 0.2 < evicted.compression_ratio < 0.8
    return evicted


@pytest.mark.parametrize("model_type", PRUNED)
def test_pruning_nothing_and_eviction_equal_masking(model_type, tok):
    _exact_and_evict_equals_mask(build(model_type, len(tok)), tok(TEXT[:300], return_tensors="pt").input_ids)


@pytest.mark.parametrize("model_type", HYBRID_PRUNED)
def test_hybrid_prunes_its_full_layers_and_leaves_the_sliding_ones(model_type, tok):
    """The sliding layer keeps transformers' own bounded cache; the full layer is pruned, exactly."""
    model = build_hybrid(model_type, len(tok))
    ids = tok(TEXT[:300], return_tensors="pt").input_ids
    assert ids.shape[1] > 4 * HYBRID["sliding_window"]
    assert _exact_and_evict_equals_mask(model, ids).layer_ratios.shape == (1,)  # the full layer only
    tau = _threshold(model, ids)
    press = lambda evict: KVzapPress(KnormPress(), threshold=tau, window=8, decoding=True, evict=evict)  # noqa: E731

    dense, pruned = DynamicCache(config=model.config), DynamicCache(config=model.config)
    model(ids, past_key_values=dense)
    with press(True)(model):
        model(ids, past_key_values=pruned)
    assert isinstance(pruned.layers[0], DynamicSlidingWindowLayer) and isinstance(pruned.layers[1], PrunedLayer)
    assert torch.equal(pruned.layers[0].keys, dense.layers[0].keys)  # the sliding layer untouched
    assert held_kv_bytes(dense) - held_kv_bytes(pruned) > 0.2 * dense.layers[1].keys.nbytes


@pytest.mark.parametrize("model_type", ["gemma3_text", "olmo3"])
def test_hybrid_chunked_prefill_and_kvpress_pipeline(model_type, tok):
    model = build_hybrid(model_type, len(tok))
    ids = tok(TEXT[:300], return_tensors="pt").input_ids
    chunked = KVzapPress(KnormPress(), threshold=-math.inf, window=8, prefill_chunk=24)
    assert torch.equal(_generate(model, ids, chunked), _generate(model, ids))
    tau = _threshold(model, ids)
    runs = [KVzapPress(KnormPress(), threshold=tau, window=8, prefill_chunk=24, evict=e) for e in (True, False)]
    assert torch.equal(_generate(model, ids, runs[0]), _generate(model, ids, runs[1]))
    assert runs[0].compression_ratio == runs[1].compression_ratio > 0.2

    pipe = KVPressTextGenerationPipeline(model=model, tokenizer=tok, device="cpu")
    answers, ratios = [], []
    for evict in (True, False):
        press = KVzapPress(KnormPress(), threshold=tau, window=8, evict=evict)
        answers.append(pipe(TEXT[:300], question=TEXT[300:340], press=press, max_new_tokens=6)["answer"])
        ratios.append(press.compression_ratio)
    assert answers[0] == answers[1] and ratios[0] == ratios[1] > 0.2


def test_hybrid_calibration_counts_the_full_layers(tok):
    model = build_hybrid("gemma3_text", len(tok))
    texts = [tok(TEXT[i : i + 300], return_tensors="pt").input_ids for i in (0, 150)]
    samples = collect_scores(model, texts, KnormPress(), window=8)
    assert all(len(sample.layer_scores) == 1 for sample in samples)
    tau = threshold_for(samples, 0.5)
    achieved = []
    for ids in texts:
        press = KVzapPress(KnormPress(), threshold=tau, window=8)
        with press(model):
            model.model(input_ids=ids, past_key_values=DynamicCache(config=model.config))
        achieved.append(press.compression_ratio)
    assert sum(achieved) / len(achieved) == pytest.approx(mean_ratio(samples, tau), abs=1e-9)
    assert mean_ratio(samples, tau) == pytest.approx(0.5, abs=0.02)


def test_a_model_whose_layers_all_slide_has_nothing_to_prune(tok):
    model = build("ministral", len(tok))  # both layers sliding
    with pytest.raises(NotImplementedError, match="every layer of this ministral model is sliding-window"):
        with KVzapPress(KnormPress(), threshold=0.0)(model):
            pass


@pytest.mark.parametrize("model_type, what", [("gemma2", "soft-capped logits"), ("gpt_oss", "attention sinks")])
def test_soft_capping_or_sinks_are_refused_before_any_forward(model_type, what, tok):
    """Pruned attention does not apply them (and sdpa, serving dense layers under the press, drops them)."""
    model = build_hybrid(model_type, len(tok))
    forwards = []
    model.register_forward_pre_hook(lambda *a: forwards.append(1))
    with pytest.raises(NotImplementedError, match=f"KVzapPress cannot prune this {model_type} model: .*uses {what}"):
        with KVzapPress(KnormPress(), threshold=0.0, window=8)(model):
            model(tok(TEXT[:100], return_tensors="pt").input_ids)
    assert not forwards


REFUSED = {
    "deepseek_v3": (
        dict(
            kv_lora_rank=32,
            q_lora_rank=None,
            qk_rope_head_dim=16,
            qk_nope_head_dim=16,
            v_head_dim=32,
            n_routed_experts=4,
            n_shared_experts=1,
            first_k_dense_replace=2,
        ),
        "compressed latent KV",
    ),
    "jamba": (
        dict(MOE, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, mamba_d_state=8),
        "state-space or linear-attention layers",
    ),
    "bamba": (dict(mamba_d_state=8, mamba_n_heads=8, mamba_d_head=32), "state-space or linear-attention layers"),
    "falcon_h1": (
        dict(mamba_d_state=8, mamba_n_heads=8, mamba_d_head=32, mamba_d_ssm=256),
        "state-space or linear-attention layers",
    ),
    "minimax": (dict(MOE), "linear_attention keep a recurrent state"),
    "qwen3_next": (
        dict(MOE, linear_num_key_heads=2, linear_num_value_heads=4),
        "linear_attention keep a recurrent state",
    ),
}


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_families_out_of_reach_are_refused_before_any_forward(model_type, tok):
    overrides, reason = REFUSED[model_type]
    config = AutoConfig.for_model(model_type, vocab_size=len(tok), **{**COMMON, **overrides})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    forwards = []
    model.register_forward_pre_hook(lambda *a: forwards.append(1))
    with pytest.raises(NotImplementedError, match=f"cannot score {model_type} models: .*{reason}"):
        oracle_scores(model, build_repeat_prompt(tok, TEXT[:100]))
    assert not forwards


def test_hybrid_oracle_scores_drive_the_press(tok):
    """The oracle's scores of a hybrid (its full layers only) prune those layers as KVzip+ would."""
    model = build_hybrid("gemma3_text", len(tok))
    prompt = build_repeat_prompt(tok, TEXT[:300])
    scores = oracle_scores(model, prompt).kvzip_plus_log  # (1 full layer, H, C)
    tau = scores.median().item()
    ids = prompt.input_ids[:, : prompt.context.stop]
    logits, ratios = [], []
    for evict in (True, False):
        press = KVzapPress(
            PrecomputedScorerPress(scores=scores, offset=prompt.context.start), tau, window=8, evict=evict
        )
        with press(model):
            logits.append(model(ids, past_key_values=DynamicCache(config=model.config)).logits)
        ratios.append(press.compression_ratio)
    torch.testing.assert_close(logits[0], logits[1], atol=1e-5, rtol=1e-5)
    judged = scores[..., : ids.shape[1] - prompt.context.start - 8]  # context tokens that left the window
    assert ratios[0] == ratios[1] == pytest.approx((judged < tau).sum().item() / (ids.shape[1] * scores.shape[1]))
    with pytest.raises(ValueError, match=r"the model \(2 or, over its full-attention layers, 1, 2\)"):
        with KVzapPress(PrecomputedScorerPress(scores=torch.cat([scores] * 3)), tau)(model):
            pass


BASELINE_FAMILIES = sorted(set(FAMILIES) - NOT_KVPRESS_LAYOUT)


@pytest.mark.parametrize("model_type", BASELINE_FAMILIES)
def test_a_kvpress_baseline_runs_on_the_family(model_type, tok):
    """KnormPress at 0.5 as the pipeline's jobs run it (hybrids: the full layers only); where a prefill group can
    serve the family, its batched decode answers as the per-cell path."""
    model = build_hybrid(model_type, len(tok)) if model_type in SLIDING_CACHE else build(model_type, len(tok))
    rows = pd.DataFrame(
        [dict(sample_id="s", context=TEXT[:300], question=" Repeat it.", answer_prefix="", max_new_tokens=4)]
    )
    alone = job.run_greedy(model, tok, rows, presses.build("knorm", 0.5, {}))
    assert alone["compression_ratio"].tolist() == [0.5] and alone["kv_bytes"][0] < alone["full_kv_bytes"][0]
    if model_type not in SOFT_CAP_OR_SINKS:  # their groups run cell by cell (the kvzap attention lacks both)
        together = shared_prefill.run_greedy_shared(model, tok, rows, [presses.build("knorm", 0.5, {})])[0]
        assert together["prediction"].tolist() == alone["prediction"].tolist()
