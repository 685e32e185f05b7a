"""The offline training mix: real text of several kinds from installed packages, cut into passages, interleaved."""

import pytest

from kvzap.prepare import assets
from kvzap.training import corpus
from tiny_models import tiny_tokenizer


def test_wikitext_becomes_prose():
    text = (
        "{{Infobox|name={{nested|x}}}}'''Alabama''' is a [[U.S. state|state]] in the [[Southern United States]]."
        "<ref name=a>{{cite web|url=x}}</ref> It has [[File:Map.png|thumb|A [[map]] of it]]rivers.\n"
        "== History ==\nSee [https://example.org the site].<!-- hidden -->\n{| class=x\n| cell\n|}\n"
        "[[Category:States]]"
    )
    assert assets.strip_wikitext(text) == (
        "Alabama is a state in the Southern United States. It has rivers.\nHistory\nSee the site."
    )


def test_every_source_holds_real_text():
    english = next(assets.wikipedia_articles("en"))
    assert english.startswith("Anarchism is a political philosophy") and "{{" not in english and "[[" not in english
    bulgarian = next(assets.wikipedia_articles("bg"))
    assert sum("а" <= ch <= "я" for ch in bulgarian.lower()) > 5000  # Cyrillic prose
    assert len(assets.news_paragraphs()) == 300
    assert "def " in next(assets.python_sources())
    problem = next(assets.codeio_problems())
    assert problem.startswith("Given") and "def main_solution" in problem


def test_mix_selection_is_interleaved_within_bounds_and_deterministic():
    tok = tiny_tokenizer()
    split = corpus.select("offline/mix", tok, 60, 200, n_test=1, n_train=2)
    subsets = list(corpus._mix_sources())
    assert [p.subset for p in split["test"]] == subsets
    assert [p.subset for p in split["train"]] == subsets * 2  # round-robin: any prefix covers every source
    for prompt in split["test"] + split["train"]:
        assert 60 < len(tok.encode(prompt.text)) < 200
    again = corpus.select("offline/mix", tok, 60, 200, n_test=1, n_train=2)
    assert [p.text for p in again["train"]] == [p.text for p in split["train"]]
    code = next(p for p in split["train"] if p.subset == "python-code")
    assert "\n" in code.text  # code keeps its lines


def test_unknown_corpus_named():
    with pytest.raises(ValueError, match="offline/mix"):
        corpus.select("offline/nope", tiny_tokenizer(), 1, 10, 1, 1)
