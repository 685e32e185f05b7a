"""Oracle scoring cost: kvzap.oracle.scores against kvpress's KVzip+ data collection, on the offline small model.

The reference is kvpress's kvzap/data.py collection, written here from its description: the model loaded
with attn_implementation="eager", one forward of the repeat prompt, and a hook per attention module that
takes the full (heads x T x T) attention weights, divides rows by ||h_j||, multiplies columns by
||W_O^h v_i|| (values read from the cache), keeps rows of the repeated copy and columns of the context,
takes the max over rows and the GQA group, then the log. Ours is `oracle_scores(..., chunk_tokens=None)`
(the same single-repetition definition, sdpa model). Both get the same token ids, so their log KVzip+
scores must agree; the run fails otherwise. kvpress's own `KVzipPress(kvzip_plus_normalization=True)` is
timed too (prefill and its chunked scoring passes; its scores are another definition, see kvzap.oracle.scores).
"plain" is the floor any oracle pays: one forward of the same repeat prompt through the decoder, scoring nothing.
`ours_time_vs_plain` says how much of the oracle's time is the model's own compute (1.0: all of it).

Each measurement runs in a fresh subprocess (model load, a short warm-up, then the timed scoring pass) so
one method's freed memory cannot hide the next one's. Peak memory is the peak extra memory of the scoring
pass: on CUDA torch.cuda.max_memory_allocated minus the allocation before it; on CPU the process RSS
sampled every millisecond by a thread (psutil), minus the RSS before the pass. Throughput is context
tokens / wall seconds of the pass (prefill of the prompt included).

    python benchmarks/oracle.py --out results/oracle_benchmark.json [--contexts 1024 2048 4096] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch
from transformers import DynamicCache
from transformers.utils import logging

from kvzap.atomic import atomic_write_json
from kvzap.introspection import attention_modules, decoder
from kvzap.oracle.scores import RepeatPrompt, build_repeat_prompt, oracle_scores
from kvzap.prepare.assets import paul_graham_essays
from kvzap.prepare.models import ensure_prepared, load
from records import output_file, positive_int

SMALL_MODEL = "offline/SmolLM2-135M-Instruct"
METHODS = {"ours": "sdpa", "ref": "eager", "kvpress": "sdpa", "plain": "sdpa"}  # method -> attention implementation
TOLERANCE = 1e-3  # max abs difference of log KVzip+ between ours and the reference (float32)


def context_text(tokenizer, n_tokens: int) -> str:
    """The first n_tokens tokens of the Paul Graham essays, as text."""
    ids = tokenizer.encode("\n\n".join(paul_graham_essays()), add_special_tokens=False)
    return tokenizer.decode(ids[:n_tokens])


class PeakMemory:
    """Peak extra memory (bytes) of the `with` body: CUDA allocator stats, or sampled RSS on CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.peak = 0

    def _sample(self):
        process = psutil.Process()
        while not self._done.is_set():
            self.peak = max(self.peak, process.memory_info().rss - self._base)
            time.sleep(0.001)

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
        else:
            self._base = psutil.Process().memory_info().rss
            self._done = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self._base
        else:
            self._done.set()
            self._thread.join()


class EagerReference:
    """kvpress's KVzip+ collection hook over eager attention weights, on full tensors as data.py does."""

    def __init__(self, prompt: RepeatPrompt):
        self.prompt = prompt
        self.scores: dict[int, torch.Tensor] = {}

    def __call__(self, module, args, kwargs, output):
        ctx, rep = self.prompt.context, self.prompt.repeat
        h = kwargs["hidden_states"]  # (1, T, D)
        values = kwargs["past_key_values"].layers[module.layer_idx].values  # (1, H_kv, T, d)
        weights = output[1]  # (1, H_q, T, T) softmax over the whole prompt
        scores = weights / h.norm(dim=-1)[:, None, :, None]  # rows / ||h_j||
        w_o = module.o_proj.weight.T.reshape(module.config.num_attention_heads, module.head_dim, -1)  # (H_q, d, D)
        v = values.repeat_interleave(module.num_key_value_groups, dim=1)  # (1, H_q, T, d)
        out_norm = torch.einsum("hij,bhti->bhtj", w_o, v).norm(dim=-1)  # (1, H_q, T)
        scores = scores * out_norm[:, :, None, :]  # columns * ||W_O^h v_i||
        scores = scores[:, :, rep, ctx].amax(dim=2)  # (1, H_q, C)
        n_kv = module.config.num_key_value_heads
        self.scores[module.layer_idx] = scores.view(n_kv, -1, scores.shape[-1]).amax(dim=1).log().cpu()


def run_ref(model, prompt: RepeatPrompt) -> torch.Tensor:
    hook = EagerReference(prompt)
    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in attention_modules(model)]
    try:
        device = next(model.parameters()).device
        model.model(input_ids=prompt.input_ids[:, : prompt.repeat.stop].to(device), past_key_values=DynamicCache())
    finally:
        for handle in handles:
            handle.remove()
    return torch.stack([hook.scores[i] for i in sorted(hook.scores)])  # (L, H_kv, C)


def run_kvpress(model, prompt: RepeatPrompt) -> None:
    """Prefill of the user turn inside KVzipPress, whose exit runs its chunked KVzip+ scoring passes."""
    from kvpress import KVzipPress

    press = KVzipPress(compression_ratio=0.5, kvzip_plus_normalization=True)  # a ratio > 0 makes it score
    device = next(model.parameters()).device
    with press(model):
        model.model(input_ids=prompt.input_ids[:, : prompt.context.stop].to(device), past_key_values=DynamicCache())


def run_plain(model, prompt: RepeatPrompt) -> None:
    """The repeat prompt through the decoder stack alone, as the oracle runs it, with nothing scored."""
    decoder(model)(input_ids=prompt.input_ids[:, : prompt.repeat.stop].to(next(model.parameters()).device))


RUNNERS = {
    "ours": lambda model, prompt: oracle_scores(model, prompt, chunk_tokens=None).kvzip_plus_log,
    "ref": run_ref,
    "kvpress": run_kvpress,
    "plain": run_plain,
}


@torch.no_grad()
def worker(args) -> None:
    """One timed scoring pass in this process; prints a JSON line and saves the log scores."""
    torch.set_num_threads(args.threads)
    logging.disable_progress_bar()
    model, tokenizer = load(args.model_json, dtype="float32", attn_implementation=METHODS[args.worker])
    run = RUNNERS[args.worker]
    run(model, build_repeat_prompt(tokenizer, context_text(tokenizer, 64)))  # warm-up
    prompt = build_repeat_prompt(tokenizer, context_text(tokenizer, args.context_tokens))
    with PeakMemory(next(model.parameters()).device) as memory:
        start = time.perf_counter()
        scores = run(model, prompt)
        seconds = time.perf_counter() - start
    if scores is not None:
        torch.save(scores, args.scores)
    n_ctx = prompt.context.stop - prompt.context.start
    print(
        json.dumps({"seconds": seconds, "peak_mb": memory.peak / 2**20, "context": n_ctx, "prompt": prompt.repeat.stop})
    )


def measure(args, method: str, n_tokens: int, scores: Path) -> dict:
    command = [
        sys.executable,
        __file__,
        "--worker",
        method,
        "--context-tokens",
        str(n_tokens),
        "--scores",
        str(scores),
        "--model-json",
        str(args.model_json),
        "--threads",
        str(args.threads),
    ]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=output_file)
    parser.add_argument("--contexts", type=positive_int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--model-json", type=Path, default=Path(".cache/smollm2/model.json"))
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--no-kvpress", action="store_true", help="skip timing kvpress's KVzipPress")
    parser.add_argument("--worker", choices=list(METHODS), help=argparse.SUPPRESS)
    parser.add_argument("--context-tokens", type=positive_int, help=argparse.SUPPRESS)
    parser.add_argument("--scores", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.out is None:
        parser.error("--out is required")
    ensure_prepared(args.model_json, SMALL_MODEL)

    methods = [m for m in METHODS if not (args.no_kvpress and m == "kvpress")]
    records = []
    print(f"{'context':>8} {'method':>8} {'tokens/s':>10} {'peak MB':>10}   max |diff| log KVzip+ (ours vs ref)")
    with tempfile.TemporaryDirectory() as tmp:
        for n_tokens in args.contexts:
            runs = {m: measure(args, m, n_tokens, Path(tmp) / f"{m}.pt") for m in methods}
            diff = (torch.load(Path(tmp) / "ours.pt") - torch.load(Path(tmp) / "ref.pt")).abs().max().item()
            record = {
                "context_tokens": n_tokens,
                "measured_context_tokens": runs["ours"]["context"],
                "prompt_tokens": runs["ours"]["prompt"],
                "max_abs_diff_log_kvzip_plus": diff,
                "device": "cuda" if torch.cuda.is_available() else "cpu",
                "threads": args.threads,
            }
            for m, run in runs.items():
                record[f"{m}_tokens_per_s"] = run["context"] / run["seconds"]
                record[f"{m}_peak_mb"] = run["peak_mb"]
                print(
                    f"{n_tokens:>8} {m:>8} {record[f'{m}_tokens_per_s']:>10.1f} {run['peak_mb']:>10.1f}"
                    + (f"   {diff:.2e}" if m == "ours" else ""),
                    flush=True,
                )
            if "plain" in runs:
                record["ours_time_vs_plain"] = runs["ours"]["seconds"] / runs["plain"]["seconds"]
                print(f"{n_tokens:>8} ours' time / a plain forward's: {record['ours_time_vs_plain']:.2f}x", flush=True)
            records.append(record)
            assert diff < TOLERANCE, f"ours and the reference disagree at {n_tokens} tokens: {diff:.3e}"
    atomic_write_json(args.out, records)


if __name__ == "__main__":
    main()
