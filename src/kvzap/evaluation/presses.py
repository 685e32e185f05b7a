"""How to build the press of every method named in kvzap.evaluation.methods (which says what each method is).

KVzap methods are ours (physical eviction); the baselines are kvpress presses, configured as on the kvpress
leaderboard (evaluation/leaderboard.sh and evaluate_registry.py as kvpress.md describes them).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import kvpress
from kvpress.presses import kvzip_press
from transformers import AutoTokenizer

from kvzap.evaluation import duo_patterns, methods
from kvzap.pruning import KVzapPress, TopKPerHeadPress, TopKPerLayerPress


def _ratio_press(factory: Callable) -> Callable:
    """A kvpress press at a fixed compression ratio, set the way kvpress's evaluation CLI sets it."""

    def build(ratio, surrogates, decoding):
        press = factory()
        press.compression_ratio = ratio
        return press

    return build


@functools.cache
def _tokenizer(name_or_path: str):
    return AutoTokenizer.from_pretrained(name_or_path)


def _kvzip(**options) -> kvpress.KVzipPress:
    """kvpress's KVzipPress, sharing one tokenizer per model in this process. Unchanged, it reloads the tokenizer from
    disk at every prompt (about 2 s for Qwen3's 151k vocabulary: longer than KVzip's own work on a GPU at 4k tokens,
    hours over RULER's 6,500 prompts) only to read the chat template's prefix and suffix, which never change."""
    kvzip_press.AutoTokenizer = SimpleNamespace(from_pretrained=_tokenizer)
    return kvpress.KVzipPress(**options)


def _kvzap_threshold(name: str) -> Callable:
    """KVzap at threshold τ with the registry's surrogate, window and prefill chunk (each variant changes one)."""
    info = methods.METHODS[name]
    window = {} if info.window is None else {"window": info.window}
    return lambda threshold, surrogates, decoding: KVzapPress(
        str(surrogates[info.surrogate]),
        threshold=threshold,
        decoding=decoding,
        prefill_chunk=info.prefill_chunk,
        **window,
    )


def _kvzap_topk(press_cls, kind: str) -> Callable:
    # window=0: kvpress's kvzap_mlp_head / kvzap_mlp_layer (the paper's Fig. 5 ablation) protect no window
    return lambda ratio, surrogates, decoding: press_cls(str(surrogates[kind]), ratio=ratio, window=0)


class PublishedDuoAttentionPress(kvpress.DuoAttentionPress):
    """DuoAttention with the authors' published pattern, found by the model's Hub id (kvzap.evaluation.duo_patterns).

    kvpress finds the pattern by config.name_or_path in its own table and always downloads from GitHub; this reads
    it by `config.kvzap_model_id` (set by kvzap.prepare.models.load), so renamed Hub ids and offline mirrors work too.
    """

    @staticmethod
    def load_attention_pattern(model):
        config = model.config
        model_id = getattr(config, "kvzap_model_id", config.name_or_path)
        sink_size, recent_size, scores = duo_patterns.read_pattern(model_id)
        expected = (config.num_hidden_layers, config.num_key_value_heads)
        if scores.shape != expected:
            raise ValueError(
                f"The DuoAttention pattern has head scores of shape {scores.shape}, but the model has "
                f"(layers, KV heads) = {expected}: the pattern belongs to another model."
            )
        return sink_size, recent_size, scores


# name -> (value, surrogates {"linear": folder, "mlp": folder}, decoding) -> press (None: the full cache)
PRESSES: dict[str, Callable] = {
    "full": lambda value, surrogates, decoding: None,
    "kvzap_linear": _kvzap_threshold("kvzap_linear"),
    "kvzap_mlp": _kvzap_threshold("kvzap_mlp"),
    "kvzap_mlp_w0": _kvzap_threshold("kvzap_mlp_w0"),
    "kvzap_mlp_w512": _kvzap_threshold("kvzap_mlp_w512"),
    "kvzap_mlp_chunked": _kvzap_threshold("kvzap_mlp_chunked"),
    "kvzap_mlp_head": _kvzap_topk(TopKPerHeadPress, "mlp"),
    "kvzap_mlp_layer": _kvzap_topk(TopKPerLayerPress, "mlp"),
    "kvzip": _ratio_press(_kvzip),
    "kvzip_plus": _ratio_press(lambda: _kvzip(kvzip_plus_normalization=True)),
    "random": _ratio_press(lambda: kvpress.RandomPress(seed=42)),
    "knorm": _ratio_press(kvpress.KnormPress),
    "snapkv": _ratio_press(kvpress.SnapKVPress),
    "expected_attention": _ratio_press(lambda: kvpress.AdaKVPress(kvpress.ExpectedAttentionPress(epsilon=1e-2))),
    "streaming_llm": _ratio_press(kvpress.StreamingLLMPress),
    "tova": _ratio_press(kvpress.TOVAPress),
    "observed_attention": _ratio_press(kvpress.ObservedAttentionPress),
    "qfilter": _ratio_press(kvpress.QFilterPress),
    "pyramidkv": _ratio_press(kvpress.PyramidKVPress),
    "lagkv": _ratio_press(kvpress.LagKVPress),
    "keydiff": _ratio_press(kvpress.KeyDiffPress),
    "adakv_compactor": _ratio_press(lambda: kvpress.AdaKVPress(kvpress.CompactorPress())),
    "cur": _ratio_press(kvpress.CURPress),
    "duo_attention": lambda ratio, surrogates, decoding: PublishedDuoAttentionPress(head_compression_ratio=ratio),
    # head scores computed from kmfoda/booksum samples (Hub dataset) with the model's tokenizer
    "duo_attention_on_the_fly": lambda ratio, surrogates, decoding: kvpress.DuoAttentionPress(
        head_compression_ratio=ratio, on_the_fly_scoring=True
    ),
}


def get(name: str) -> methods.MethodInfo:
    return methods.info(name)


def build(name: str, value: float | None, surrogates: dict[str, Path], decoding: bool = False):
    """The press for one evaluation cell (None for the full cache)."""
    method = get(name)
    if method.parameter != "none" and value is None:
        raise ValueError(f"Method {name!r} needs a {method.parameter}.")
    return PRESSES[name](value, surrogates, decoding)
