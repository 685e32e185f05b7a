"""Serving as engineers measure it: a workload of the demo's RULER-style requests, prompted as the demo prompts them
(kvpress's pipeline: chat template, question, answer prefix), all submitted at once (a saturated queue), greedy, served
by dense vLLM and by vLLM with the KVzap plugin at the same `kv_cache_memory_bytes`. Workloads:
  decode-heavy   ~1k-token prompts, 256 new tokens each (the AIME-like case: decoding is judged and pruned)
  prefill-heavy  ~4k-token prompts, 16 new tokens each
Per engine: mean and peak running sequences, preemptions, output tokens/s, time to first token and time per output
token (p50, p95; one scheduler step's resolution), the realised compression (the blocks the dense cache would hold for
the running sequences / the blocks held), the accuracy of the answers (the demo's scorer, cut at the end token) and,
for the first `--check-tokens` requests, whether the greedy tokens equal the transformers path's (dense, and under the
plugin's fill policy: KVzapLayerFillPress, decoding=True; with `--layout per_head`, KVzap's own per-head verdicts:
KVzapPress, decoding=True), with where and by what logit margin any first differs. `--layout per_layer per_head` serves
both layouts against one dense engine. Each engine runs in .venv-vllm (`make setup-vllm`).

    cd benchmarks && python vllm_serving.py --workload decode-heavy --model-json <demo>/model.json \
        --surrogate <demo>/surrogates/linear --threshold -2.6 --out cpu/vllm_serving_decode.json
"""

from __future__ import annotations

import argparse
import json
import platform
from contextlib import nullcontext
from pathlib import Path

import torch
from transformers import DynamicCache

import ruler_rows
from kvzap.atomic import atomic_write_json
from kvzap.pruning import KVzapLayerFillPress, KVzapPress
from kvzap.surrogate.model import resolve_folder
from records import cpu_flags, output_file, positive_int, print_table
from vllm_runs import add_engine_folder_argument, answers, demo_prompts, engine_folder, run_engine

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["engine", "mean_running", "peak_running", "preemptions", "output_tokens_per_s", "tpot_p95_s", "score"]
COLUMNS += ["alone_tpot_s", "alone_step_p95_s", "realised_compression"]


def greedy(model, prompt: list[int], new_tokens: int, press, steps: list[int] | None = None) -> tuple[list[int], tuple]:
    """Transformers' greedy tokens (under the press, if any) and each step's logits, the request fed as the engine
    scheduled it: `steps` its tokens per forward (default: the prompt in one, then one token each). Under a press
    with decoding=True every forward is judged, as the plugin with judge_chunks judges each prefill chunk. Every
    prompt token is attended, as vLLM attends it, and nothing stops early (the end token is one more token, as under
    vLLM's ignore_eos)."""
    steps = steps or [len(prompt)] + [1] * (new_tokens - 1)
    cache, tokens, logits, begin = DynamicCache(config=model.config), [], [], 0
    with torch.no_grad(), press(model) if press is not None else nullcontext():
        for count in steps:
            if begin >= len(prompt) and count != 1:
                raise ValueError(f"a decoding step of {count} tokens: the engine scheduled more than one")
            ids = prompt[begin : begin + count] if begin < len(prompt) else tokens[-1:]
            out = model(torch.tensor([ids]), past_key_values=cache, use_cache=True).logits[:, -1]
            begin += count
            if begin >= len(prompt):
                logits.append(out)
                tokens.append(int(out[0].argmax()))
    return tokens, tuple(logits)


def engine_steps(run: dict, prompt: int) -> list[int] | None:
    """A request's tokens per scheduler step in an engine's record, or None if it was preempted (recomputed from
    scratch: its steps no longer follow one cache)."""
    steps = next((v for k, v in run["scheduled"].items() if prompt_index(k) == prompt), None)
    fed = len(run["inputs"]["prompts"][prompt]) + len(run["tokens"][prompt]) - 1  # the last token is never fed
    return steps if steps is not None and sum(steps) == fed else None


def divergence(prompt: int, tokens: list[int], reference: list[int], logits: tuple) -> dict | None:
    """Where an engine's greedy tokens first leave transformers', and by how much transformers' own choice led
    there: a margin near zero is a near-tie that float rounding may flip, a large one a different computation."""
    step = next((i for i, (a, b) in enumerate(zip(tokens, reference, strict=True)) if a != b), None)
    if step is None:
        return None
    margin = logits[step][0, reference[step]] - logits[step][0, tokens[step]]
    return {"prompt": prompt, "step": step, "logit_margin": margin.item()}


# the plugin's layouts: engine record file, record name, the transformers press its tokens are held to
LAYOUTS = {
    "per_layer": ("kvzap", "vLLM + KVzap", KVzapLayerFillPress),
    "per_head": ("kvzap-per-head", "vLLM + KVzap (per head)", KVzapPress),
}

WORKLOADS = {  # name -> (RULER context length, requests, new tokens)
    "decode-heavy": ("1024", 64, 256),
    "prefill-heavy": ("4096", 64, 16),
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def prompt_index(request_id: str) -> int:
    """The prompt a scheduler request id belongs to: LLM.generate numbers its requests in prompt order from 0, and
    vLLM 0.32's engine core appends a random suffix ("7-a6ba2430")."""
    return int(request_id.split("-", 1)[0])


def latencies(record: dict) -> dict:
    """Time to first token and time per output token of each request, from the engine's per-step record (the time a
    step was scheduled and each running request's output count then): p50 and p95 over the requests."""
    steps, total = record["steps"], record["seconds"]
    first, last = {}, {}
    for i, step in enumerate(steps):
        after = steps[i + 1]["seconds"] if i + 1 < len(steps) else total
        for request, count in step["outputs"].items():
            if count >= 1:
                first.setdefault(request, step["seconds"])
            last[request] = after
    lengths = dict(enumerate(map(len, record["tokens"])))
    ttft = list(first.values())
    tpot = [(last[r] - first[r]) / (lengths[prompt_index(r)] - 1) for r in first if lengths[prompt_index(r)] > 1]
    return {
        "ttft_p50_s": percentile(ttft, 0.5),
        "ttft_p95_s": percentile(ttft, 0.95),
        "tpot_p50_s": percentile(tpot, 0.5),
        "tpot_p95_s": percentile(tpot, 0.95),
    }


def step_gap_p95(record: dict) -> float:
    """The 95th percentile of the time between successive scheduler steps: with one request, its inter-token time,
    whose tail a mean per request (TPOT) would hide."""
    times = [s["seconds"] for s in record["steps"]] + [record["seconds"]]
    return percentile([b - a for a, b in zip(times, times[1:])], 0.95)


def summary(name: str, record: dict) -> dict:
    steps = [s for s in record["steps"] if s["running"]]
    held = sum(s["held_layer_blocks"] for s in steps)
    return {
        "engine": name,
        "peak_running": max(s["running"] for s in steps),
        "mean_running": sum(s["running"] for s in steps) / len(steps),
        "preemptions": sum(s["preempted"] for s in steps),
        "output_tokens_per_s": sum(map(len, record["tokens"])) / record["seconds"],
        "realised_compression": sum(s["dense_layer_blocks"] for s in steps) / held,
        **latencies(record),
        "seconds": record["seconds"],
        "blocks": record["blocks"],
        "blocks_leaked": record.get("blocks_leaked"),  # None in records written before it was counted
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ruler_rows.add_arguments(parser, "1024", ["niah_single_2"], 64)
    parser.add_argument("--workload", choices=list(WORKLOADS), required=True, help="sets --subset, --n-samples")
    parser.add_argument("--surrogate", type=Path, required=True)
    parser.add_argument(
        "--threshold",
        type=float,
        nargs="+",
        required=True,
        help="the headline (benchmarks/vllm_accuracy.py): one for every --layout, or one per layout, in its order",
    )
    parser.add_argument("--kv-memory-mib", type=positive_int, default=200, help="kv_cache_memory_bytes, both engines")
    parser.add_argument("--block-size", type=positive_int, default=32)
    parser.add_argument("--check-tokens", type=positive_int, default=8, help="requests compared with transformers")
    parser.add_argument(
        "--max-num-batched-tokens", type=positive_int, default=None, help="vLLM's tokens per step, both engines"
    )
    parser.add_argument("--judge-chunks", action="store_true", help="the plugin judges each prefill chunk")
    parser.add_argument(
        "--admit-by-first-chunk",
        action="store_true",
        help="both engines admit a request when its first chunk fits (vLLM's scheduler_reserve_full_isl off), not "
        "only when its whole dense prompt does",
    )
    parser.add_argument(
        "--layout",
        nargs="+",
        choices=list(LAYOUTS),
        default=["per_layer"],
        help="the plugin's KV cache layout(s), each one engine against the same dense one: per_layer (the fill "
        "policy, checked against KVzapLayerFillPress) or per_head (KVzap's own verdicts, checked against KVzapPress)",
    )
    parser.add_argument("--out", type=output_file, required=True)
    add_engine_folder_argument(parser)
    args = parser.parse_args()
    args.subset, args.n_samples, new_tokens = WORKLOADS[args.workload]
    layouts = list(dict.fromkeys(args.layout))
    if len(args.threshold) not in (1, len(layouts)):
        parser.error(f"--threshold: give one, or one per --layout ({len(layouts)}), not {len(args.threshold)}")
    taus = dict(zip(layouts, args.threshold * len(layouts) if len(args.threshold) == 1 else args.threshold))
    try:  # a missing checkpoint is refused here, not after the dense engine has run
        checkpoint = resolve_folder(args.surrogate)
    except FileNotFoundError as err:
        parser.error(str(err))
    model, tokenizer, bench, rows = ruler_rows.model_and_rows(args)
    prompts = demo_prompts(model, tokenizer, rows)
    model_json = json.loads(Path(args.model_json).read_text())
    engine = {"dtype": "float32", "enforce_eager": True, "enable_prefix_caching": False, "max_num_seqs": 256}
    engine |= {"kv_cache_memory_bytes": args.kv_memory_mib * 2**20, "block_size": args.block_size}
    engine |= {"max_model_len": max(map(len, prompts)) + new_tokens}
    engine |= {"hf_overrides": {"kvzap_model_id": model_json["model_id"]}}  # the surrogate's base model
    if args.max_num_batched_tokens:  # a prefill chunk is at most this long
        engine |= {"max_num_batched_tokens": args.max_num_batched_tokens, "enable_chunked_prefill": True}
    if args.admit_by_first_chunk:
        engine |= {"scheduler_reserve_full_isl": False}
    kvzap = {"surrogate": str(checkpoint.resolve() if checkpoint else args.surrogate)}
    kvzap |= {"judge_chunks": True} if args.judge_chunks else {}
    # the per-layer engine's settings stay as they were before layouts (its cached records still match)
    settings = {
        layout: kvzap | {"threshold": taus[layout]} | ({"layout": layout} if layout != "per_layer" else {})
        for layout in layouts
    }
    plugins = {layout: engine | {"additional_config": {"kvzap": settings[layout]}} for layout in layouts}
    with engine_folder(args.engine_folder) as folder:
        runs = {"dense": run_engine(folder, "dense", model_json["path"], prompts, engine, new_tokens)}
        for layout, plugin in plugins.items():
            runs[layout] = run_engine(folder, LAYOUTS[layout][0], model_json["path"], prompts, plugin, new_tokens)
        # one request alone: the time per output token the plugin's judging adds when nothing queues
        alone = {
            key: run_engine(folder, f"{file}-alone", model_json["path"], prompts[:1], config, new_tokens)
            for key, file, config in [("dense", "dense", engine)]
            + [(layout, LAYOUTS[layout][0], plugin) for layout, plugin in plugins.items()]
        }
    names = {"dense": "dense vLLM"} | {layout: LAYOUTS[layout][1] for layout in layouts}
    records = [summary(names[key], runs[key]) for key in names]
    for record, key in zip(records, names):
        one = alone[key]
        record["alone_tpot_s"], record["alone_step_p95_s"] = latencies(one)["tpot_p50_s"], step_gap_p95(one)
        tokens = runs[key]["tokens"]
        result = bench.score(rows.drop(columns=["context"]).assign(prediction=answers(model, tokenizer, tokens)))
        record["score"], record["score_ci"] = result["average"], result["average_ci"]
    ratios, traces = {layout: [] for layout in layouts}, {key: [] for key in names}

    def reference(key: str):
        """The transformers press an engine's tokens are held to: None for dense, else the layout's policy."""
        if key == "dense":
            return None
        return LAYOUTS[key][2](str(args.surrogate), threshold=taus[key], decoding=True)

    for k, prompt in enumerate(prompts):
        for key in names if k < args.check_tokens else ():
            run, reference_press = runs[key], reference(key)
            steps = engine_steps(run, k) if reference_press is not None and args.judge_chunks else None
            if reference_press is not None and args.judge_chunks and steps is None:
                traces[key].append({"prompt": k, "preempted": "recomputed: not compared"})
                continue
            tokens, logits = greedy(model, prompt, new_tokens, reference_press, steps)
            traces[key].append(divergence(k, run["tokens"][k], tokens, logits))
        for layout in layouts:
            press = reference(layout)  # the logical ratio: the prompt judged whole, as one forward
            with torch.no_grad(), press(model):
                model(torch.tensor([prompt]))
            ratios[layout].append(press.compression_ratio)
    for record, key in zip(records[1:], layouts):
        # the layout's policy (per layer: the fill; per head: KVzap's own), each prompt judged whole
        record["kvzap_ratio"] = sum(ratios[key]) / len(ratios[key])
        record["logical_compression"] = 1 / (1 - record["kvzap_ratio"])
        record["threshold"] = taus[key]
    checked = min(args.check_tokens, len(prompts))
    for record, key in zip(records, names):
        differ = [t for t in traces[key] if t]
        record["same_tokens_as_transformers"] = f"{checked - len(differ)}/{checked}"
        record["divergences"] = differ
    print_table(records, COLUMNS)
    for record in records[1:]:
        ratio = lambda key: record[key] / records[0][key]  # noqa: E731
        print(
            f"{record['engine']}: {args.workload} at tau {record['threshold']} (ratio {record['kvzap_ratio']:.3f}): "
            f"mean running {ratio('mean_running'):.2f}x, output tokens/s {ratio('output_tokens_per_s'):.2f}x, "
            f"alone: TPOT {ratio('alone_tpot_s'):.2f}x, step p95 {ratio('alone_step_p95_s'):.2f}x dense; "
            f"accuracy {records[0]['score']} dense, {record['score']} KVzap"
        )
    record = {"args": {k: str(v) for k, v in vars(args).items()}, "prompt_tokens": list(map(len, prompts))}
    record["machine"] = {"cpu_flags": cpu_flags(), "processor": platform.processor()}
    atomic_write_json(args.out, {**record, "new_tokens": new_tokens, "records": records})


if __name__ == "__main__":
    main()
