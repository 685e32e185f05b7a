"""What a config reads from the Hugging Face Hub (and DuoAttention's head patterns, from GitHub), as the list of
downloads that `snakemake prefetch` makes (kvzap.prepare.prefetch fetches it). The plan says what, since only it
sees the whole config next to the benchmarks' and the corpus' Hub files and what each method loads at run time.

Each item is the download the run itself makes, at the revision the config pins: a Hub model's files as prepare pins
them, RULER / AIME25 / Nemotron through kvzap.prepare.hub_files.dataset_files with the loaders' patterns,
LongBench's data.zip, the Q-Filters repository kvpress's QFilterPress loads, the DuoAttention pattern
kvzap.evaluation.duo_patterns reads, and kmfoda/booksum as kvpress's DuoAttention on-the-fly scoring loads it.
Offline models (`offline/...`) and offline or local benchmark sources need nothing. Torch-free.
"""

from __future__ import annotations

import json

from kvzap.evaluation import duo_patterns
from kvzap.evaluation.suites import aime, longbench, ruler
from kvzap.plan.sweep import cells
from kvzap.prepare.prefetch import MODEL_FILES, Fetch
from kvzap.training import corpus

# kvpress's DuoAttentionPress(on_the_fly_scoring=True) scores heads on BookSum chapters:
# `load_dataset("kmfoda/booksum", split="train")` (kvpress/presses/duo_attention_press.py), which reads only the
# datasets cache (HF_DATASETS_CACHE) offline.
BOOKSUM, BOOKSUM_SPLIT = "kmfoda/booksum", "train"
LONGBENCH_ARCHIVE = "data.zip"  # kvzap.evaluation.suites.longbench.download_hub


def qfilter_repo(model_id: str) -> str:
    """The Q-Filters repository kvpress's QFilterPress loads for `model_id` (load_q_filters: the id's last part,
    Meta-Llama renamed Llama except for the 405B model, as nthngdy/<name>_qfilt)."""
    name = model_id.split("/")[-1]
    name = name if "Meta-Llama-3.1-405B" in name else name.replace("Meta-Llama", "Llama")
    return f"nthngdy/{name}_qfilt"


def ruler_pattern(subset: str) -> str:
    """The files kvzap.evaluation.suites.ruler.load_hub reads for a context length."""
    return f"{int(subset)}/*test*.parquet"


def method_fetches(model_id: str, method: str) -> list[Fetch]:
    """What `method` loads at run time for a Hub model, besides the model itself (methods.METHODS[m].needs_hub)."""
    if method == "qfilter":
        return [Fetch("snapshot", qfilter_repo(model_id))]
    if method == "duo_attention":
        folder = duo_patterns.require_pattern(model_id)
        return [Fetch("mirror", folder, source=duo_patterns.pattern_source(), patterns=duo_patterns.FILES)]
    if method == "duo_attention_on_the_fly":
        return [Fetch("datasets-cache", BOOKSUM, "dataset", split=BOOKSUM_SPLIT)]
    return []


def benchmark_fetch(bench: dict) -> Fetch | None:
    """The Hub files of an `evaluation.benchmarks` entry, None unless its source is the Hub."""
    if bench["source"] != "hub":
        return None
    revision, kind = bench.get("revision"), bench["benchmark"]
    if kind == "ruler":
        return Fetch("dataset", ruler.HUB_DATASET, "dataset", revision, tuple(map(ruler_pattern, bench["subsets"])))
    if kind == "longbench":
        return Fetch("file", longbench.HUB_DATASET, "dataset", revision, (LONGBENCH_ARCHIVE,))
    if kind == "aime25":
        return Fetch("dataset", aime.HUB_DATASET, "dataset", revision, (aime.HUB_TEST_FILES,))
    raise ValueError(f"No Hub files known for benchmark {kind!r}: add them to kvzap.plan.hub_assets")


def _merged(items: list[tuple[Fetch, str]]) -> list[Fetch]:
    """One fetch per repository, revision and kind: patterns and reasons joined, in first-seen order."""
    merged: dict[tuple, Fetch] = {}
    for item, reason in items:
        key = (item.kind, item.repo, item.repo_type, item.revision, item.split, item.source)
        seen = merged.get(key, item)
        patterns = seen.patterns + tuple(p for p in item.patterns if p not in seen.patterns)
        reasons = seen.needed_by + ((reason,) if reason not in seen.needed_by else ())
        merged[key] = Fetch(**{**seen.to_json(), "patterns": patterns, "needed_by": reasons})
    return list(merged.values())


def fetches(config: dict) -> list[Fetch]:
    """Every download a run of `config` (validated, defaults filled) makes from the Hub, in stage order."""
    items = []
    for name, model in config["models"].items():
        if not model["id"].startswith("offline/"):
            items.append((Fetch("snapshot", model["id"], revision=model.get("revision"), patterns=MODEL_FILES), name))
    oracle = config["oracle"]
    if corpus.on_hub(oracle["corpus"]):
        patterns = tuple(f"{subset}/*.parquet" for subset in corpus.subsets(oracle["corpus"]))
        items.append((Fetch("dataset", oracle["corpus"], "dataset", oracle.get("revision"), patterns), "oracle"))
    evaluated = cells(config)
    for name in dict.fromkeys(c.bench for c in evaluated):
        if (item := benchmark_fetch(config["evaluation"]["benchmarks"][name])) is not None:
            items.append((item, name))
    for model, method in dict.fromkeys((c.model, c.method) for c in evaluated):
        model_id = config["models"][model]["id"]
        if not model_id.startswith("offline/"):
            items += [(item, f"{method} ({model})") for item in method_fetches(model_id, method)]
    return _merged(items)


def manifest(config: dict) -> str:
    """The fetches as the JSON list `python -m kvzap.prepare.prefetch --fetches` reads."""
    return json.dumps([item.to_json() for item in fetches(config)])
