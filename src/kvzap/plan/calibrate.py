"""The forecast's throughput table measured on this machine, for each model of a config, in about a minute: the
work of every stage on a few samples, through the code the jobs run, at the threads the jobs get.

- prepare: the model prepared into a temporary folder (an offline model's conversion; a Hub model's is its download,
  not timed), which the measurements below then load;
- a job's start: a fresh interpreter importing what an evaluation job imports, plus the model's load;
- oracle: `kvzap.training.collect` on real corpus prompts (their mean length is kept too), at the oracle's threads;
- training: `fit_ridge` on those pairs and one epoch of `fit_mlp` drawing them over and over, at the training threads;
- evaluation: a prefill at the first benchmark's context, and decoding steps over the batched cache of a prefill
  group (kvzap.evaluation.shared_prefill, one row and the group's rows) and over a dense cache (the per-cell path),
  and what KVzip's repetition adds to a sample through kvpress's pipeline where the config runs KVzip;
  a step's read of its rows' KV is inside these times, so the table sets no separate KV bandwidth for it.
The evaluation's numbers are medians of repeats after a warm-up, the oracle's follow a warm-up prompt, the fits are
timed once; all in the config's dtype as `dtype: auto` resolves it here.
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from transformers import DynamicCache, pipeline

from kvzap import dtypes
from kvzap.evaluation import presses
from kvzap.evaluation.shared_prefill import batched_cache, kept_rows, record
from kvzap.plan import forecast
from kvzap.plan.cluster import resource
from kvzap.plan.recipe import recipe
from kvzap.plan.sweep import PREFILL_GROUP, eval_jobs
from kvzap.prepare import models
from kvzap.pruning.attention import use_kvzap_attention
from kvzap.training import corpus
from kvzap.training.collect import collect_split
from kvzap.training.fit import fit_mlp, fit_ridge

ORACLE_PROMPTS = 5  # real corpus prompts scored (and then fitted on): about a second each on 2 cores
DECODE_STEPS = 6
DECODE_REPEATS = 3
MLP_BATCHES = 96  # minibatches of the timed MLP epoch
REPEAT_CONTEXT = 1024  # tokens KVzip's repetition is timed on (its speed per token, taken for longer contexts too)
IMPORTS = "import kvzap.evaluation.job, kvzap.evaluation.shared_prefill"  # what an evaluation job imports first


@contextmanager
def threads(count: int):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def timed(work) -> tuple[object, float]:
    """What `work()` returns, and the seconds it took."""
    start = time.perf_counter()
    result = work()
    return result, time.perf_counter() - start


def median_seconds(work, repeats: int = 3) -> float:
    """The median wall time of `work()` over `repeats` runs, after one warm-up run."""
    work()
    return statistics.median(timed(work)[1] for _ in range(repeats))


def _cores(config: dict, model: str, stage: str) -> int:
    value = resource(config, model, stage, "cpus")
    return os.cpu_count() if value == "all" else int(value)


def _interpreter_seconds(code: str) -> float:
    command = [sys.executable, "-c", code]
    return timed(lambda: subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}))[1]


def _group_rows(config: dict, model: str) -> int:
    """The rows one decode of the model's first prefill group holds, else 1."""
    group = next((job for job in eval_jobs(config) if job.model == model and job.group == PREFILL_GROUP), None)
    return 1 if group is None else forecast.decode_shape(config, group, grouped=True)[2]


def _context(config: dict) -> int:
    """The first benchmark's context length: a RULER subset, else the typical LongBench context."""
    bench = next(iter(config["evaluation"]["benchmarks"].values()))
    return int(bench["subsets"][0]) if bench["benchmark"] == "ruler" else forecast.TYPICAL["longbench_context_tokens"]


def _steps(model, cache, rows: int, start: int) -> None:
    """DECODING_STEPS one-token forwards of `rows` rows on `cache`, as a decode feeds them."""
    for step in range(DECODE_STEPS):
        ids = torch.zeros(rows, 1, dtype=torch.long, device=model.device)
        positions = torch.full((rows, 1), start + step, device=model.device)
        model(input_ids=ids, past_key_values=cache, position_ids=positions, logits_to_keep=1)


def _decode_seconds(model, context_ids: torch.Tensor, rows: int, shared: bool) -> float:
    """One decoding step of `rows` rows over the prefill of `context_ids`: through a prefill group's batched cache
    (`shared`, the "kvzap" attention over packed rows) or a plain dense cache (the per-cell path). Each repeat steps a
    fresh cache, built untimed; the median of DECODE_REPEATS after a warm-up."""
    prefill = record(model, context_ids)
    length = context_ids.shape[1]

    def cache():
        if shared:
            kept = [kept_rows(model, prefill, None)] * rows
            return batched_cache([(prefill, kept)], model.config.num_key_value_heads)
        dense = DynamicCache(config=model.config)
        for i, (k, v) in enumerate(zip(prefill.keys, prefill.values)):
            dense.update(k.expand(rows, -1, -1, -1).contiguous(), v.expand(rows, -1, -1, -1).contiguous(), i)
        return dense

    def stepped() -> float:
        fresh = cache()
        return timed(lambda: _steps(model, fresh, rows, length))[1]

    times = [stepped() for _ in range(DECODE_REPEATS + 1)]
    return statistics.median(times[1:]) / DECODE_STEPS


@torch.no_grad()
def _evaluation(config: dict, name: str, model, tokenizer) -> dict:
    context = _context(config)
    ids = torch.randint(100, tokenizer.vocab_size - 1, (1, context), generator=torch.Generator().manual_seed(0))
    rows = _group_rows(config, name)
    with threads(_cores(config, name, "evaluate")):
        prefill = median_seconds(lambda: model(input_ids=ids, logits_to_keep=1))
        dense = _decode_seconds(model, ids, 1, shared=False)
        repeat = _repeat_speed(config, model, tokenizer, ids)  # before "kvzap" attention: KVzip's jobs run without
        use_kvzap_attention(model)  # a prefill group's batched cache is read by the "kvzap" attention, as in the job
        one = _decode_seconds(model, ids, 1, shared=True)
        many = _decode_seconds(model, ids, rows, shared=True) if rows > 1 else one
    return {
        **({"repeat_tokens_per_s": repeat} if repeat else {}),
        "prefill_tokens_per_s": context / prefill,
        "decode_step_s": dense,
        "decode_row_s": (many - one) / (rows - 1) if rows > 1 else 0.0,
        "pruned_step_factor": one / dense,
        "kv_read_bytes_per_s": None,  # inside the measured step times
    }


def _repeat_speed(config: dict, model, tokenizer, ids: torch.Tensor) -> float | None:
    """Context tokens per second of KVzip's repetition through kvpress's pipeline (a sample of at most REPEAT_CONTEXT
    tokens with its press against one without, one answer token each), if the config runs KVzip or KVzip+; None
    otherwise. Longer contexts are priced at this speed per token: an underestimate, as attention grows with them."""
    method = next((m for m in forecast.REPEAT_PASS if m in _methods(config)), None)
    if method is None:
        return None
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device=model.device)
    press = presses.build(method, config["evaluation"]["ratios"][0], {})
    context = tokenizer.decode(ids[0, :REPEAT_CONTEXT])  # KVzip's passes are several prefills: a bounded context

    def answer(chosen):
        return lambda: pipe(context, question="What is it?", press=chosen, max_new_tokens=1)

    extra = median_seconds(answer(press), repeats=1) - median_seconds(answer(None), repeats=1)
    return len(tokenizer(context)["input_ids"]) / max(extra, 1e-3)


def _methods(config: dict) -> set[str]:
    evaluation = config["evaluation"]
    return {m for bench in evaluation["benchmarks"].values() for m in bench.get("methods", evaluation["methods"])}


def _corpus(config: dict, tokenizer) -> tuple[list, dict]:
    """ORACLE_PROMPTS corpus prompts to time the oracle on, and what the oracle stage will read: an offline corpus's
    whole selection is cheap, so its prompt counts and mean length are measured; a Hub corpus's first prompt per
    subset gives the mean length only (the counts stay the config's)."""
    oracle = config["oracle"]
    whole = not corpus.on_hub(oracle["corpus"])
    n_test, n_train = (oracle["n_test"], oracle["n_train"]) if whole else (0, 1)
    chosen = corpus.select(oracle["corpus"], tokenizer, oracle["min_tokens"], oracle["max_tokens"], n_test, n_train)
    every = chosen["train"] + chosen["test"]
    lengths = [len(tokenizer(prompt.text)["input_ids"]) for prompt in every]
    found = {"oracle_prompt_tokens": statistics.mean(lengths)}
    if whole:
        found |= {"oracle_train_prompts": len(chosen["train"]), "oracle_test_prompts": len(chosen["test"])}
    prompts = chosen["train"]
    while len(prompts) < ORACLE_PROMPTS:  # a Hub corpus: one prompt per subset, repeated if there are few subsets
        prompts += prompts[: ORACLE_PROMPTS - len(prompts)]
    return prompts[:ORACLE_PROMPTS], found


def _oracle_and_training(config: dict, name: str, model, tokenizer, folder: Path) -> tuple[dict, dict]:
    """The oracle's tokens per second and the fits' (pair, layer) visits per second, from the same real prompts, and
    what the corpus gives the oracle (`_corpus`)."""
    oracle, training = config["oracle"], config["training"]
    prompts, found = _corpus(config, tokenizer)
    source = corpus.subsets(oracle["corpus"])
    per_prompt = None if oracle["tokens_per_prompt"] == "all" else int(oracle["tokens_per_prompt"])
    settings = {"calibration": source[0]}
    record_ = {"model_id": name, "revision": "calibration"}
    with threads(_cores(config, name, "oracle")):  # the first prompt warms up, the others are timed
        collect_split(model, tokenizer, prompts[:1], folder / "warm", settings, per_prompt, 10**9, 0, record_)
        manifest, oracle_s = timed(
            lambda: collect_split(
                model, tokenizer, prompts[1:], folder / "train", settings, per_prompt, 10**9, 0, record_
            )
        )
    lengths = [len(tokenizer(p.text)["input_ids"]) for p in prompts[1:]]
    repeat_tokens = sum(lengths) * forecast.ORACLE_REPEAT
    layers = len(manifest.get("layers", range(manifest["n_layers"])))
    # one epoch of MLP_BATCHES minibatches: the pairs drawn several times over, so that the epoch's fixed costs
    # (validation, checkpoint) weigh on the rate about as little as on a real run's hundreds of minibatches
    tiled = np.tile(
        np.arange(manifest["n_pairs"]), math.ceil(MLP_BATCHES * training["batch_size"] / manifest["n_pairs"])
    )
    with threads(_cores(config, name, "train")):
        _, mlp = timed(
            lambda: fit_mlp(
                folder / "train",
                folder / "mlp",
                1,
                training["lr"],
                training["batch_size"],
                pairs=tiled,
                valid_split=training["valid_split"],
                keep=training["keep"],
            )
        )
        _, linear = timed(lambda: fit_ridge(folder / "train", training["alpha"]))
    speed = {
        "oracle_tokens_per_s": repeat_tokens / oracle_s,
        "mlp_pair_layers_per_s": len(tiled) * layers / mlp,
        "linear_pair_layers_per_s": manifest["n_pairs"] * layers / linear,
    }
    return speed, found


def measure(config: dict, name: str, model, tokenizer, folder: Path) -> tuple[dict, dict]:
    """One loaded model's oracle, training and evaluation speeds (scratch files in `folder`), and what the corpus
    gives the oracle with this model's tokenizer."""
    trained, found = _oracle_and_training(config, name, model, tokenizer, folder)
    return {**trained, **_evaluation(config, name, model, tokenizer)}, found


def calibrate(config: dict) -> dict:
    """A throughput table (kvzap.plan.forecast's keys, per model, measured here) for `config`."""
    table: dict = {"light_job_s": _interpreter_seconds("import kvzap.report.aggregate, kvzap.report.figures")}
    imports = _interpreter_seconds(IMPORTS)
    for name, entry in config["models"].items():
        with tempfile.TemporaryDirectory(prefix="kvzap-calibrate-") as tmp:
            folder = Path(tmp)
            _, prepare_s = timed(lambda: models.prepare(entry["id"], folder / "model", entry.get("revision")))
            dtype = dtypes.resolve(entry.get("dtype", "auto"), "cuda" if torch.cuda.is_available() else "cpu")
            (model, tokenizer), load_s = timed(lambda: models.load(folder / "model" / "model.json", dtype=dtype))
            speed, found = measure(recipe(config, name), name, model, tokenizer, folder)
        offline = entry["id"].startswith("offline/")  # a Hub model's prepare is a download: not this machine's speed
        table[name] = {
            **speed,
            "job_start_s": imports + load_s,
            **({"prepare_s": imports + prepare_s} if offline else {}),
            **found,  # what the corpus gives this model's recipe, as its tokenizer counts it
        }
    return table | found  # overall: the last model's count
