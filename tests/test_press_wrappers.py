"""Our presses inside kvpress's wrappers (kvzap.pruning.wrappers): a wrapper that holds one alone runs it as the press
itself runs, and every other arrangement stops with one message naming the wrapper and the fix.

kvpress's own checks of the same (tests/test_kvpress_suite.py) run on kvpress's unit-test shapes; these pin down what
those do not: equality with the press alone, and each refusal's words. Tiny random models, a few seconds.
"""

from __future__ import annotations

import pytest
import torch
from kvpress import ComposedPress, DMSPress, KnormPress, PerLayerCompressionPress, PrefillDecodingPress
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, pipeline

from family_models import COMMON
from kvzap.pruning import KVzapPress, SurrogateScorerPress
from kvzap.pruning.attention import NAME
from kvzap.surrogate.model import Surrogate
from tiny_models import TEXT, tiny_model, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")
WINDOW = 8


def _ids(n: int) -> torch.Tensor:
    return torch.randint(0, 400, (1, n), generator=torch.Generator().manual_seed(0))


def _press(**kwargs) -> KVzapPress:
    torch.manual_seed(1)
    return KVzapPress(SurrogateScorerPress(surrogate=Surrogate(64, 2, 2).eval()), 0.0, WINDOW, **kwargs)


def _generate(press, wrap=lambda press: press, attn: str = "sdpa"):
    """Greedy tokens, the cache and the ratio of `press` entered through `wrap(press)`."""
    model = tiny_model("llama", attn=attn)
    cache = DynamicCache()
    with wrap(press)(model):
        tokens = model.generate(_ids(40), past_key_values=cache, max_new_tokens=12, do_sample=False)
    return tokens, cache, press.compression_ratio, model


@pytest.mark.parametrize("decoding", [False, True])
def test_composed_press_runs_ours_as_ours_runs(decoding):
    alone, cache_alone, ratio_alone, _ = _generate(_press(decoding=decoding))
    composed, cache, ratio, _ = _generate(_press(decoding=decoding), lambda press: ComposedPress([press]))
    assert torch.equal(composed, alone) and ratio == ratio_alone > 0
    assert torch.equal(cache.layers[0].rows.length, cache_alone.layers[0].rows.length)


def test_a_prefill_only_prefill_decoding_press_runs_ours_as_ours_runs():
    alone, _, ratio_alone, _ = _generate(_press())
    wrapped, _, ratio, _ = _generate(_press(), lambda press: PrefillDecodingPress(prefilling_press=press))
    assert torch.equal(wrapped, alone) and ratio == ratio_alone


def test_a_wrapper_hands_the_model_its_attention_back():
    _, _, _, model = _generate(_press(), lambda press: ComposedPress([press]), attn="eager")
    assert model.config._attn_implementation == NAME  # the pruned cache needs it, as after our own block
    out = model(_ids(10), output_attentions=True)  # a new dense forward asking for weights gets eager's
    assert out.attentions[0] is not None and model.config._attn_implementation == "eager"


@pytest.mark.parametrize(
    "wrap, error, words",
    [
        (lambda p: ComposedPress([p, KnormPress(0.5)]), RuntimeError, "ComposedPress holds KVzapPress with KnormPress"),
        (lambda p: ComposedPress([KnormPress(0.5), p]), RuntimeError, "ComposedPress holds KVzapPress with KnormPress"),
        (lambda p: ComposedPress([p, _press()]), RuntimeError, "ComposedPress holds KVzapPress with KVzapPress"),
        (lambda p: DMSPress(p, 0.0), TypeError, "DMSPress uses KVzapPress as a ScorerPress"),
        (lambda p: DMSPress(p, 0.0), TypeError, "DMSPress(press=KVzapPress(...).scorer, ...)"),
    ],
)
def test_wrappers_that_cannot_hold_ours_are_refused_at_the_prefill(wrap, error, words):
    with pytest.raises(error) as info:
        _generate(_press(), wrap)
    assert words in str(info.value)


@pytest.mark.parametrize(
    "press, wrap, words",
    [
        (
            _press(decoding=True),
            lambda p: PrefillDecodingPress(prefilling_press=p),
            "PrefillDecodingPress calls its prefilling_press at the prefill only, so KVzapPress(decoding=True) would "
            "not prune while decoding: use KVzapPress itself",
        ),
        (
            _press(decoding=True),
            lambda p: PrefillDecodingPress(decoding_press=p),
            "PrefillDecodingPress calls its decoding_press after the prefill only",
        ),
        (
            _press(prefill_chunk=16),
            lambda p: ComposedPress([p]),
            "ComposedPress enters KVzapPress's hooks but not its `with` block, which is where prefill_chunk=16",
        ),
    ],
)
def test_settings_a_wrapper_would_drop_are_refused(press, wrap, words):
    with pytest.raises(RuntimeError) as info:
        _generate(press, wrap)
    assert words in str(info.value)


def test_a_press_in_two_places_at_once_is_refused():
    model, press = tiny_model("llama"), _press()
    with pytest.raises(RuntimeError, match="ComposedPress holds KVzapPress and KVzapPress is also entered by itself"):
        with press(model), ComposedPress([press])(model):
            model(_ids(20), past_key_values=DynamicCache())


def test_a_kvpress_press_entered_inside_a_wrapper_holding_ours_is_refused():
    model = tiny_model("llama")
    with pytest.raises(RuntimeError, match="KnormPress was entered inside ComposedPress's block: presses do not nest"):
        with ComposedPress([_press()])(model), KnormPress(0.5)(model):
            model(_ids(20), past_key_values=DynamicCache())


def test_a_wrapper_holding_ours_inside_a_kvpress_block_is_refused_before_any_forward():
    model = tiny_model("llama")
    with pytest.raises(RuntimeError, match="KnormPress is already active .* before entering a press that holds KVzap"):
        with KnormPress(0.5)(model), ComposedPress([_press()])(model):
            pass


@pytest.mark.parametrize("wrap", [lambda p: p, lambda p: ComposedPress([p])], ids=["alone", "composed"])
def test_the_pipeline_refuses_decoding_before_touching_the_model(wrap):
    tokenizer = tiny_tokenizer()
    model = tiny_model("llama", vocab_size=len(tokenizer))
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
    with pytest.raises(ValueError, match=r"KVzapPress\(decoding=True\) under kvpress's pipeline.*model.generate"):
        pipe(TEXT, question="What is the special magic number?", press=wrap(_press(decoding=True)), max_new_tokens=4)
    assert model.config._attn_implementation == "sdpa"
    assert not any(layer.self_attn._forward_hooks for layer in model.model.layers)
    answer = pipe(TEXT, question="What is the special magic number?", press=wrap(_press()), max_new_tokens=4)
    assert isinstance(answer["answer"], str)  # decoding=False prunes the context there


def test_a_scorer_loads_its_surrogate_under_a_wrapper_that_skips_post_init(tmp_path):
    torch.manual_seed(1)
    Surrogate(64, 2, 2).save_pretrained(tmp_path / "s")
    Surrogate(32, 2, 2).save_pretrained(tmp_path / "other")
    model = tiny_model("llama")
    press = PerLayerCompressionPress(
        press=SurrogateScorerPress(surrogate_path=str(tmp_path / "s")), compression_ratios=[0.5, 0.25]
    )
    with press(model):
        cache = model(_ids(40), past_key_values=DynamicCache()).past_key_values
    assert [layer.keys.shape[-2] for layer in cache.layers] == [20, 30]
    other = PerLayerCompressionPress(
        press=SurrogateScorerPress(surrogate_path=str(tmp_path / "other")), compression_ratios=[0.5, 0.5]
    )
    with pytest.raises(ValueError, match="does not match the model's"), other(model):
        model(_ids(40), past_key_values=DynamicCache())


def test_composed_press_reads_our_ratio_on_a_hybrid_model():
    """ComposedPress reads the ratio after every layer's hook, Gemma 3's sliding ones (not judged) first."""
    config = AutoConfig.for_model(
        "gemma3_text", vocab_size=400, **{**COMMON, "num_hidden_layers": 6, "sliding_window": 4096}
    )
    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config).eval()
    ratios = []
    for wrap in (lambda press: press, lambda press: ComposedPress([press])):
        press = KVzapPress(KnormPress(), 0.0, WINDOW)
        with wrap(press)(model):
            model(_ids(40), past_key_values=DynamicCache(config=config))
        ratios.append(press.compression_ratio)
    assert ratios[0] == ratios[1] > 0
