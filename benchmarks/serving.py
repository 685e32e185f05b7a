"""Serving throughput at a fixed KV-memory budget: the largest batch that fits, and its generated tokens per second.

Full cache (a plain DynamicCache, sdpa attention) against KVzap (KVzapPress, decoding=True, evict=True, 128-token
window) at r ~ 0.5 and r ~ 0.75. The budget is what the full cache holds for `--budget-rows` rows (prompt plus new
tokens). Each method's KV bytes per row are measured: the most the cache holds between forwards (the layers'
`nbytes`, window buffers and spare slots included; for the full cache, its keys and values), per row of the batch.
KVzap's batch size is first estimated from one probe row of its own random prompt: max batch = floor(budget /
bytes per row); that many rows (a different random prompt each, all of the same length, so no padding) are
prefilled in one forward, then greedy-decoded for `--new-tokens` steps, timed apart. Prompts prune differently, so
if those rows held more than the budget, the batch is cut to floor(budget / their mean bytes per row) and run
again, once (`batch_before_fitting`; `within_budget` says whether the recorded batch held at most the budget).
tokens/s = batch * new tokens / decode seconds (the token picked from the prefill's logits is not counted).
Thresholds come from a seeded random surrogate calibrated on separate random prompts (`--calibration-prompts`): this
measures memory and speed, not answer quality; the measured compression ratio is recorded.

Models: the demo model's geometry (SmolLM2-135M: 30 layers, hidden 576, 9 query / 3 KV heads, head_dim 64, MLP
1536, vocab 49152, tied embeddings) with random float32 weights, which is enough for a throughput measurement;
`--model results/<name>/model.json` loads real weights instead. `--geometry qwen3-8b` takes Qwen3-8B's geometry
(`--layers` cuts its depth on CPU); with `--device cuda` it runs in bfloat16 with 4096-token prompts and 256 new
tokens by default.

Targets (the demo model on CPU, at equal KV memory): KVzap at r ~ 0.75 holds >= 3.5x the full cache's sequences and
generates >= 2x its tokens per second; at r ~ 0.5, >= 1.8x and >= 1.4x. The script prints whether each is met.
The default budget is 5 full rows: max batch is a whole number of rows, so at 4 rows a ratio of 1.8 would need
KVzap at r = 0.5 to hold at most 1/2 of the full cache's bytes per row, its window and spare slots included.

    python benchmarks/serving.py --threads 1 --out benchmarks/cpu/serving.json   # demo geometry, CPU (see below)
    python benchmarks/serving.py --geometry qwen3-8b --device cuda --out benchmarks/results/serving_h200.json
    python benchmarks/serving.py --geometry qwen3-8b --layers 4 --prompt-tokens 512 --new-tokens 8 --out /tmp/s.json

On this project's 2-core CPU machine (shared with another process), the first command (1024-token prompts, 64
new tokens, 5 budget rows) took 14-18 min (850 s; 1,055 s beside a rehearsal), most of it prefill (a batch cut
to fit the budget is prefilled twice); see benchmarks/cpu/serving.json. `--threads 1`: with another process on
the cores, every two-thread op waits for its second thread, which hits the many small ops of decoding hardest.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from gpu_decode import QWEN3_8B, build_model, sync
from kvzap.atomic import atomic_write_json
from kvzap.pruning import KVzapPress, SurrogateScorerPress, held_kv_bytes
from kvzap.pruning.calibration import collect_scores, threshold_for
from kvzap.surrogate.model import Surrogate
from records import nonnegative_int, output_file, positive_int, print_table, unit_fraction

SMOLLM2_135M = dict(
    num_hidden_layers=30,
    hidden_size=576,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    intermediate_size=1536,
    vocab_size=49152,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)
# target ratio -> (max batch vs full, tokens/s vs full) that KVzap must reach on the demo model on CPU
TARGETS = {0.75: (3.5, 2.0), 0.5: (1.8, 1.4)}
COLUMNS = [
    "method",
    "compression_ratio",
    "batch",
    "max_batch_vs_full",
    "bytes_per_row",
    "tokens_per_s",
    "tokens_per_s_vs_full",
    "prefill_s",
    "decode_s",
]


def demo_model(model_json: str | None):
    """The demo model: real weights from a prepared model.json, else its geometry with seeded random weights."""
    if model_json is not None:
        from kvzap.prepare.models import load

        model, _ = load(model_json)
        return model.eval().requires_grad_(False), "prepared weights: " + model_json
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M, attn_implementation="sdpa"))
    return model.eval().requires_grad_(False), "random weights (SmolLM2-135M geometry)"


@torch.no_grad()
def serve(model, press, ids: torch.Tensor, new_tokens: int) -> dict:
    """Prefill the (B, T) prompts in one forward, then greedy-decode `new_tokens` steps, timed apart; the cache's
    bytes are read after every forward (the most it holds between forwards)."""
    device = str(model.device)
    cache = DynamicCache()
    with press(model) if press is not None else contextlib.nullcontext():
        sync(device)
        start = time.perf_counter()
        logits = model(ids, past_key_values=cache, logits_to_keep=1).logits
        sync(device)
        prefill_s = time.perf_counter() - start
        held = held_kv_bytes(cache)
        token = logits[:, -1].argmax(-1, keepdim=True)
        start = time.perf_counter()
        for _ in range(new_tokens):
            token = model(token, past_key_values=cache, logits_to_keep=1).logits[:, -1].argmax(-1, keepdim=True)
            held = max(held, held_kv_bytes(cache))  # a host-side sum of the layers' sizes: no device sync
        sync(device)
        decode_s = time.perf_counter() - start
    return {
        "kv_bytes": held,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "ratio": press.compression_ratio if press is not None else 0.0,
    }


def prompts(vocab: int, rows: int, length: int, seed: int) -> torch.Tensor:
    """`rows` different random prompts of `length` tokens (seeded: every method sees the same ones)."""
    return torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(seed))


def record(name: str, ratio: float | None, run: dict, batch: int, bytes_per_row: float, full: dict | None, args):
    """One method's record; full=None for the full cache itself (its ratios are 1)."""
    tokens_per_s = batch * args.new_tokens / run["decode_s"]
    base = full or {"batch": batch, "tokens_per_s": tokens_per_s, "bytes_per_row": bytes_per_row}
    return {
        "method": name,
        "target_ratio": ratio,
        "compression_ratio": run["ratio"],
        "batch": batch,
        "max_batch_vs_full": batch / base["batch"],
        "bytes_per_row": bytes_per_row,
        "bytes_per_row_vs_full": bytes_per_row / base["bytes_per_row"],
        "batch_kv_bytes": run["kv_bytes"],
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_vs_full": tokens_per_s / base["tokens_per_s"],
        "prefill_s": run["prefill_s"],
        "decode_s": run["decode_s"],
        "decode_ms_per_step": 1000 * run["decode_s"] / args.new_tokens,
    }


def check_targets(records: list[dict]) -> list[str]:
    """Lines saying whether each KVzap record meets its ratio's targets (marked on the records too)."""
    lines = []
    for rec in records:
        goal = TARGETS.get(rec["target_ratio"])
        if goal is None:
            continue
        rec["targets"] = {"max_batch_vs_full": goal[0], "tokens_per_s_vs_full": goal[1]}
        rec["meets_targets"] = rec["max_batch_vs_full"] >= goal[0] and rec["tokens_per_s_vs_full"] >= goal[1]
        lines.append(
            f"r ~ {rec['target_ratio']}: max batch {rec['max_batch_vs_full']:.2f}x (target {goal[0]}x) "
            f"{'met' if rec['max_batch_vs_full'] >= goal[0] else 'NOT met'}, tokens/s "
            f"{rec['tokens_per_s_vs_full']:.2f}x (target {goal[1]}x) "
            f"{'met' if rec['tokens_per_s_vs_full'] >= goal[1] else 'NOT met'}"
        )
    return lines


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=output_file, required=True)
    parser.add_argument("--geometry", choices=["demo", "qwen3-8b"], default="demo")
    parser.add_argument("--model", default=None, help="a prepared model.json (demo geometry only): real weights")
    parser.add_argument("--layers", type=positive_int, default=None, help="cut qwen3-8b's depth (CPU runs)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompt-tokens", type=positive_int, default=None, help="default: 4096 on GPU, 1024 on CPU")
    parser.add_argument("--new-tokens", type=positive_int, default=None, help="default: 256 on GPU, 64 on CPU")
    parser.add_argument("--budget-rows", type=positive_int, default=5, help="budget = the full cache of N rows")
    parser.add_argument("--ratios", type=unit_fraction, nargs="+", default=[0.5, 0.75])
    parser.add_argument("--window", type=nonnegative_int, default=128)
    parser.add_argument(
        "--threads", type=positive_int, default=None, help="torch intra-op threads (default: torch's own choice)"
    )
    parser.add_argument("--calibration-prompts", type=positive_int, default=4, help="random calibration prompts")
    parser.add_argument("--calibration-tokens", type=positive_int, default=None, help="default: --prompt-tokens")
    args = parser.parse_args()
    if args.model is not None and args.geometry != "demo":
        parser.error("--model loads the demo model's weights; it does not combine with --geometry qwen3-8b")
    gpu = args.device.startswith("cuda")
    args.prompt_tokens = args.prompt_tokens or (4096 if gpu else 1024)
    args.new_tokens = args.new_tokens or (256 if gpu else 64)
    args.calibration_tokens = args.calibration_tokens or args.prompt_tokens
    return args


def main() -> None:
    args = parse_args()
    started = time.perf_counter()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    gpu = args.device.startswith("cuda")
    if args.geometry == "demo":
        model, weights = demo_model(args.model)
        model = model.to(args.device)
    else:
        geometry = {**QWEN3_8B, **({"num_hidden_layers": args.layers} if args.layers else {})}
        model, weights = build_model(geometry, args.device, torch.bfloat16 if gpu else torch.float32), "random weights"
    config = model.config
    geometry = {
        key: getattr(config, key)
        for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")
    }
    vocab, length = config.vocab_size, args.prompt_tokens

    torch.manual_seed(0)
    surrogate = Surrogate(config.hidden_size, config.num_key_value_heads, config.num_hidden_layers)
    scorer = SurrogateScorerPress(surrogate=surrogate)
    calibration = [prompts(vocab, 1, args.calibration_tokens, seed=100 + i) for i in range(args.calibration_prompts)]
    samples = collect_scores(model, calibration, scorer, args.window)
    thresholds = {r: threshold_for(samples, r) for r in args.ratios}
    print("calibrated thresholds:", {r: round(t, 4) for r, t in thresholds.items()}, flush=True)

    full_run = serve(model, None, prompts(vocab, args.budget_rows, length, seed=2).to(args.device), args.new_tokens)
    budget = full_run["kv_bytes"]
    full = record("full", None, full_run, args.budget_rows, budget / args.budget_rows, None, args)
    report(full)
    records = [full]
    for ratio in args.ratios:
        press = KVzapPress(scorer, threshold=thresholds[ratio], window=args.window, decoding=True, evict=True)
        probe = serve(model, press, prompts(vocab, 1, length, seed=3).to(args.device), args.new_tokens)
        batch, first_batch = math.floor(budget / probe["kv_bytes"]), None
        run = serve(model, press, prompts(vocab, batch, length, seed=2).to(args.device), args.new_tokens)
        if run["kv_bytes"] > budget:  # the probe row pruned more than these rows: fit the budget with their mean
            first_batch, batch = batch, math.floor(budget * batch / run["kv_bytes"])
            print(f"kvzap r~{ratio}: {first_batch} rows held {run['kv_bytes'] / budget:.3f}x the budget", flush=True)
            run = serve(model, press, prompts(vocab, batch, length, seed=2).to(args.device), args.new_tokens)
        rec = record(f"kvzap r~{ratio}", ratio, run, batch, run["kv_bytes"] / batch, full, args)
        rec.update(probe_bytes_per_row=probe["kv_bytes"], batch_before_fitting=first_batch)
        rec.update(
            threshold=thresholds[ratio], probe_compression_ratio=probe["ratio"], within_budget=run["kv_bytes"] <= budget
        )
        report(rec)
        records.append(rec)
    for rec in records:
        rec.update(
            budget_bytes=budget,
            budget_rows=args.budget_rows,
            prompt_tokens=length,
            new_tokens=args.new_tokens,
            window=args.window,
            device=torch.cuda.get_device_name() if gpu else f"cpu ({torch.get_num_threads()} threads)",
            dtype=str(model.dtype).removeprefix("torch."),
            geometry=args.geometry,
            geometry_config=geometry,
            weights=weights,
        )
    verdicts = check_targets(records) if args.geometry == "demo" else []
    wall_s = time.perf_counter() - started
    for rec in records:
        rec["script_wall_s"] = wall_s
    atomic_write_json(args.out, records)
    print_table(records, COLUMNS)
    print("\n".join(verdicts))
    print(f"wall time {wall_s:.0f} s; written to {args.out}")


def report(rec: dict) -> None:
    print(
        f"{rec['method']}: batch {rec['batch']}, removed {rec['compression_ratio']:.3f}, "
        f"{rec['bytes_per_row'] / 2**20:.1f} MiB/row, prefill {rec['prefill_s']:.1f} s, "
        f"decode {rec['decode_ms_per_step']:.0f} ms/step, {rec['tokens_per_s']:.1f} tokens/s",
        flush=True,
    )


if __name__ == "__main__":
    main()
