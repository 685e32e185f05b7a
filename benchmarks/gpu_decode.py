"""Decoding at 32k and 128k tokens on one GPU: physical eviction vs the full cache vs kvpress's DMSPress masking.

Qwen3-8B's geometry at full depth (36 layers, hidden 4096, 32 query / 8 KV heads, head_dim 128, MLP 12288, vocab
151936), random bf16 weights, random token ids. Per context: the full cache once, then for each target ratio
kvpress's DMSPress (masks what it removes) and KVzapPress (evicts it), both with decoding-time pruning and the
128-token window: prefill, then `--decode-steps` greedy steps. Per method: prefill peak memory, KV bytes held at
the end, median ms per decoded token, fraction removed. Masking and eviction decode the full cache's greedy tokens
(teacher forcing), so their next-token logits can be compared: eviction must give masking's up to rounding.
On the eviction run's first layer, every segment-attention kernel that applies (on a GPU in bf16: the varlen flash
kernel) is compared with the float32 row loop, for one and for 64 new tokens.
Thresholds come from a seeded random linear surrogate calibrated on a separate random prompt: this measures memory
and speed, not answer quality. One model copy; methods run one after another on it.

    python benchmarks/gpu_decode.py --out benchmarks/results/gpu_decode_h200.json   # one H200: about 3 minutes
    python benchmarks/gpu_decode.py --tiny --contexts 600 --out /tmp/decode.json      # the same code, small, on CPU
    python benchmarks/gpu_decode.py --device cpu --layers 1 --contexts 8192 --out ... # full width, one layer, on CPU
    python benchmarks/gpu_decode.py --contexts 32768 --compile inductor --out ...      # eager and compiled steps

`--dtype-agreement` writes, instead, how far bf16 moves each method's next-token logits from its own fp32 run, at
the first context and ratio: the noise floor against which eviction-vs-masking differences in bf16 are read. One
fp32 model: the full cache, DMSPress and KVzapPress decode the same forced tokens in fp32, then again after the
model is cast to bf16. Random deep networks amplify rounding, so large bf16-vs-fp32 gaps for the full cache itself
mean bf16 comparisons between methods say nothing about exactness; fp32 ones do.

    python benchmarks/gpu_decode.py --dtype-agreement --contexts 8192 --ratios 0.75 --decode-steps 16 --out ...
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
from kvpress import DMSPress
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

from eviction import mask_index_bytes
from kvzap.atomic import atomic_write_json
from kvzap.pruning import KVzapPress, SurrogateScorerPress, held_kv_bytes
from kvzap.pruning.calibration import collect_scores, threshold_for
from kvzap.pruning.segments import Window, applicable_kernels, float32_rows, segment_attention
from kvzap.surrogate.model import Surrogate
from records import nonnegative_int, output_file, positive_int, print_table, unit_fraction

QWEN3_8B = dict(
    num_hidden_layers=36,
    hidden_size=4096,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=12288,
    vocab_size=151936,
    max_position_embeddings=1 << 17,
    rope_theta=1e6,
    tie_word_embeddings=False,
)
# The same shapes' ratios (GQA 4:1), small enough for a CPU test.
TINY = dict(
    num_hidden_layers=2,
    hidden_size=64,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=512,
    max_position_embeddings=1 << 14,
    rope_theta=1e6,
    tie_word_embeddings=False,
)


DECODE_COLUMNS = [
    "context_tokens",
    "target_ratio",
    "compression_ratio",
    "kv_bytes_vs_full",
    "decode_ms_vs_full",
    "decode_ms_vs_masking",
    "max_abs_logit_diff_vs_masking",
    "same_argmax_vs_masking",
]


def build_model(geometry: dict, device: str, dtype: torch.dtype):
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(Qwen3Config(**geometry, attn_implementation="sdpa"))
    return model.to(dtype).eval().requires_grad_(False)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@torch.no_grad()
def run_method(
    model, press, ids: torch.Tensor, steps: int, forced: list[int] | None = None, backend: str | None = None
) -> dict:
    """Prefill `ids` under `press` (None: the full cache), then decode `steps` tokens: greedy, or `forced` ones
    (the full cache's, so that every method's next-token logits answer the same prefix and can be compared).
    With a torch.compile `backend`, `steps` more greedy tokens follow through the compiled step."""
    device = str(model.device)
    cache, times, tokens, step_logits = DynamicCache(), [], [], []
    with press(model) if press is not None else contextlib.nullcontext():
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        held_before = torch.cuda.memory_allocated() if device.startswith("cuda") else 0
        sync(device)
        start = time.perf_counter()
        logits = model(ids, past_key_values=cache, logits_to_keep=1).logits
        sync(device)
        prefill_s = time.perf_counter() - start
        prefill_peak = torch.cuda.max_memory_allocated() - held_before if device.startswith("cuda") else None
        for step in range(steps):
            step_logits.append(logits[0, -1].float().cpu())
            token = logits[:, -1].argmax(-1, keepdim=True) if forced is None else torch.tensor([[forced[step]]])
            token = token.to(ids.device)
            tokens.append(token.item())
            sync(device)
            start = time.perf_counter()
            logits = model(token, past_key_values=cache, logits_to_keep=1).logits
            sync(device)
            times.append(time.perf_counter() - start)
        kv_bytes, ratio = held_kv_bytes(cache) + mask_index_bytes(model), press.compression_ratio if press else 0.0
        compiled = compiled_decode_ms(model, cache, logits, steps, backend) if backend else None
    group = model.config.num_attention_heads // model.config.num_key_value_heads
    kernels = (
        {f"{t}_tokens": kernel_agreement(cache.layers[0], t, group) for t in (1, 64)}
        if isinstance(press, KVzapPress)
        else None
    )
    return {
        "kv_bytes": kv_bytes,
        "prefill_s": prefill_s,
        "prefill_peak_bytes": prefill_peak,
        "decode_ms": 1000 * statistics.median(times[2:] or times),
        "compiled_decode_ms": compiled,
        "ratio": ratio,
        "tokens": tokens,
        "logits": torch.stack(step_logits),
        "segment_kernels": kernels,
    }


def compiled_decode_ms(model, cache, logits: torch.Tensor, steps: int, backend: str) -> float:
    """Median ms of `steps` greedy decoding steps through torch.compile, continuing `cache`; the first three
    (the compile, and the recompiles that sizes turning dynamic ask for) are not counted."""
    device = str(model.device)
    step = torch.compile(lambda token: model(token, past_key_values=cache, logits_to_keep=1).logits, backend=backend)
    times = []
    for _ in range(steps):
        token = logits[:, -1].argmax(-1, keepdim=True)
        sync(device)
        start = time.perf_counter()
        logits = step(token)
        sync(device)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[3:] or times)


def kernel_agreement(layer, tokens: int, group: int, kernels: list[str] | None = None) -> dict:
    """Each segment-attention kernel that applies here (or `kernels`) against the float32 row loop, on a packed
    layer of the run with random queries for its `tokens` newest window tokens (causal when more than one).
    On a GPU in bfloat16 this is the check of the varlen flash kernel's use; the output's magnitude is given
    as the scale for the differences."""
    packed = layer.packed()
    rows, dim = packed.rows.length.shape[0], packed.keys.shape[1]
    window_keys, window_values = (t.flatten(0, 1) for t in (layer.dense_keys, layer.dense_values))  # (R, W, D)
    gen = torch.Generator().manual_seed(tokens)
    q = (torch.randn(rows, group * tokens, dim, generator=gen) * dim**-0.5).to(packed.keys)  # pre-scaled
    mask = (
        None
        if tokens == 1
        else torch.ones(tokens, tokens, dtype=torch.bool, device=q.device).tril().repeat(group, 1)[None, None]
    )
    inputs = (q, packed, Window(window_keys, window_values, mask), layer.removed_shape[1], layer.score_budget())
    reference = float32_rows(*inputs)
    diffs = {
        kernel: (segment_attention(*inputs, kernel=kernel).float() - reference).abs().max().item()
        for kernel in kernels or applicable_kernels(q, mask)
    }
    return {"max_abs_diff_vs_float32_rows": diffs, "output_max_abs": reference.abs().max().item()}


def agreement(a: dict, b: dict) -> dict:
    """How far two methods' next-token logits are apart over the same forced tokens."""
    return {
        "max_abs_logit_diff": (a["logits"] - b["logits"]).abs().max().item(),
        "same_argmax": (a["logits"].argmax(-1) == b["logits"].argmax(-1)).float().mean().item(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=output_file, required=True)
    parser.add_argument("--contexts", type=positive_int, nargs="+", default=[32768, 131072])
    parser.add_argument("--ratios", type=unit_fraction, nargs="+", default=[0.5, 0.75])
    parser.add_argument("--decode-steps", type=positive_int, default=32)
    parser.add_argument("--window", type=nonnegative_int, default=128)
    parser.add_argument("--calibration-tokens", type=positive_int, default=4096)
    parser.add_argument("--tiny", action="store_true", help="a small model of the same shape ratios (CPU checks)")
    parser.add_argument("--layers", type=positive_int, default=None, help="decoder layers (default: the geometry's)")
    parser.add_argument(
        "--compile",
        metavar="BACKEND",
        default=None,
        choices=torch.compiler.list_backends(exclude_tags=()),
        help="also time the full cache's and eviction's decoding steps through torch.compile (e.g. inductor)",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--dtype", choices=["bfloat16", "float32"], default=None, help="default: bfloat16 on GPU, float32 on CPU"
    )
    parser.add_argument(
        "--dtype-agreement",
        action="store_true",
        help="instead: bf16 vs fp32 logits of each method at the first context and ratio (fp32 sdpa on a GPU holds "
        "heads x context^2 floats: 8k, not 32k)",
    )
    args = parser.parse_args()
    if args.dtype_agreement and (args.compile or args.dtype):
        parser.error("--dtype-agreement runs float32, then bfloat16, eagerly: drop --compile and --dtype")
    geometry = TINY if args.tiny else QWEN3_8B
    geometry = {**geometry, "num_hidden_layers": args.layers or geometry["num_hidden_layers"]}
    default = "float32" if args.dtype_agreement or not args.device.startswith("cuda") else "bfloat16"
    dtype = getattr(torch, args.dtype or default)  # --dtype-agreement: the reference, cast to bf16 after it
    model = build_model(geometry, args.device, dtype)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, geometry["vocab_size"], (1, max(args.contexts) + args.calibration_tokens), generator=gen)
    calibration_ids, ids = ids[:, : args.calibration_tokens], ids[:, args.calibration_tokens :].to(args.device)

    torch.manual_seed(0)
    surrogate = Surrogate(geometry["hidden_size"], geometry["num_key_value_heads"], geometry["num_hidden_layers"])
    scorer = SurrogateScorerPress(surrogate=surrogate)
    samples = collect_scores(model, [calibration_ids], scorer, args.window)
    thresholds = {r: threshold_for(samples, r) for r in args.ratios}
    print("calibrated thresholds:", {r: round(t, 4) for r, t in thresholds.items()}, flush=True)
    if args.dtype_agreement:
        ratio = args.ratios[0]
        record = dtype_agreement(model, scorer, ids[:, : args.contexts[0]], ratio, thresholds[ratio], args)
        atomic_write_json(args.out, [record])
        for key in ("eviction_vs_masking", "bfloat16_vs_float32"):
            for name, value in record[key].items():
                print(
                    f"{key} [{name}]: max |logit diff| {value['max_abs_logit_diff']:.3g}, same argmax "
                    f"{value['same_argmax']:.3f}"
                )
        return

    records = []
    for n in args.contexts:
        full = run_method(model, None, ids[:, :n], args.decode_steps, backend=args.compile)
        report("full", n, full)
        for ratio in args.ratios:
            tau = thresholds[ratio]
            masking = run_method(
                model,
                DMSPress(scorer, threshold=tau, sliding_window_size=args.window, decoding=True),
                ids[:, :n],
                args.decode_steps,
                full["tokens"],
            )
            report(f"masking {ratio}", n, masking)
            eviction = run_method(
                model,
                KVzapPress(scorer, threshold=tau, window=args.window, decoding=True),
                ids[:, :n],
                args.decode_steps,
                full["tokens"],
                backend=args.compile,
            )
            report(f"eviction {ratio}", n, eviction)
            print(f"[{n} tokens] segment attention kernels vs float32 rows: {eviction['segment_kernels']}", flush=True)
            runs = {"full": full, "masking": masking, "eviction": eviction}
            records.append(
                {
                    "context_tokens": n,
                    "target_ratio": ratio,
                    "threshold": tau,
                    "compression_ratio": eviction["ratio"],
                    "masking_compression_ratio": masking["ratio"],
                    "kv_bytes_vs_full": eviction["kv_bytes"] / full["kv_bytes"],
                    "decode_ms_vs_full": eviction["decode_ms"] / full["decode_ms"],
                    "decode_ms_vs_masking": eviction["decode_ms"] / masking["decode_ms"],
                    **{f"{key}_vs_masking": value for key, value in agreement(eviction, masking).items()},
                    **{
                        key: {name: run[key] for name, run in runs.items()}
                        for key in ("kv_bytes", "decode_ms", "prefill_s", "prefill_peak_bytes")
                    },
                    **compiled_fields(full, eviction, args.compile),
                    "segment_kernels": eviction["segment_kernels"],
                    "decode_steps": args.decode_steps,
                    "window": args.window,
                    "layers": geometry["num_hidden_layers"],
                    "dtype": str(dtype).removeprefix("torch."),
                    "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
                }
            )
    atomic_write_json(args.out, records)
    print_table(records, DECODE_COLUMNS)


def compiled_fields(full: dict, eviction: dict, backend: str | None) -> dict:
    if backend is None:
        return {}
    ms = {"full": full["compiled_decode_ms"], "eviction": eviction["compiled_decode_ms"]}
    return {
        "compile_backend": backend,
        "compiled_decode_ms": ms,
        "compiled_decode_ms_vs_full": ms["eviction"] / ms["full"],
    }


def dtype_agreement(model, scorer, ids: torch.Tensor, ratio: float, tau: float, args) -> dict:
    """The record of `--dtype-agreement` (module docstring); `model` is in float32 and is left in bf16."""
    presses = {
        "full": lambda: None,
        "masking": lambda: DMSPress(scorer, threshold=tau, sliding_window_size=args.window, decoding=True),
        "eviction": lambda: KVzapPress(scorer, threshold=tau, window=args.window, decoding=True),
    }
    fp32 = {"full": run_method(model, None, ids, args.decode_steps)}
    forced = fp32["full"]["tokens"]
    for name in ("masking", "eviction"):
        fp32[name] = run_method(model, presses[name](), ids, args.decode_steps, forced)
    model.to(torch.bfloat16)
    bf16 = {name: run_method(model, press(), ids, args.decode_steps, forced) for name, press in presses.items()}
    return {
        "context_tokens": ids.shape[1],
        "target_ratio": ratio,
        "compression_ratio": fp32["eviction"]["ratio"],
        "eviction_vs_masking": {
            "float32": agreement(fp32["eviction"], fp32["masking"]),
            "bfloat16": agreement(bf16["eviction"], bf16["masking"]),
        },
        "bfloat16_vs_float32": {name: agreement(bf16[name], fp32[name]) for name in presses},
        "logit_scale_float32": fp32["full"]["logits"].abs().max().item(),
        "decode_steps": args.decode_steps,
        "layers": model.config.num_hidden_layers,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
    }


def report(name: str, n: int, run: dict) -> None:
    peak = "" if run["prefill_peak_bytes"] is None else f", prefill peak {run['prefill_peak_bytes'] / 2**30:.2f} GiB"
    compiled = "" if run["compiled_decode_ms"] is None else f" ({run['compiled_decode_ms']:.2f} compiled)"
    print(
        f"[{n} tokens] {name}: removed {run['ratio']:.3f}, KV {run['kv_bytes'] / 2**30:.3f} GiB, "
        f"prefill {run['prefill_s']:.2f} s{peak}, decode {run['decode_ms']:.2f} ms/token{compiled}",
        flush=True,
    )


if __name__ == "__main__":
    main()
