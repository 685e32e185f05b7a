"""Sequences served at a fixed KV memory by vLLM with the KVzap plugin against dense vLLM: a long-prompt workload
(RULER-style contexts on the demo model, every request submitted at once, greedy, a fixed number of new tokens), the
same `kv_cache_memory_bytes` for both engines. Per engine: peak and mean running sequences, preemptions, output
tokens/s, and the realised compression (the blocks the dense cache would hold for the running sequences / the blocks
held); beside it KVzap's logical compression, and whether each engine's greedy tokens equal the transformers path's
(dense, and under the same fill policy: KVzapLayerFillPress, decoding=True), with where and by what logit margin
those that differ first leave it. Each engine runs in .venv-vllm (`make setup-vllm`).

    cd benchmarks && python vllm_serving.py --model-json <demo>/model.json --surrogate <demo>/surrogates/mlp \
        --threshold 0.5 --out cpu/vllm_serving.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from contextlib import nullcontext
from pathlib import Path

import torch

import ruler_rows
from kvzap.atomic import atomic_write_json
from kvzap.pruning import KVzapLayerFillPress
from kvzap.surrogate.model import resolve_folder
from records import output_file, positive_int, print_table

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["engine", "peak_running", "mean_running", "preemptions", "output_tokens_per_s", "realised_compression"]


def run_engine(folder: Path, name: str, model: str, engine: dict, max_tokens: int) -> dict:
    out = folder / f"{name}.json"
    command = [str(ROOT / ".venv-vllm" / "bin" / "python"), str(ROOT / "benchmarks" / "vllm_engine.py")]
    command += ["--model", model, "--prompts", str(folder / "prompts.json"), "--max-tokens", str(max_tokens)]
    command += ["--engine", json.dumps(engine), "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"the {name} engine failed:\n{result.stderr[-4000:]}")
    return json.loads(out.read_text())


def greedy(model, prompt: list[int], new_tokens: int, press) -> tuple[list[int], tuple]:
    """Transformers' greedy tokens (under the press, if any) and each step's logits."""
    with torch.no_grad(), press(model) if press is not None else nullcontext():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=new_tokens,
            eos_token_id=None,  # no stop and no ban: the end token is one more token, as under vLLM's ignore_eos
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
    return out.sequences[0, len(prompt) :].tolist(), out.scores


def divergence(prompt: int, tokens: list[int], reference: list[int], logits: tuple) -> dict | None:
    """Where an engine's greedy tokens first leave transformers', and by how much transformers' own choice led
    there: a margin near zero is a near-tie that float rounding may flip, a large one a different computation."""
    step = next((i for i, (a, b) in enumerate(zip(tokens, reference, strict=True)) if a != b), None)
    if step is None:
        return None
    margin = logits[step][0, reference[step]] - logits[step][0, tokens[step]]
    return {"prompt": prompt, "step": step, "logit_margin": margin.item()}


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
        "seconds": record["seconds"],
        "blocks": record["blocks"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ruler_rows.add_arguments(parser, "1024", ["niah_single_2"], 16)
    parser.add_argument("--surrogate", type=Path, required=True)
    parser.add_argument("--threshold", type=float, default=0.8, help="demo model: r ~ 0.75 (benchmarks/slot_fill.py)")
    parser.add_argument("--new-tokens", type=positive_int, default=48)
    parser.add_argument("--kv-memory-mib", type=positive_int, default=200, help="kv_cache_memory_bytes, both engines")
    parser.add_argument("--block-size", type=positive_int, default=32)
    parser.add_argument("--out", type=output_file, required=True)
    args = parser.parse_args()
    try:  # a missing checkpoint is refused here, not after the dense engine has run
        checkpoint = resolve_folder(args.surrogate)
    except FileNotFoundError as err:
        parser.error(str(err))
    model, tokenizer, _, rows = ruler_rows.model_and_rows(args)
    prompts = [tokenizer(row.context + row.question).input_ids for row in rows.itertuples()]
    model_json = json.loads(Path(args.model_json).read_text())
    engine = {"dtype": "float32", "enforce_eager": True, "enable_prefix_caching": False, "max_num_seqs": 64}
    engine |= {"kv_cache_memory_bytes": args.kv_memory_mib * 2**20, "block_size": args.block_size}
    engine |= {"max_model_len": max(map(len, prompts)) + args.new_tokens}
    engine |= {"hf_overrides": {"kvzap_model_id": model_json["model_id"]}}  # the surrogate's base model
    kvzap = {"surrogate": str(checkpoint.resolve() if checkpoint else args.surrogate), "threshold": args.threshold}
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "prompts.json").write_text(json.dumps(prompts))
        dense = run_engine(folder, "dense", model_json["path"], engine, args.new_tokens)
        pruned = run_engine(
            folder, "kvzap", model_json["path"], engine | {"additional_config": {"kvzap": kvzap}}, args.new_tokens
        )
    ratios, traces = [], {"dense vLLM": [], "vLLM + KVzap": []}
    for k, prompt in enumerate(prompts):
        press = KVzapLayerFillPress(str(args.surrogate), threshold=args.threshold, decoding=True)
        for name, engine_tokens, reference_press in (("dense vLLM", dense, None), ("vLLM + KVzap", pruned, press)):
            reference, logits = greedy(model, prompt, args.new_tokens, reference_press)
            traces[name].append(divergence(k, engine_tokens["tokens"][k], reference, logits))
        ratios.append(press.compression_ratio)
    records = [summary("dense vLLM", dense), summary("vLLM + KVzap", pruned)]
    records[1]["kvzap_logical_compression"] = 1 / (1 - sum(ratios) / len(ratios))
    records[1]["kvzap_ratio"] = sum(ratios) / len(ratios)
    for record, name in zip(records, traces):
        differ = [t for t in traces[name] if t]
        record["same_tokens_as_transformers"] = f"{len(prompts) - len(differ)}/{len(prompts)}"
        record["divergences"] = differ
    print_table(records, COLUMNS)
    print(
        f"KVzap ratio {records[1]['kvzap_ratio']:.3f} (logical {records[1]['kvzap_logical_compression']:.2f}x); "
        f"greedy tokens equal to the transformers path: dense {records[0]['same_tokens_as_transformers']}, "
        f"KVzap {records[1]['same_tokens_as_transformers']}; "
        f"peak sequences {records[1]['peak_running'] / records[0]['peak_running']:.2f}x dense"
    )
    record = {"args": {k: str(v) for k, v in vars(args).items()}, "prompt_tokens": list(map(len, prompts))}
    atomic_write_json(args.out, {**record, "records": records})


if __name__ == "__main__":
    main()
