"""Engine settings KVzap cannot run under, refused when the engine builds its model, each named with its fix.

Prefix caching shares blocks between requests, and a block pruned for one request would be pruned for all; a
speculative decoder writes and rolls back KV entries the pruning would have judged; CUDA graphs replay fixed shapes,
which per-layer kept counts do not have; an architecture without an override has no hook for the surrogate."""

from __future__ import annotations


def refusal(vllm_config, architecture: str, supported: tuple[str, ...]) -> str | None:
    """Why KVzap cannot serve with `vllm_config`, or None."""
    if architecture not in supported:
        return f"the model architecture {architecture} has no KVzap override (supported: {', '.join(supported)})"
    if vllm_config.cache_config.enable_prefix_caching:
        return "prefix caching is on: start the engine with --no-enable-prefix-caching (enable_prefix_caching=False)"
    if vllm_config.speculative_config is not None:
        return "speculative decoding is configured: start the engine without --speculative-config"
    if not vllm_config.model_config.enforce_eager:
        return "CUDA graphs / torch.compile are on: start the engine with --enforce-eager (enforce_eager=True)"
    return None


def pruning_refusal(vllm_config, scheduler: str) -> str | None:
    """Why this engine can score but not prune, or None. The compaction runs in the worker and the block accounting
    in the scheduler, which share one process (kvzap_vllm.ledger) and must see each step's result before the next
    step is scheduled; the compaction addresses the CPU attention backend's block layout."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return "pruning runs on vLLM's CPU backend in this version (threshold -inf scores on any backend)"
    parallel = vllm_config.parallel_config
    if parallel.world_size > 1 or parallel.data_parallel_size > 1:
        return "tensor, pipeline or data parallelism is configured: pruning needs one worker in the engine's process"
    if parallel.distributed_executor_backend not in (None, "uni"):
        return (
            f"the {parallel.distributed_executor_backend!r} executor runs workers in other processes: start the engine "
            'with --distributed-executor-backend uni (distributed_executor_backend="uni"); on the CPU backend also '
            "set VLLM_ENABLE_V1_MULTIPROCESSING=0, or vLLM moves the worker to a process of its own"
        )
    if vllm_config.scheduler_config.async_scheduling:
        return "async scheduling is on: start the engine with --no-async-scheduling (async_scheduling=False)"
    custom = vllm_config.scheduler_config.scheduler_cls
    if custom not in (None, scheduler) and not str(custom).endswith(".Scheduler"):
        return f"a custom scheduler ({custom}) is configured: pruning brings its own ({scheduler})"
    return None


def sliding_refusal(windows: dict[str, int | None]) -> str | None:
    """Why the model's attention layers cannot be pruned, or None. A sliding-window layer keeps a cache vLLM bounds
    itself (its SlidingWindowSpec, which the one-group-per-layer layout does not take) and transformers' KVzap
    leaves alone. `windows`: the attention layers vLLM built, name -> sliding window (None: full attention)."""
    sliding = sorted(name for name, window in windows.items() if window is not None)
    if not sliding:
        return None
    sizes = "/".join(str(size) for size in sorted({windows[name] for name in sliding}))
    return (
        f"{len(sliding)} of {len(windows)} attention layers ({sliding[0]}, ...) slide over a {sizes}-token window, "
        "and pruning needs full-attention layers: start the engine with --disable-sliding-window "
        "(disable_sliding_window=True; vLLM then attends over every token and caps max_model_len at the window)"
    )


def attention_refusal(attention_groups) -> str | None:
    """Why the worker's attention metadata cannot carry each layer's own lengths, or None. A metadata builder that
    updates a cached metadata's block table (`supports_update_block_table`, as FlashAttention's does) makes vLLM
    reuse one KV cache group's metadata, sequence lengths included, for the other groups, so every layer would read
    the first layer's kept count; a kernel block size other than the KV cache manager's (the group's
    `kernel_block_size`) breaks the compaction's slot arithmetic. `attention_groups`: the model runner's, per group."""
    for groups in attention_groups:
        for group in groups:
            builder = group.get_metadata_builder(0)
            if getattr(builder, "supports_update_block_table", False):
                return (
                    f"the attention metadata builder {type(builder).__name__} reuses one KV cache group's metadata "
                    "for the others (supports_update_block_table), which would give every layer the same kept "
                    "length: prune on vLLM's CPU backend, or serve with threshold -inf (scoring only)"
                )
            if getattr(group, "kernel_block_size", None) is not None:
                return (
                    f"the attention kernel's block size ({group.kernel_block_size}) differs from the KV cache "
                    f"manager's ({group.kv_cache_spec.block_size}): start the engine with --block-size "
                    f"{group.kernel_block_size}"
                )
    return None
