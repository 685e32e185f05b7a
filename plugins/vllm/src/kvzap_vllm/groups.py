"""One KV cache group per attention layer, so each layer has its own block table and holds blocks for its own kept
entries: vLLM puts all layers of a dense model in one group, whose single block table would have to keep what the
most-keeping layer keeps (step 0: 1.00-1.05x the sequences). The groups share one block pool. With the per-head
layout each (layer, KV head) is an attention layer of its own (kvzap_vllm.heads), so the same rule gives each head
its own group."""

from __future__ import annotations

from vllm.v1.core import kv_cache_utils
from vllm.v1.kv_cache_interface import FullAttentionSpec

from kvzap_vllm.settings import prunes

_ORIGINAL = kv_cache_utils.get_kv_cache_groups


def get_kv_cache_groups(vllm_config, kv_cache_spec):
    if not prunes(vllm_config):
        return _ORIGINAL(vllm_config, kv_cache_spec)
    others = sorted({type(spec).__name__ for spec in kv_cache_spec.values() if type(spec) is not FullAttentionSpec})
    if others:
        raise ValueError(f"KVzap prunes full-attention layers only; this model also has {', '.join(others)} layers.")
    return kv_cache_utils.create_kv_cache_group_specs(kv_cache_spec, [[name] for name in kv_cache_spec])


def install() -> None:
    kv_cache_utils.get_kv_cache_groups = get_kv_cache_groups
