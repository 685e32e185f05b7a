"""LongBench: prompt splits for all 21 subsets, the loader on fixture files in THUDM's schema, and scoring."""

from pathlib import Path

import pandas as pd
import pytest

from kvzap.evaluation.suites import longbench

FIXTURES = Path(__file__).parent / "fixtures" / "longbench"
SOURCE = f"local:{FIXTURES}"
INPUT_ENDINGS = {"trec": "\nType:", "triviaqa": "\nAnswer:", "samsum": "\nSummary:", "lsht": "\n类别："}
TABLES = (
    longbench.CONTEXT_TEMPLATES,
    longbench.QUESTION_TEMPLATES,
    longbench.ANSWER_PREFIXES,
    longbench.OFFICIAL_MAX_NEW_TOKENS,
)


@pytest.mark.parametrize("task", longbench.LONGBENCH_SUBSETS)
def test_split_keeps_the_document_compressed_and_the_query_after_it(task):
    """(tests/test_kvpress_reference.py holds the cut byte for byte against kvpress's builder.)"""
    context, input_ = "DOC {context} Question: fake", "What? " + INPUT_ENDINGS.get(task, "")
    ctx, question, prefix = longbench.split_prompt(task, context, input_)
    assert context in ctx and "What?" not in ctx  # the document is compressed, the query is not
    assert ("What?" in question) == ("{input}" in longbench.QUESTION_TEMPLATES[task])
    assert prefix == longbench.ANSWER_PREFIXES[task] and not (prefix and question.endswith(prefix))


def test_kvpress_splits():
    ctx, question, prefix = longbench.split_prompt("gov_report", "R", "")
    assert ctx.endswith("Report:\nR\n\n") and question == "Now, write a one-page summary of the report.\n\n"
    assert prefix == "Summary:"
    assert longbench.split_prompt("trec", "EX", "Question: Why ?\nType:")[1:] == ("Question: Why ?\n", "Type:")
    assert longbench.split_prompt("lcc", "code\n", "")[1:] == ("", "Next line of code:\n")
    # lsht: kvpress's prompts give it no answer prefix, so its cue stays in the question (the user's turn)
    assert longbench.split_prompt("lsht", "EX", "新闻：x\n类别：")[1:] == ("新闻：x\n类别：", "")


def test_all_subsets_are_configured():
    assert len(longbench.LONGBENCH_SUBSETS) == 21
    for table in TABLES:
        assert set(table) == set(longbench.LONGBENCH_SUBSETS)


def test_load_fixture_rows():
    df = longbench.load(SOURCE, "narrativeqa", tokenizer=None, n_samples=None, seed=0)
    assert df["sample_id"].tolist() == ["narrativeqa-nq0a1", "narrativeqa-nq0a2", "narrativeqa-nq0a3"]
    row = df.iloc[0]
    # The document's own "Question:" stays in the context: the split follows the template, not the text.
    assert "Question: is not a question here" in row["context"]
    assert row["question"] == "Question: Who does Elinor marry?\n\n"
    assert row["answer_prefix"] == "Answer:"
    assert row["answers"] == ["Edward Ferrars", "Edward"]
    assert row["max_new_tokens"] == 128 + 20
    assert {"all_classes", "length", "language"} <= set(df.columns)


def test_load_samples_deterministically():
    a = longbench.load(SOURCE, "narrativeqa", None, n_samples=2, seed=1)
    b = longbench.load(SOURCE, "narrativeqa", None, n_samples=2, seed=1)
    assert len(a) == 2 and a["sample_id"].tolist() == b["sample_id"].tolist()


def test_load_few_shot_subsets_move_the_cue_to_the_answer_prefix():
    trec = longbench.load(SOURCE, "trec", None, None, 0).iloc[0]
    assert trec["question"] == "Question: What city hosted the 1992 Summer Olympics ?\n"
    assert trec["answer_prefix"] == "Type:"
    assert trec["all_classes"] == ["Individual", "City", "Country", "Other location"]
    lsht = longbench.load(SOURCE, "lsht", None, None, 0).iloc[0]
    assert (lsht["question"], lsht["answer_prefix"]) == ("新闻：国足昨晚两球战胜对手。\n类别：", "")
    assert longbench.load(SOURCE, "passage_count", None, None, 0).iloc[0]["answers"] == ["2"]


def test_load_rejects_unknown_subset_and_source():
    with pytest.raises(ValueError):
        longbench.load(SOURCE, "narrativeqa_e", None, None, 0)
    with pytest.raises(ValueError):
        longbench.load("offline", "trec", None, None, 0)


def test_score_on_fixture_predictions():
    frames = [longbench.load(SOURCE, t, None, None, 0) for t in ("narrativeqa", "trec", "multifieldqa_zh", "lcc")]
    df = pd.concat(frames, ignore_index=True)
    df["prediction"] = [
        "Edward Ferrars",  # F1 1
        "Barton Cottage in Devonshire",  # [barton, cottage, in, devonshire] vs 2 tokens: F1 = 2/3
        "nothing",  # 0
        "City\nType: Country",  # first line only: 1
        "北京",  # 1
        "    return total\n",  # left-stripped as kvpress does: "return total" vs "    return total", ratio 0.86
    ]
    result = longbench.score(df)
    assert result["per_task"] == {
        "narrativeqa": pytest.approx(55.56),
        "multifieldqa_zh": 100.0,
        "trec": 100.0,
        "lcc": 86.0,
    }
    assert result["average"] == pytest.approx((55.56 + 286) / 4, abs=0.01)
    assert result["average_without_trec"] == pytest.approx((55.56 + 186) / 3, abs=0.01)


def test_hub_source_reads_the_official_zip(tmp_path, monkeypatch):
    """data.zip (a `data/<task>.jsonl` per subset) is extracted once, outside the Hub cache (which may be shared and
    read-only: nothing is written beside the archive), and the rows name the commit they were read from."""
    import zipfile

    import huggingface_hub

    archive = tmp_path / "snapshots" / "0123abcd" / "data.zip"
    archive.parent.mkdir(parents=True)
    with zipfile.ZipFile(archive, "w") as zf:
        zf.write(FIXTURES / "trec.jsonl", "data/trec.jsonl")
    monkeypatch.setenv("KVZAP_EXTRACT_DIR", str(tmp_path / "extracted"))
    calls = []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: calls.append((a, k)) or str(archive))
    for _ in range(2):
        df = longbench.load("hub", "trec", None, None, 0, revision="v1.0")
        assert df["answers"].tolist() == [["City"]]
        assert df.attrs["revision"] == "THUDM/LongBench@0123abcd"
    assert calls[0] == (("THUDM/LongBench", "data.zip"), {"repo_type": "dataset", "revision": "v1.0"})
    assert sorted(p.name for p in archive.parent.iterdir()) == ["data.zip"]
    (folder,) = (tmp_path / "extracted").iterdir()
    assert (folder / "data" / "trec.jsonl").is_file()
