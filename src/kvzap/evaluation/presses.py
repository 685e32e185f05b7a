"""How to build the press of every method named in kvzap.evaluation.methods (which says what each method is).

KVzap methods are ours (physical eviction); the baselines are kvpress presses, configured as on the kvpress
leaderboard (evaluation/leaderboard.sh and evaluate_registry.py as kvpress.md describes them). On hybrid models
every kvpress press prunes the full-attention layers only (`FullLayersOnly`), as ours do.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import kvpress
from kvpress.presses import kvzip_press
from torch import nn
from transformers import AutoTokenizer

from kvzap import families
from kvzap.evaluation import duo_patterns, methods
from kvzap.introspection import attention_modules
from kvzap.layer_types import layer_types, pruned_layers, skipped_layers
from kvzap.pruning import KVzapPress, TopKPerHeadPress, TopKPerLayerPress


class FullLayersOnly:
    """A kvpress press that leaves sliding-window (and chunked) layers alone on every model.

    kvpress 0.5.5 skips them only for Gemma3ForConditionalGeneration; on Gemma3ForCausalLM, gpt-oss, Cohere 2, ...
    it would prune their bounded window as well. Once kvpress has registered its hooks, this removes them from the
    layers kvzap.layer_types skips, and hands the hooked layers a rotary embedding of their own layer type where the
    model keeps one per type. A press's compression_ratio is then the fraction removed from each full-attention
    layer: on a hybrid model the sliding layers keep their window (metrics.json's kv_bytes counts every layer).
    """

    @contextmanager
    def __call__(self, model):
        reason = self._refusal(model)
        if reason:
            raise ValueError(f"{type(self).__name__} cannot run on this {model.config.model_type} model: {reason}.")
        with super().__call__(model):
            modules, skipped = attention_modules(model), set(skipped_layers(model.config))
            for i, (module, kind) in enumerate(zip(modules, layer_types(model.config))):
                rotary = getattr(module, "rotary_emb", None)  # set by kvpress (KVzip: only for its replay)
                if i in skipped:
                    _unhook(module, self.forward_hook)
                elif rotary is not None and "layer_type" in inspect.signature(rotary.forward).parameters:
                    module.rotary_emb = TypedRotary(rotary, kind)
            yield

    def _refusal(self, model) -> str | None:
        if not pruned_layers(model.config):
            return "every layer is sliding-window (or chunked) attention: there is no full-attention layer to prune"
        return families.kvzip_reason(model.config.to_dict()) if isinstance(self, kvpress.KVzipPress) else None


class TypedRotary(nn.Module):
    """A rotary embedding with one frequency table per layer type (Gemma 3's), called as kvpress calls one:
    `(x, position_ids)`. Expected Attention rotates its query statistics with it, and crashes without the type."""

    def __init__(self, rotary: nn.Module, layer_type: str):
        super().__init__()
        self.rotary, self.layer_type = rotary, layer_type

    def forward(self, x, position_ids):
        return self.rotary(x, position_ids, self.layer_type)


def _unhook(module, hook) -> None:
    """Remove `hook` from a module's forward hooks: kvpress keeps the handles, and removing them at exit is a no-op."""
    for key in [key for key, registered in module._forward_hooks.items() if registered == hook]:
        del module._forward_hooks[key]
        module._forward_hooks_with_kwargs.pop(key, None)


@functools.cache
def _full_layers_class(cls: type) -> type:
    return type(cls.__name__, (FullLayersOnly, cls), {})


def _full_layers_only(press):
    """The press, made a FullLayersOnly of its own class (so kvpress's isinstance checks still hold)."""
    press.__class__ = _full_layers_class(type(press))
    return press


def _ratio_press(factory: Callable) -> Callable:
    """A kvpress press at a fixed compression ratio, set the way kvpress's evaluation CLI sets it (on a hybrid model,
    the ratio of its full-attention layers)."""

    def build(ratio, surrogates, decoding):
        press = factory()
        press.compression_ratio = ratio
        return _full_layers_only(press)

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
    return lambda threshold, surrogates, decoding: KVzapPress(
        str(surrogates[info.surrogate]),
        threshold=threshold,
        decoding=decoding,
        prefill_chunk=info.prefill_chunk,
        window=info.protected_window,
    )


def _kvzap_topk(press_cls, name: str) -> Callable:
    """The paper's Fig. 5 ablation: a fixed top-k per head or layer, with the registry's surrogate and window."""
    info = methods.METHODS[name]
    return lambda ratio, surrogates, decoding: press_cls(
        str(surrogates[info.surrogate]), ratio=ratio, window=info.protected_window
    )


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
    "kvzap_mlp_head": _kvzap_topk(TopKPerHeadPress, "kvzap_mlp_head"),
    "kvzap_mlp_layer": _kvzap_topk(TopKPerLayerPress, "kvzap_mlp_layer"),
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
    "duo_attention": lambda ratio, surrogates, decoding: _full_layers_only(
        PublishedDuoAttentionPress(head_compression_ratio=ratio)
    ),
    # head scores computed from kmfoda/booksum samples (Hub dataset) with the model's tokenizer
    "duo_attention_on_the_fly": lambda ratio, surrogates, decoding: _full_layers_only(
        kvpress.DuoAttentionPress(head_compression_ratio=ratio, on_the_fly_scoring=True)
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
