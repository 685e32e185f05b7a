"""kvpress's own press checks (the tests/ of its sdist, run unchanged: tests/kvpress_suite.py) on every kvzap press,
with kvpress's DMSPress(KVzapPress) beside them as the control, so a kvpress upgrade that breaks a kvpress user's
code with our presses fails here.

Their test functions are called with our presses where theirs stood: as the argument they are parametrised over
(`press_dict`, `press_factory`, `press_cls`, `case`), or as the press class they name, replaced in their module for
the call. Where a wrapper cannot hold a press of ours, the check asserts our refusal by name instead (REFUSED). Every
test function of the eight files is either run here or listed in NOT_APPLICABLE with its reason, and a test holds the
two lists to the files, so a new kvpress check must be placed.

Per press, what does not apply:
- ours that judge tokens themselves (KVzapPress, KVzapLayerFillPress, TopKPer*Press) and the control are not
  ScorerPresses: kvpress's wrappers that take one (AdaKVPress, ChunkPress, DecodingPress, PerLayerCompressionPress,
  ...) assert it at construction, and kvpress's test_presses_run returns at once for them;
- checks that read the cache's length as the number of kept tokens (`_length_checks`): a press that judges tokens
  keeps get_seq_length() at the unpruned length, as kvpress's DMSPress does (they fail on the control too, as a test
  below shows); ours report what they keep in their ratios and `held_kv_bytes`;
- with decoding=True, ours are refused under kvpress's pipeline (REFUSED: it answers after leaving the press's
  block), where the control runs (the pipeline re-enters DMSPress);
- compress-level checks (test_scorer_press.py) call `press.compress` on a stand-in module: our fixed-budget presses
  enter them through `CompressView`, their verdict at window 0 in kvpress's compress form; the threshold presses have
  no budget (a threshold may remove a whole head, as DMSPress may), and our scorers inherit ScorerPress.compress.
"""

from __future__ import annotations

import re
from contextlib import nullcontext

import pytest
import torch
from kvpress import ChunkPress, ComposedPress, DMSPress, KnormPress, ScorerPress

import kvpress_suite
from kvpress_suite import CompressView, check_names, parametrized, save_unit_test_folder, unit_test_pipeline
from kvzap.pruning import (
    KVzapLayerFillPress,
    KVzapPress,
    PrecomputedScorerPress,
    SurrogateScorerPress,
    TopKPerHeadPress,
    TopKPerLayerPress,
)
from kvzap.surrogate.model import Surrogate

pytestmark = pytest.mark.usefixtures("one_thread")

THRESHOLD, WINDOW = 0.0, 4
CONTROL = "DMSPress(KVzapPress)"

presses_tests = kvpress_suite.module("presses.test_presses")
press_call_tests = kvpress_suite.module("test_press_call")
pipeline_tests = kvpress_suite.module("test_pipeline")
head_tests = kvpress_suite.module("presses.test_head_compression")
decoding_tests = kvpress_suite.module("test_decoding_compression")
scorer_tests = kvpress_suite.module("presses.test_scorer_press")
per_layer_tests = kvpress_suite.module("test_per_layer_compression_press")
generate_tests = kvpress_suite.module("test_generate")
KvpressKVzapPress = kvpress_suite.module("default_presses").TestKVzapPress  # kvpress's KVzapPress, random, offline


def _scorer(compression_ratio: float = 0.0) -> SurrogateScorerPress:
    torch.manual_seed(1)
    return SurrogateScorerPress(surrogate=Surrogate(24, 2, 2).eval(), compression_ratio=compression_ratio)


def _precomputed(compression_ratio: float = 0.0) -> PrecomputedScorerPress:
    scores = torch.randn(2, 2, 512, generator=torch.Generator().manual_seed(3))
    return PrecomputedScorerPress(scores=scores, compression_ratio=compression_ratio)


# name -> press from kvpress's `compression_ratio` (the threshold presses prune at THRESHOLD whatever it is)
PRESSES = {
    "KVzapPress": lambda compression_ratio=0.0: KVzapPress(_scorer(), THRESHOLD, WINDOW),
    "KVzapPress(evict=False)": lambda compression_ratio=0.0: KVzapPress(_scorer(), THRESHOLD, WINDOW, evict=False),
    "KVzapLayerFillPress": lambda compression_ratio=0.0: KVzapLayerFillPress(_scorer(), THRESHOLD, WINDOW),
    "TopKPerHeadPress": lambda compression_ratio=0.0: TopKPerHeadPress(_scorer(), compression_ratio, WINDOW),
    "TopKPerLayerPress": lambda compression_ratio=0.0: TopKPerLayerPress(_scorer(), compression_ratio, WINDOW),
    "SurrogateScorerPress": _scorer,
    "PrecomputedScorerPress": _precomputed,
    CONTROL: lambda compression_ratio=0.0: DMSPress(KvpressKVzapPress(), THRESHOLD, WINDOW),
}
DECODING = {
    "KVzapPress(decoding=True)": lambda compression_ratio=0.0: KVzapPress(_scorer(), THRESHOLD, WINDOW, True),
    "KVzapLayerFillPress(decoding=True)": lambda compression_ratio=0.0: KVzapLayerFillPress(
        _scorer(), THRESHOLD, WINDOW, True
    ),
    f"{CONTROL}(decoding=True)": lambda compression_ratio=0.0: DMSPress(KvpressKVzapPress(), THRESHOLD, WINDOW, True),
}
ALL = {**PRESSES, **DECODING}
SCORERS = [name for name, make in PRESSES.items() if isinstance(make(), ScorerPress)]
PIPELINE_DECODING = "under kvpress's pipeline: the pipeline prunes the context inside the press's block"
# (press, wrapper or decoding setting) -> our refusal's key words, asserted where kvpress's check would run the press
REFUSED = {
    ("PrecomputedScorerPress", ChunkPress): "ChunkPress asked PrecomputedScorerPress to score",
    **{(name, "pipeline"): PIPELINE_DECODING for name in DECODING if not name.startswith(CONTROL)},
    **{(name, "DecodingPress"): f"DecodingPress asked {name} to score" for name in SCORERS},
    **{(name, "CAMPress"): f"CAMPress asked {name} to score" for name in SCORERS},
}


def _refused(name: str, where):
    words = REFUSED.get((name, where))
    return pytest.raises(ValueError, match=re.escape(words)) if words else nullcontext()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_unit_test_folder(tmp_path_factory.mktemp("llama2-0b-unit-test"))


@pytest.fixture
def unit_test_model(folder):
    return kvpress_suite.unit_test_model(folder)


@pytest.fixture
def kv_press_unit_test_pipeline(unit_test_model):
    return unit_test_pipeline(unit_test_model)


def _with(monkeypatch, module, name: str, make) -> None:
    """Their module builds `name` (a kvpress press class): it builds ours instead, for this test."""
    monkeypatch.setattr(module, name, make)


# ---- presses/test_presses.py ---------------------------------------------------------------------------------


def _wrapper_cases():
    for name in PRESSES:
        for wrapper in parametrized(presses_tests.test_presses_run, "wrapper_press"):
            if wrapper in (None, ComposedPress) or name in SCORERS:  # kvpress's check returns at once otherwise
                yield pytest.param(name, wrapper, id=f"{name}-{getattr(wrapper, '__name__', 'alone')}")


@pytest.mark.parametrize("name, wrapper", list(_wrapper_cases()))
def test_presses_run(unit_test_model, name, wrapper):
    press_dict = {"cls": PRESSES[name], "kwargs": [{"compression_ratio": 0.2}, {"compression_ratio": 0.8}]}
    with _refused(name, wrapper):
        presses_tests.test_presses_run(unit_test_model, press_dict, wrapper)


@pytest.mark.parametrize("name", SCORERS)
def test_chunk_press(unit_test_model, monkeypatch, name):
    _with(monkeypatch, presses_tests, "KnormPress", PRESSES[name])
    with _refused(name, ChunkPress):
        presses_tests.test_chunk_press(unit_test_model)


@pytest.mark.parametrize("name", SCORERS)
def test_chunkkv_press(unit_test_model, monkeypatch, name):
    _with(monkeypatch, presses_tests, "SnapKVPress", PRESSES[name])
    presses_tests.test_chunkkv_press(unit_test_model)


# ---- test_press_call.py ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PRESSES)
def test_context_manager_adds_and_removes_hook(unit_test_model, monkeypatch, name):
    _with(monkeypatch, press_call_tests, "KnormPress", PRESSES[name])
    press_call_tests.test_context_manager_adds_and_removes_hook(unit_test_model)


@pytest.mark.parametrize("name", SCORERS)
def test_context_manager_applies_compression(unit_test_model, monkeypatch, name):
    _with(monkeypatch, press_call_tests, "KnormPress", PRESSES[name])
    press_call_tests.test_context_manager_applies_compression(unit_test_model)


# ---- test_pipeline.py ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCORERS)
@pytest.mark.parametrize("question", parametrized(pipeline_tests.test_pipeline_single_or_no_question, "question"))
def test_pipeline_single_or_no_question(kv_press_unit_test_pipeline, monkeypatch, caplog, name, question):
    _with(monkeypatch, pipeline_tests, "ExpectedAttentionPress", PRESSES[name])
    pipeline_tests.test_pipeline_single_or_no_question(kv_press_unit_test_pipeline, question, caplog)


@pytest.mark.parametrize("name", SCORERS)
def test_pipeline(kv_press_unit_test_pipeline, monkeypatch, caplog, name):
    _with(monkeypatch, pipeline_tests, "ExpectedAttentionPress", PRESSES[name])
    pipeline_tests.test_pipeline(kv_press_unit_test_pipeline, caplog)


@pytest.mark.parametrize("name", SCORERS)
def test_pipeline_compresses_context(unit_test_model, monkeypatch, caplog, name):
    _with(monkeypatch, pipeline_tests, "ExpectedAttentionPress", PRESSES[name])
    pipeline_tests.test_pipeline_compresses_context(unit_test_model, caplog)


@pytest.mark.parametrize("name", ALL)
def test_pipeline_with_cache(kv_press_unit_test_pipeline, monkeypatch, name):
    _with(monkeypatch, pipeline_tests, "ExpectedAttentionPress", ALL[name])
    with _refused(name, "pipeline"):
        pipeline_tests.test_pipeline_with_cache(kv_press_unit_test_pipeline)


@pytest.mark.parametrize("name", ALL)
def test_pipeline_only_computes_the_logits_it_needs(kv_press_unit_test_pipeline, name):
    with _refused(name, "pipeline"):
        pipeline_tests.test_pipeline_only_computes_the_logits_it_needs(kv_press_unit_test_pipeline, ALL[name])


# ---- test_generate.py ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_generate(kv_press_unit_test_pipeline, monkeypatch, name):
    _with(monkeypatch, generate_tests, "KnormPress", ALL[name])
    with _refused(name, "pipeline"):
        generate_tests.test_generate(kv_press_unit_test_pipeline)


# ---- presses/test_head_compression.py --------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCORERS)
@pytest.mark.parametrize("wrapper", parametrized(head_tests.test_wrapper_head_compression, "wrapper_press"))
@pytest.mark.parametrize("ratio", parametrized(head_tests.test_wrapper_head_compression, "compression_ratio"))
def test_wrapper_head_compression(unit_test_model, monkeypatch, name, wrapper, ratio):
    _with(monkeypatch, head_tests, "KnormPress", PRESSES[name])
    head_tests.test_wrapper_head_compression(unit_test_model, wrapper, ratio)


def _dms_like(make_whole):
    """kvpress's `DMSPress(press=..., threshold=..., sliding_window_size=..., decoding=...)` call, building ours."""
    return lambda press, threshold, sliding_window_size, decoding: make_whole(
        press, threshold, sliding_window_size, decoding
    )


@pytest.mark.parametrize(
    "name, swapped, make",
    [
        *[(n, "RandomPress", PRESSES[n]) for n in SCORERS],  # DMSPress holding our scorer
        ("KVzapPress(decoding=True)", "DMSPress", _dms_like(KVzapPress)),
        ("KVzapLayerFillPress(decoding=True)", "DMSPress", _dms_like(KVzapLayerFillPress)),
        (CONTROL, "RandomPress", KvpressKVzapPress),
    ],
)
def test_dms_press_compression_ratio(kv_press_unit_test_pipeline, monkeypatch, name, swapped, make):
    _with(monkeypatch, head_tests, swapped, make)
    with _refused(name, "pipeline"):
        head_tests.test_dms_press_compression_ratio(kv_press_unit_test_pipeline)


# ---- test_decoding_compression.py ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCORERS)
@pytest.mark.parametrize(
    "factory", parametrized(decoding_tests.test_all_presses_work_with_decoding_press, "press_factory")
)
def test_all_presses_work_with_decoding_press(kv_press_unit_test_pipeline, monkeypatch, name, factory):
    monkeypatch.setattr(decoding_tests, "pipeline", lambda *args, **kwargs: kv_press_unit_test_pipeline)
    wrapper = factory(target_size=48, compression_interval=3, base_press=KnormPress()).__class__.__name__
    with _refused(name, wrapper):
        decoding_tests.test_all_presses_work_with_decoding_press(factory, {"cls": PRESSES[name], "kwargs": [{}]})


@pytest.mark.parametrize("name", ALL)
def test_decoding_press_reuse_across_sequences(unit_test_model, name):
    decoding_tests.test_decoding_press_reuse_across_sequences(lambda: ALL[name](0.5), unit_test_model)


# ---- test_per_layer_compression_press.py -----------------------------------------------------------------------


@pytest.mark.parametrize("name", SCORERS)
def test_per_layer_compression_press(unit_test_model, monkeypatch, name):
    _with(monkeypatch, per_layer_tests, "KnormPress", PRESSES[name])
    per_layer_tests.test_per_layer_compression_press(unit_test_model)


# ---- presses/test_scorer_press.py ------------------------------------------------------------------------------

SHORT_CONTEXT = [
    scorer_tests.ShortContextCase(
        name,
        lambda ratio, cls=cls: CompressView(cls(KnormPress(), ratio, window=0)),
        module,
        scorer_tests._no_attentions,
    )
    for name, cls, module in [
        ("TopKPerHeadPress", TopKPerHeadPress, scorer_tests._simple_module),
        ("TopKPerLayerPress", TopKPerLayerPress, scorer_tests._adakv_module),
    ]
]


@pytest.mark.parametrize(
    "k_len, ratio", parametrized(scorer_tests.test_compress_never_empties_cache_on_short_context, "k_len, ratio")
)
@pytest.mark.parametrize("case", SHORT_CONTEXT, ids=lambda case: case.id)
def test_compress_never_empties_cache_on_short_context(case, k_len, ratio):
    scorer_tests.test_compress_never_empties_cache_on_short_context(case, k_len, ratio)


def test_adakv_safeguard_protects_every_head():
    view = lambda press: CompressView(TopKPerLayerPress(press, press.compression_ratio, window=0))  # noqa: E731
    scorer_tests.test_adakv_safeguard_protects_every_head(view)


# ---- what is not run, and why -------------------------------------------------------------------------------------

MODULES = {
    "presses.test_presses": presses_tests,
    "test_press_call": press_call_tests,
    "test_pipeline": pipeline_tests,
    "presses.test_head_compression": head_tests,
    "test_decoding_compression": decoding_tests,
    "presses.test_scorer_press": scorer_tests,
    "test_per_layer_compression_press": per_layer_tests,
    "test_generate": generate_tests,
}
_DECODING_PRESS = (
    "DecodingPress / CAMPress around kvpress's KnormPress, no press of ours (the form that takes any press, "
    "test_all_presses_work_with_decoding_press, runs)"
)
NOT_APPLICABLE = {
    "presses.test_presses::test_composed_press": "kvpress's KnormPress composed with its ThinKPress, no press of ours "
    "(ours in ComposedPress: test_presses_run)",
    "presses.test_presses::test_presses_run_observed_attention": "kvpress's ObservedAttentionPress only",
    "presses.test_presses::test_presses_keep_highest_score": "kvpress's StoreKnormPress through ScorerPress.compress, "
    "which our scorers inherit unchanged",
    "test_pipeline::TestPipelineFA2::test_pipeline_fa2": "a GPU, flash-attn and meta-llama/Llama-3.2-1B-Instruct",
    "test_pipeline::test_pipeline_no_press_works": "no press",
    "test_pipeline::test_pipeline_answer_is_correct": "a trained model's answer (h2oai/h2o-danube3-500m-chat)",
    "test_pipeline::test_pipeline_with_quantized_cache": "optimum-quanto and h2oai/h2o-danube3-500m-chat (ours prune "
    "a DynamicCache and refuse others)",
    "test_pipeline::test_pipeline_context_cache_is_invariant": "no press: the pipeline's own cache handling",
    "presses.test_head_compression::test_head_compression": "KVzipPress, KVgradPress and KVComposePress's own "
    "head compression",
    **{
        f"test_decoding_compression::{name}": _DECODING_PRESS
        for name in (
            "test_decoding_compression",
            "test_prefill_decoding_press_calls_both_phases",
            "test_decoding_press_without_prefill",
            "test_prefill_decoding_press_decoding_only",
            "test_decoding_press_equivalence",
            "test_compression_actually_reduces_memory",
        )
    },
    **{
        f"test_decoding_compression::{name}": "CompressionRatioDecodingPress's budget arithmetic, no press"
        for name in check_names("test_decoding_compression")
        if name.startswith("test_sequence_ratio_decoding_press_")
    },
}


def test_every_check_is_run_or_not_applicable():
    theirs = {f"{key}::{name}" for key in MODULES for name in check_names(key)}
    ported = {f"{key}::{name}" for key in MODULES for name in check_names(key) if name in globals()}
    assert theirs - ported == set(NOT_APPLICABLE)
    assert len(ported) == 18


def _length_checks(model, pipe, caplog) -> dict:
    """The checks that read the cache's length as the tokens kept: a press that judges tokens (ours, DMSPress) keeps
    the unpruned length there, so they apply to our scorers only."""
    return {
        "test_context_manager_applies_compression": (
            press_call_tests,
            "KnormPress",
            lambda: press_call_tests.test_context_manager_applies_compression(model),
        ),
        "test_pipeline": (pipeline_tests, "ExpectedAttentionPress", lambda: pipeline_tests.test_pipeline(pipe, caplog)),
        "test_pipeline_single_or_no_question": (
            pipeline_tests,
            "ExpectedAttentionPress",
            lambda: pipeline_tests.test_pipeline_single_or_no_question(pipe, "", caplog),
        ),
        "test_pipeline_compresses_context": (
            pipeline_tests,
            "ExpectedAttentionPress",
            lambda: pipeline_tests.test_pipeline_compresses_context(model, caplog),
        ),
    }


@pytest.mark.parametrize("check", list(_length_checks(None, None, None)))
def test_the_length_checks_fail_on_the_control(
    unit_test_model, kv_press_unit_test_pipeline, monkeypatch, caplog, check
):
    module, theirs, run = _length_checks(unit_test_model, kv_press_unit_test_pipeline, caplog)[check]
    monkeypatch.setattr(module, theirs, PRESSES[CONTROL])
    with pytest.raises(AssertionError, match=r"Compressed Context Length: 13|= int\(\(5 \* 0.8\)\)"):
        run()
