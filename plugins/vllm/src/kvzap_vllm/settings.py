"""The plugin's settings, read from the engine's `additional_config["kvzap"]` (`--additional-config` on the command
line), each bad value refused by name before the model loads."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from kvzap.window import WINDOW

LAYOUTS = ("per_layer", "per_head")  # the KV cache groups a pruning engine gets: one per layer, or per (layer, head)


@dataclass(frozen=True)
class KVzapSettings:
    surrogate: str  # a surrogate folder or Hub id, as KVzapPress loads it (ours or nvidia/KVzap-*)
    threshold: float = -math.inf  # keep an entry iff its predicted log score >= threshold
    window: int = WINDOW  # the most recent tokens are always kept
    record_scores: bool = False  # keep every forward's scores on the model (model.kvzap.scores), for inspection
    # judge each chunk of a chunked prefill as it is computed (the next chunk attends to the pruned cache), instead of
    # the whole prompt once its prefill is complete: a long prompt never holds its whole dense cache, but its verdicts
    # then depend on where the scheduler cut its chunks (its token budget, the queue)
    judge_chunks: bool = False
    # "per_layer": one KV cache group per layer, its heads filled to the most-keeping head's count (kvzap.fill);
    # "per_head": one group per (layer, KV head), each head keeping exactly KVzap's verdicts (kvzap_vllm.heads).
    # Read only when pruning: at threshold -inf the engine keeps vLLM's own cache layout
    layout: str = "per_layer"

    @classmethod
    def read(cls, additional_config) -> KVzapSettings | None:
        """None when the engine has no `kvzap` section (the plugin is installed but not asked for)."""
        section = (additional_config or {}).get("kvzap") if isinstance(additional_config, dict) else None
        if section is None:
            return None
        if not isinstance(section, dict):
            raise ValueError(
                f'additional_config["kvzap"] must be a mapping, e.g. {{"surrogate": "<folder>"}}, got {section!r}.'
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(f'additional_config["kvzap"]: unknown keys {unknown}; the keys are {sorted(known)}.')
        if not isinstance(section.get("surrogate"), str) or not section["surrogate"]:
            raise ValueError('additional_config["kvzap"]["surrogate"]: a surrogate folder or Hub id is needed.')
        threshold = section.get("threshold", -math.inf)
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or math.isnan(threshold):
            raise ValueError(f'additional_config["kvzap"]["threshold"]: a number (a log score), got {threshold!r}.')
        window = section.get("window", WINDOW)
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f'additional_config["kvzap"]["window"]: an integer >= 0 (tokens), got {window!r}.')
        flags = {name: section.get(name, False) for name in ("record_scores", "judge_chunks")}
        for name, value in flags.items():
            if not isinstance(value, bool):
                raise ValueError(f'additional_config["kvzap"]["{name}"]: true or false, got {value!r}.')
        layout = section.get("layout", "per_layer")
        if layout not in LAYOUTS:
            raise ValueError(f'additional_config["kvzap"]["layout"]: one of {list(LAYOUTS)}, got {layout!r}.')
        return cls(section["surrogate"], float(threshold), window, **flags, layout=layout)


def prunes(vllm_config) -> bool:
    """Whether the engine prunes (a kvzap section with a finite threshold); at -inf the plugin only scores, and the
    engine keeps vLLM's own cache layout."""
    settings = KVzapSettings.read(vllm_config.additional_config)
    return settings is not None and settings.threshold > -math.inf
