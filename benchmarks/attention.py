"""A multi-token forward over a pruned cache vs over the full cache: extra peak memory and time.

Paper geometry (32 query heads, 8 KV heads, head_dim 128, hidden 4096), random weights, `--layers` decoder
layers. Each cell fills the cache with `--context` random keys/values, prunes all but the last `--window`
by a per-head threshold on random scores (rows keep different counts, as with KVzap), then times a forward
of `--queries` new tokens over it; the same forward over the unpruned dense cache (sdpa) is the baseline,
in the same run. Peak is the memory allocated during the forward above what was held before it (CUDA
allocator stats on GPU, the profiler's allocation events on CPU); time is the median of `--repeats`.

    python benchmarks/attention.py --out results/attention.json [--contexts 4096 16384] [--ratios 0.5 0.75]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from kvzap.io import atomic_write_json
from kvzap.pruning import PrunedLayer
from kvzap.pruning.attention import use_kvzap_attention

# Llama-3.1-8B / Qwen3-8B attention shapes; the MLP is kept small (it is the same in both runs).
GEOMETRY = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                intermediate_size=1024, vocab_size=256, max_position_embeddings=1 << 17, tie_word_embeddings=False)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build_model(layers: int, dtype: torch.dtype, device: str):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=layers, **GEOMETRY)).to(device, dtype)
    use_kvzap_attention(model)  # dense caches then run sdpa, pruned layers segment attention
    return model.eval().requires_grad_(False)


def filled_cache(model, context: int, gen: torch.Generator) -> DynamicCache:
    c, cache = model.config, DynamicCache()
    dtype, device = model.dtype, model.device
    for i in range(c.num_hidden_layers):
        kv = torch.randn(2, 1, c.num_key_value_heads, context, c.head_dim, generator=gen).to(device, dtype)
        cache.update(kv[0], kv[1], i)
    return cache


def pruned_copy(cache: DynamicCache, ratio: float, window: int, gen: torch.Generator) -> tuple[DynamicCache, float]:
    """Each layer as a PrunedLayer keeping the entries whose random score (with a per-head offset, so rows
    differ) reaches the `ratio` quantile; returns the cache and the fraction removed."""
    pruned, removed = DynamicCache(), []
    for layer in cache.layers:
        keys, values = layer.keys.clone(), layer.values.clone()
        _, heads, context, _ = keys.shape
        scores = torch.randn(1, heads, context - window, generator=gen) + torch.linspace(-1, 1, heads)[None, :, None]
        keep = scores >= scores.flatten().quantile(ratio)
        new = PrunedLayer(keys, values)
        new.judge(context - window, keep.to(keys.device))
        pruned.layers.append(new)
        removed.append(new.compression().mean().item())
    return pruned, statistics.mean(removed)


def forward(model, cache: DynamicCache, ids: torch.Tensor, context: int) -> None:
    model(ids, past_key_values=cache, logits_to_keep=1)
    cache.crop(context)  # back to the context for the next repeat


def peak_bytes(fn) -> int:
    """Most bytes allocated at once while fn runs, beyond what was allocated before it."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.NamedTemporaryFile(suffix=".json") as trace:
        prof.export_chrome_trace(trace.name)
        events = json.loads(Path(trace.name).read_text())["traceEvents"]
    held, peak = 0, 0
    for event in sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["args"]["Ev Idx"]):
        held += event["args"]["Bytes"]
        peak = max(peak, held)
    return peak


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


@torch.no_grad()
def measure(model, context: int, queries: int, ratio: float, window: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(context)
    full = filled_cache(model, context, gen)
    pruned, removed = pruned_copy(full, ratio, window, gen)
    ids = torch.randint(0, model.config.vocab_size, (1, queries), generator=gen).to(model.device)
    caches = {"full": full, "pruned": pruned}
    peak = {name: peak_bytes(lambda: forward(model, cache, ids, context)) / 2**20 for name, cache in caches.items()}
    ms = {name: median_ms(lambda: forward(model, cache, ids, context), repeats) for name, cache in caches.items()}
    return {"context_tokens": context, "query_tokens": queries, "target_ratio": ratio, "compression_ratio": removed,
            "peak_mb_vs_full": peak["pruned"] / peak["full"], "ms_vs_full": ms["pruned"] / ms["full"],
            "peak_mb": peak, "ms": ms, "window": window, "layers": model.config.num_hidden_layers,
            "dtype": str(model.dtype).removeprefix("torch."), "device": str(model.device)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--queries", type=int, default=512, help="new tokens in the timed forward")
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.75])
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bfloat16 on GPU, else float32")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = DTYPES[args.dtype or ("bfloat16" if device == "cuda" else "float32")]
    model = build_model(args.layers, dtype, device)

    records = []
    for context in args.contexts:
        for ratio in args.ratios:
            records.append(measure(model, context, args.queries, ratio, args.window, args.repeats))
            r = records[-1]
            cells = ", ".join(f"{k} {r['peak_mb'][k]:.1f} / {r['ms'][k]:.1f}" for k in ("full", "pruned"))
            print(f"[{context} + {args.queries} tokens, removed {r['compression_ratio']:.3f}] peak MiB / ms: {cells}",
                  flush=True)
    atomic_write_json(args.out, records)
    print_table(records)


def print_table(records: list[dict]) -> None:
    keys = ["context_tokens", "query_tokens", "compression_ratio", "peak_mb_vs_full", "ms_vs_full"]
    print(" | ".join(keys))
    for r in records:
        print(" | ".join(f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k]) for k in keys))


if __name__ == "__main__":
    main()
