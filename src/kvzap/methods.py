"""Every compression method the pipeline can evaluate, by name: what it is parameterised by and how to build it.

KVzap methods are ours (physical eviction); the baselines are kvpress presses, configured as on the kvpress
leaderboard (evaluation/leaderboard.sh and evaluate_registry.py as kvpress.md describes them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import kvpress

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
        "ratio", lambda ratio, surrogates, decoding: kvpress.DuoAttentionPress(head_compression_ratio=ratio),
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

