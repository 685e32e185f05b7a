"""Every compression method the pipeline can evaluate, by name: what it is parameterised by and how to build it.

KVzap methods are ours (physical eviction); the baselines are kvpress presses, configured as on the kvpress
leaderboard (evaluation/leaderboard.sh and evaluate_registry.py as kvpress.md describes them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import kvpress

from kvzap import duo_patterns
from kvzap.duo_patterns import duo_pattern_name  # noqa: F401  (config checks: is a DuoAttention pattern published?)
from kvzap.pruning import KVzapPress, TopKPerHeadPress, TopKPerLayerPress


@dataclass(frozen=True)
class Method:
    parameter: str  # "none", "threshold" or "ratio": what the sweep varies
    build: Callable  # (value, surrogates: {"linear": folder, "mlp": folder}, decoding: bool) -> press | None
    surrogate: str | None = None  # which trained surrogate the method needs
    attn_implementation: str | None = None  # forced attention implementation (None: the model's default)
    needs_hub: bool = False  # downloads extra weights at run time (unavailable offline)


def _ratio_press(factory: Callable) -> Callable:
    """A kvpress press at a fixed compression ratio, set the way kvpress's evaluation CLI sets it."""

    def build(ratio, surrogates, decoding):
        press = factory()
        press.compression_ratio = ratio
        return press

    return build


def _kvzap_threshold(kind: str) -> Callable:
    return lambda threshold, surrogates, decoding: KVzapPress(str(surrogates[kind]), threshold=threshold, decoding=decoding)


def _kvzap_topk(press_cls, kind: str) -> Callable:
    # window=0: kvpress's kvzap_mlp_head / kvzap_mlp_layer (the paper's Fig. 5 ablation) protect no window
    return lambda ratio, surrogates, decoding: press_cls(str(surrogates[kind]), ratio=ratio, window=0)


class PublishedDuoAttentionPress(kvpress.DuoAttentionPress):
    """DuoAttention with the authors' published pattern, found by the model's Hub id (see kvzap.duo_patterns).

    kvpress finds the pattern by config.name_or_path in its own table and always downloads from GitHub; this reads
    it by `config.kvzap_model_id` (set by kvzap.models.load), so renamed Hub ids and offline mirrors work too.
    """

    @staticmethod
    def load_attention_pattern(model):
        config = model.config
        model_id = getattr(config, "kvzap_model_id", config.name_or_path)
        sink_size, recent_size, scores = duo_patterns.read_pattern(model_id)
        expected = (config.num_hidden_layers, config.num_key_value_heads)
        if scores.shape != expected:
            raise ValueError(f"The DuoAttention pattern has head scores of shape {scores.shape}, but the model has "
                             f"(layers, KV heads) = {expected}: the pattern belongs to another model.")
        return sink_size, recent_size, scores


REGISTRY: dict[str, Method] = {
    "full": Method("none", lambda value, surrogates, decoding: None),
    "kvzap_linear": Method("threshold", _kvzap_threshold("linear"), "linear"),
    "kvzap_mlp": Method("threshold", _kvzap_threshold("mlp"), "mlp"),
    "kvzap_mlp_head": Method("ratio", _kvzap_topk(TopKPerHeadPress, "mlp"), "mlp"),
    "kvzap_mlp_layer": Method("ratio", _kvzap_topk(TopKPerLayerPress, "mlp"), "mlp"),
    "kvzip": Method("ratio", _ratio_press(kvpress.KVzipPress)),
    "kvzip_plus": Method("ratio", _ratio_press(lambda: kvpress.KVzipPress(kvzip_plus_normalization=True))),
    "random": Method("ratio", _ratio_press(lambda: kvpress.RandomPress(seed=42))),
    "knorm": Method("ratio", _ratio_press(kvpress.KnormPress)),
    "snapkv": Method("ratio", _ratio_press(kvpress.SnapKVPress)),
    "expected_attention": Method(
        "ratio", _ratio_press(lambda: kvpress.AdaKVPress(kvpress.ExpectedAttentionPress(epsilon=1e-2)))),
    "streaming_llm": Method("ratio", _ratio_press(kvpress.StreamingLLMPress)),
    "tova": Method("ratio", _ratio_press(kvpress.TOVAPress)),
    "observed_attention": Method("ratio", _ratio_press(kvpress.ObservedAttentionPress), attn_implementation="eager"),
    "qfilter": Method("ratio", _ratio_press(kvpress.QFilterPress), needs_hub=True),
    "pyramidkv": Method("ratio", _ratio_press(kvpress.PyramidKVPress)),
    "lagkv": Method("ratio", _ratio_press(kvpress.LagKVPress)),
    "keydiff": Method("ratio", _ratio_press(kvpress.KeyDiffPress)),
    "adakv_compactor": Method("ratio", _ratio_press(lambda: kvpress.AdaKVPress(kvpress.CompactorPress()))),
    "cur": Method("ratio", _ratio_press(kvpress.CURPress)),
    "duo_attention": Method(
        "ratio", lambda ratio, surrogates, decoding: PublishedDuoAttentionPress(head_compression_ratio=ratio),
        needs_hub=True),
    # head scores computed from kmfoda/booksum samples (Hub dataset) with the model's tokenizer
    "duo_attention_on_the_fly": Method(
        "ratio", lambda ratio, surrogates, decoding: kvpress.DuoAttentionPress(head_compression_ratio=ratio,
                                                                                on_the_fly_scoring=True),
        needs_hub=True),
}


def get(name: str) -> Method:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"Unknown method {name!r}; known methods: {', '.join(sorted(REGISTRY))}.") from None


def build(name: str, value: float | None, surrogates: dict[str, Path], decoding: bool = False):
    """The press for one evaluation cell (None for the full cache)."""
    method = get(name)
    if method.parameter != "none" and value is None:
        raise ValueError(f"Method {name!r} needs a {method.parameter}.")
    return method.build(value, surrogates, decoding)

