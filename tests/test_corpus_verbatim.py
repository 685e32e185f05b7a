"""Nemotron prompts reach the oracle verbatim: whitespace at either end and non-ASCII text are kept as read."""

from kvzap.training import corpus
from tiny_models import tiny_tokenizer

EDGE_TEXTS = [
    "  leading spaces and a trailing newline\n",
    "\n\nblank lines first, tabs last\t\t",
    "東京は日本の首都です。 Café naïve 👍🏽🎉 \n",
    "def f(x):\n\treturn x\n\n",
]


def test_selection_keeps_text_exactly(monkeypatch):
    monkeypatch.setattr(corpus, "_hub_texts", lambda subset, revision: iter(EDGE_TEXTS))
    split = corpus.select(corpus.NEMOTRON, tiny_tokenizer(), min_tokens=0, max_tokens=10_000, n_test=1, n_train=3)
    by_subset = {}
    for prompt in split["test"] + split["train"]:
        by_subset.setdefault(prompt.subset, []).append(prompt)
    assert set(by_subset) == set(corpus.NEMOTRON_SUBSETS)
    for prompts in by_subset.values():
        assert [p.text for p in sorted(prompts, key=lambda p: p.index)] == EDGE_TEXTS
