"""RULER: the Hub dataset for real runs, and an offline generator of the same tasks for the CPU demo.

Rows follow kvpress's RULER schema: context (compressed), question and answer_prefix (appended after
compression), answers (list of strings), task, max_new_tokens. The generator follows RULER's templates
(NVIDIA/RULER, synthetic tasks) with the Paul Graham essays or RULER's "noise" sentences as haystack, and
sizes each haystack with the evaluated model's own tokenizer.
"""

from __future__ import annotations

import random
import re
import string
import uuid
from dataclasses import dataclass

import pandas as pd

from kvzap.assets import paul_graham_essays

HUB_DATASET = "simonjegou/ruler"
MAX_NEW_TOKENS = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa": 32}
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NIAH_CONTEXT = (
    "Some special magic {kind} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {kind} afterwards.\n{haystack}"
)
NIAH_QUESTION = "What are all the special magic {kind} for {query} mentioned in the provided text?"
NIAH_ANSWER_PREFIX = " The special magic {kind} for {query} mentioned in the provided text are"
NEEDLE = "One of the special magic {kind} for {key} is: {value}."
VT_CONTEXT = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{haystack}"
VT_QUESTION = (
    "Question: Find all variables that are assigned the value {value} in the text above."
)
VT_ANSWER_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {n} variables are "
    "assigned the value {value}, they are:"
)


@dataclass(frozen=True)
class NiahSpec:
    haystack: str  # "essay", "noise" or "needle"
    key_kind: str  # "words" or "uuids"
    value_kind: str  # "numbers" or "uuids"
    n_keys: int = 1  # needles written (one answered, the rest distractors, unless n_queries > 1)
    n_values: int = 1
    n_queries: int = 1


# RULER's 13-task suite (qa_1/qa_2 need SQuAD/HotpotQA, which no package ships: Hub only).
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
OFFLINE_TASKS = (*NIAH_TASKS, "vt")
HUB_ONLY_TASKS = ("cwe", "fwe", "qa_1", "qa_2")


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
            chunk = text[start:start + n_chars]
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


def generate(tokenizer, tasks: list[str], context_tokens: int, n_samples: int, seed: int = 42) -> pd.DataFrame:
    """RULER-style rows sized with `tokenizer`; deterministic for a given seed."""
    unknown = [t for t in tasks if t not in OFFLINE_TASKS]
    if unknown:
        raise ValueError(
            f"Offline RULER cannot generate {unknown}: {sorted(HUB_ONLY_TASKS)} need source data that no package "
            f"ships (use the Hub dataset {HUB_DATASET}); offline tasks are {list(OFFLINE_TASKS)}."
        )
    words = _essay_words()
    rows = []
    for task in tasks:
        for i in range(n_samples):
            rng = random.Random(f"{seed}-{task}-{context_tokens}-{i}")
            row = _vt_sample(tokenizer, context_tokens, rng) if task == "vt" else _niah_sample(
                tokenizer, NIAH_TASKS[task], context_tokens, rng, words)
            rows.append({"sample_id": f"{task}-{i}", "task": task, **row})
    return pd.DataFrame(rows)


def load_hub(context_tokens: int, tasks: list[str] | None = None, n_samples: int | None = None, seed: int = 42) -> pd.DataFrame:
    """kvpress's RULER dataset (built with RULER's prepare.py and the Llama-3.1 tokenizer)."""
    from datasets import load_dataset

    df = load_dataset(HUB_DATASET, data_dir=str(context_tokens), split="test").to_pandas()
    if tasks:
        df = df[df["task"].isin(tasks)]
    if n_samples:
        df = df.groupby("task", group_keys=False).apply(lambda g: g.sample(min(len(g), n_samples), random_state=seed))
    df = df.rename(columns={"answer": "answers"})
    df["answers"] = df["answers"].apply(list)
    df["sample_id"] = df["task"] + "-" + df.groupby("task").cumcount().astype(str)
    return df.reset_index(drop=True)
