"""Attention over a pruned cache vs the full cache: a multi-token forward, and a chunked prefill.

Paper geometry (32 query heads, 8 KV heads, head_dim 128, hidden 4096), random weights, `--layers` decoder
layers; or `--model demo`, the offline SmolLM2-135M. Peak is the memory allocated during the measured call
above what was held before it (CUDA allocator stats on GPU, the profiler's allocation events on CPU); time
is the median of `--repeats`; every ratio compares runs of the same process.

Query records (`--contexts`): the cache is filled with random keys/values and all but the last `--window`
pruned by a per-head threshold on random scores (rows keep different counts, as with KVzap); a forward of
`--queries` new tokens over it is compared with the same forward over the unpruned dense cache (sdpa), and
its logits with those of the masking reference (kvzap's MaskedLayer, the same entries dropped). `--compile`
also times both forwards through torch.compile (inductor), each compiled and warmed up before it is timed.
`--kernel` serves the pruned forwards with that segment kernel instead of the one the library picks (a
comparison of kernels, each against the dense forward of its own run).

Prefill records (`--prefill-contexts`): a prompt (random ids; the demo model reads offline text) is prefilled
under KVzapPress with a seeded random linear surrogate, τ calibrated to each `--ratios` on separate ids,
in one forward ("whole", the baseline: dense attention, pruned after it) and in `--chunk` chunks pruned
between them ("chunked"); "dense" is the plain full-cache prefill without a press.

    python benchmarks/attention.py --out results/attention.json [--contexts 4096 16384] [--ratios 0.5 0.75]
    python benchmarks/attention.py --out results/prefill.json --contexts --prefill-contexts 16384 --chunk 2048
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from eviction import DEFAULT_MODEL, offline_text
from kvzap.atomic import atomic_write_json
from kvzap.prepare.models import ensure_prepared, load
from kvzap.pruning import KVzapPress, MaskedLayer, PrunedLayer, SurrogateScorerPress, segments
from kvzap.pruning.attention import use_kvzap_attention
from kvzap.pruning.calibration import collect_scores, threshold_for
from kvzap.pruning.segments import KERNELS
from kvzap.surrogate.model import Surrogate
from records import cpu_flags, nonnegative_int, output_file, positive_int, print_table, unit_fraction

# Llama-3.1-8B / Qwen3-8B attention shapes; the MLP is kept small (it is the same in both runs).
GEOMETRY = dict(
    hidden_size=4096,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=1024,
    vocab_size=256,
    max_position_embeddings=1 << 17,
    tie_word_embeddings=False,
)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def build_model(layers: int, dtype: torch.dtype, device: str):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=layers, **GEOMETRY)).to(device, dtype)
    use_kvzap_attention(model)  # dense caches then run sdpa, pruned layers segment attention
    return model.eval().requires_grad_(False)


def demo_model(model_json: Path, dtype: torch.dtype, device: str):
    ensure_prepared(model_json, DEFAULT_MODEL)
    model, tokenizer = load(model_json, dtype=str(dtype).removeprefix("torch."), device_map=device)
    use_kvzap_attention(model)
    return model, tokenizer


def filled_cache(model, context: int, gen: torch.Generator) -> DynamicCache:
    c, cache = model.config, DynamicCache()
    dtype, device = model.dtype, model.device
    for i in range(c.num_hidden_layers):
        kv = torch.randn(2, 1, c.num_key_value_heads, context, c.head_dim, generator=gen).to(device, dtype)
        cache.update(kv[0], kv[1], i)
    return cache


def random_keeps(cache: DynamicCache, ratio: float, window: int, gen: torch.Generator) -> list[torch.Tensor]:
    """Per layer, (1, H, context - window) bool: the entries whose random score (with a per-head offset, so rows
    differ) reaches the `ratio` quantile."""
    keeps = []
    for layer in cache.layers:
        _, heads, context, _ = layer.keys.shape
        scores = torch.randn(1, heads, context - window, generator=gen) + torch.linspace(-1, 1, heads)[None, :, None]
        keeps.append((scores >= scores.flatten().quantile(ratio)).to(layer.keys.device))
    return keeps


def judged_copy(cache: DynamicCache, keeps: list[torch.Tensor], kind=PrunedLayer) -> tuple[DynamicCache, float]:
    """Each layer as a `kind` layer (PrunedLayer or MaskedLayer) that judged all but its window by `keeps`;
    returns the cache and the fraction removed."""
    judged, removed = DynamicCache(), []
    for layer, keep in zip(cache.layers, keeps):
        new = kind(layer.keys.clone(), layer.values.clone())
        new.judge(keep.shape[-1], keep)
        judged.layers.append(new)
        removed.append(new.compression().mean().item())
    return judged, statistics.mean(removed)


def serving_kernels(queries: int, dtype: torch.dtype, device) -> list[str]:
    """The segment-attention kernels that can serve a forward of `queries` new tokens on this device and dtype,
    the library's choice first (the forced one under `forced_kernel`), then the reference row loop."""
    probe = torch.empty(1, queries, 1, dtype=dtype, device=device)
    causal = torch.ones(queries, queries, dtype=torch.bool, device=device).tril()[None, None]
    return segments.applicable_kernels(probe, None if queries == 1 else causal) + ["rows"]


def segment_kernel(model, queries: int) -> str:
    """The segment-attention kernel that a forward of `queries` new tokens gets on this model's device and dtype."""
    return serving_kernels(queries, model.dtype, model.device)[0]


def forced_kernel(kernel: str | None):
    """Every segment-attention call picks `kernel` (None: the library's choice) while the block runs."""
    if kernel is None:
        return contextlib.nullcontext()
    return mock.patch.object(segments, "applicable_kernels", lambda q, mask: [kernel])


def forward(model, cache: DynamicCache, ids: torch.Tensor, context: int) -> torch.Tensor:
    logits = model(ids, past_key_values=cache, logits_to_keep=1).logits
    cache.crop(context)  # back to the context for the next repeat
    return logits


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


def median_ms(fns: dict, repeats: int) -> dict:
    """Median milliseconds of each fn, the fns taking turns in every repeat (so load from other processes
    hits them alike); callers have run each once already (the peak measurement), which warms them up."""
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times[name].append(1000 * (time.perf_counter() - start))
    return {name: statistics.median(t) for name, t in times.items()}


def compiled_ms(model, caches: dict, ids: torch.Tensor, context: int, repeats: int) -> dict:
    """Median ms of each cache's forward through torch.compile, after the compile and a warm-up call each."""
    step = torch.compile(forward)
    calls = {name: functools.partial(step, model, cache, ids, context) for name, cache in caches.items()}
    for call in calls.values():
        call(), call()  # compile, then the recompile a changed size may ask for
    return median_ms(calls, repeats)


@torch.no_grad()
def measure(model, context: int, queries: int, ratio: float, window: int, repeats: int, compile_too: bool) -> dict:
    gen = torch.Generator().manual_seed(context)
    full = filled_cache(model, context, gen)
    keeps = random_keeps(full, ratio, window, gen)
    pruned, removed = judged_copy(full, keeps)
    ids = torch.randint(0, model.config.vocab_size, (1, queries), generator=gen).to(model.device)
    caches = {"full": full, "pruned": pruned}
    masked = forward(model, judged_copy(full, keeps, MaskedLayer)[0], ids, context)
    logits_gap = (forward(model, pruned, ids, context) - masked).abs().max().item()
    peak = {name: peak_bytes(lambda: forward(model, cache, ids, context)) / 2**20 for name, cache in caches.items()}
    ms = median_ms(
        {name: functools.partial(forward, model, cache, ids, context) for name, cache in caches.items()}, repeats
    )
    compiled = compiled_ms(model, caches, ids, context, repeats) if compile_too else None
    return {
        "context_tokens": context,
        "query_tokens": queries,
        "target_ratio": ratio,
        "compression_ratio": removed,
        "peak_mb_vs_full": peak["pruned"] / peak["full"],
        "ms_vs_full": ms["pruned"] / ms["full"],
        "peak_mb": peak,
        "ms": ms,
        "compiled_ms_vs_full": compiled and compiled["pruned"] / compiled["full"],
        "compiled_ms": compiled,
        "logits_max_diff_vs_masking": logits_gap,
        "window": window,
        "layers": model.config.num_hidden_layers,
        "segment_kernel": segment_kernel(model, queries),
        "dtype": str(model.dtype).removeprefix("torch."),
        "device": str(model.device),
        "cpu_flags": cpu_flags(),
    }


def prefill(model, ids: torch.Tensor, press: KVzapPress | None):
    """A prefill as kvpress's pipeline runs it (the decoder stack only), under `press` if given."""

    def run():
        with press(model) if press is not None else contextlib.nullcontext():
            model.model(input_ids=ids, past_key_values=DynamicCache())

    return run


@torch.no_grad()
def measure_prefill(model, ids: torch.Tensor, chunk: int, scorer, threshold: float, window: int, repeats: int) -> dict:
    presses = {
        "dense": None,
        "whole": KVzapPress(scorer, threshold=threshold, window=window),
        "chunked": KVzapPress(scorer, threshold=threshold, window=window, prefill_chunk=chunk),
    }
    peak = {name: peak_bytes(prefill(model, ids, press)) / 2**20 for name, press in presses.items()}
    ms = median_ms({name: prefill(model, ids, press) for name, press in presses.items()}, repeats)
    return {
        "context_tokens": ids.shape[1],
        "chunk_tokens": chunk,
        "threshold": threshold,
        "compression_ratio": presses["chunked"].compression_ratio,
        "whole_compression_ratio": presses["whole"].compression_ratio,
        "prefill_peak_mb_vs_full": peak["chunked"] / peak["whole"],
        "prefill_ms_vs_full": ms["chunked"] / ms["whole"],
        "prefill_peak_mb_vs_dense": peak["chunked"] / peak["dense"],
        "prefill_ms_vs_dense": ms["chunked"] / ms["dense"],
        "peak_mb": peak,
        "ms": ms,
        "window": window,
        "layers": model.config.num_hidden_layers,
        "segment_kernel": segment_kernel(model, chunk),
        "dtype": str(model.dtype).removeprefix("torch."),
        "device": str(model.device),
    }


def prefill_records(model, prompt: torch.Tensor, calibration: torch.Tensor, args) -> list[dict]:
    """Prefill cells for every (context, ratio), τ calibrated once per ratio on `calibration` ids."""
    torch.manual_seed(0)
    c = model.config
    scorer = SurrogateScorerPress(surrogate=Surrogate(c.hidden_size, c.num_key_value_heads, c.num_hidden_layers))
    samples = collect_scores(model, [calibration], scorer, args.window)
    records = []
    for ratio in args.ratios:
        threshold = threshold_for(samples, ratio)
        for context in args.prefill_contexts:
            r = measure_prefill(model, prompt[:, :context], args.chunk, scorer, threshold, args.window, args.repeats)
            records.append({**r, "target_ratio": ratio, "model": args.model, "threads": args.threads})
            cells = ", ".join(f"{k} {r['peak_mb'][k]:.1f} / {r['ms'][k]:.0f}" for k in ("dense", "whole", "chunked"))
            print(
                f"[prefill {context} in {args.chunk}-token chunks, removed {r['compression_ratio']:.3f}] "
                f"peak MiB / ms: {cells}",
                flush=True,
            )
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=output_file, required=True)
    parser.add_argument(
        "--contexts", type=positive_int, nargs="*", default=[4096, 16384], help="query records (none: skip)"
    )
    parser.add_argument("--prefill-contexts", type=positive_int, nargs="*", default=[], help="prefill records")
    parser.add_argument("--chunk", type=positive_int, default=2048, help="prefill chunk (tokens)")
    parser.add_argument("--calibration-tokens", type=positive_int, default=2048, help="ids that calibrate τ (prefill)")
    parser.add_argument(
        "--model",
        choices=["paper", "demo"],
        default="paper",
        help=f"paper geometry with random weights, or {DEFAULT_MODEL} (offline)",
    )
    parser.add_argument(
        "--model-json", type=Path, default=Path(".cache/smollm2/model.json"), help="the demo model, prepared if missing"
    )
    parser.add_argument("--queries", type=positive_int, default=512, help="new tokens in the timed forward")
    parser.add_argument("--ratios", type=unit_fraction, nargs="+", default=[0.5, 0.75])
    parser.add_argument("--window", type=nonnegative_int, default=128)
    parser.add_argument("--layers", type=positive_int, default=1)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bfloat16 on GPU, else float32")
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--compile", action="store_true", help="also time the query forwards under torch.compile")
    parser.add_argument("--kernel", choices=KERNELS, default=None, help="serve the query records with this kernel")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = DTYPES[args.dtype or ("bfloat16" if device == "cuda" else "float32")]
    if args.kernel:
        serving = serving_kernels(args.queries, dtype, device)
        if args.kernel not in serving:
            parser.error(
                f"--kernel {args.kernel} cannot serve {args.queries}-token forwards in {dtype} on {device}: "
                f"pick one of {', '.join(serving)}"
            )
    if args.model == "demo":
        model, tokenizer = demo_model(args.model_json, dtype, device)
        ids = tokenizer(offline_text(), return_tensors="pt").input_ids.to(device)
    else:
        model = build_model(args.layers, dtype, device)
        length = args.calibration_tokens + max(args.prefill_contexts, default=0)
        ids = torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(1))
    calibration, prompt = ids[:, : args.calibration_tokens].to(device), ids[:, args.calibration_tokens :].to(device)
    if prompt.shape[1] < max(args.prefill_contexts, default=0):
        raise SystemExit(f"the prompt has {prompt.shape[1]} tokens, fewer than {max(args.prefill_contexts)}")

    records = []
    for context in args.contexts:
        for ratio in args.ratios:
            with forced_kernel(args.kernel):
                records.append(measure(model, context, args.queries, ratio, args.window, args.repeats, args.compile))
            r = records[-1]
            cells = ", ".join(f"{k} {r['peak_mb'][k]:.1f} / {r['ms'][k]:.1f}" for k in ("full", "pruned"))
            print(
                f"[{context} + {args.queries} tokens, removed {r['compression_ratio']:.3f}] peak MiB / ms: {cells}; "
                f"logits vs masking {r['logits_max_diff_vs_masking']:.1e}",
                flush=True,
            )
    if args.prefill_contexts:
        records += prefill_records(model, prompt, calibration, args)
    atomic_write_json(args.out, records)
    print_table([r for r in records if "query_tokens" in r], QUERY_COLUMNS)
    print_table([r for r in records if "chunk_tokens" in r], PREFILL_COLUMNS)


QUERY_COLUMNS = [
    "context_tokens",
    "query_tokens",
    "compression_ratio",
    "peak_mb_vs_full",
    "ms_vs_full",
    "compiled_ms_vs_full",
    "logits_max_diff_vs_masking",
]
PREFILL_COLUMNS = [
    "context_tokens",
    "chunk_tokens",
    "compression_ratio",
    "prefill_peak_mb_vs_full",
    "prefill_ms_vs_full",
    "prefill_peak_mb_vs_dense",
    "prefill_ms_vs_dense",
]


if __name__ == "__main__":
    main()
