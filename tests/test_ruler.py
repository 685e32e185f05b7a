"""RULER: offline cwe / fwe follow RULER's recipes and fit the token budget; load and score follow the contract."""

import re
from collections import Counter

import pandas as pd
import pytest

from kvzap.evaluation.suites import catalog, ruler
from tiny_models import tiny_tokenizer

CONTEXT = 2048  # the byte-level test tokenizer spends ~2 tokens per short word


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def n_tokens(tokenizer, row):
    return len(
        tokenizer(row["context"] + row["question"] + row["answer_prefix"], add_special_tokens=False)["input_ids"]
    )


def test_task_lists():
    assert len(ruler.RULER_TASKS) == 13
    assert set(ruler.RULER_OFFLINE_TASKS) == set(ruler.RULER_TASKS) - {"qa_1", "qa_2"}
    assert tuple(ruler.NIAH_TASKS) == catalog.RULER_NIAH_TASKS  # the catalog names every needle task generated here


def test_cwe_answers_are_the_most_common_words(tokenizer):
    row = ruler.generate(tokenizer, ["cwe"], CONTEXT, n_samples=1).iloc[0]
    assert row["context"].count(ruler.CWE_QUESTION) == 1  # in the solved example; the real one follows
    listing = row["context"].rsplit("most often.\n", 1)[1]
    words = re.findall(r"\d+\. (\S+)", listing)
    counts = Counter(words)
    # Below 4k tokens RULER repeats the 10 common words 6 times and every other word once.
    assert {counts[w] for w in row["answers"]} == {6} and len(row["answers"]) == 10
    assert set(counts.values()) == {1, 6}
    assert re.findall(r"(\d+)\. ", listing) == [str(i + 1) for i in range(len(words))]
    assert row["max_new_tokens"] == 120
    assert CONTEXT - 120 - 64 <= n_tokens(tokenizer, row) <= CONTEXT - 120


def test_fwe_answers_are_ranks_two_to_four(tokenizer):
    row = ruler.generate(tokenizer, ["fwe"], CONTEXT, n_samples=1).iloc[0]
    text = row["context"].removeprefix(ruler.FWE_CONTEXT.split("{text}")[0]).strip()
    ranked = [w for w, _ in Counter(text.split()).most_common()]
    assert ranked[0] == "..." and ranked[1:4] == row["answers"]
    assert all(re.fullmatch(r"[a-z]{6}", w) for w in ranked[1:])
    assert row["question"].endswith("in the above coded text? ") and row["max_new_tokens"] == 50  # as the Hub cuts it
    assert n_tokens(tokenizer, row) <= CONTEXT - 50


def test_generation_is_deterministic(tokenizer):
    a = ruler.generate(tokenizer, ["cwe", "fwe"], CONTEXT, n_samples=2, seed=3)
    b = ruler.generate(tokenizer, ["cwe", "fwe"], CONTEXT, n_samples=2, seed=3)
    pd.testing.assert_frame_equal(a, b)
    assert a["context"].nunique() == 4


def test_word_tasks_refuse_a_budget_they_cannot_fit(tokenizer):
    with pytest.raises(ValueError, match="Cannot size"):
        ruler.generate(tokenizer, ["cwe"], 256, n_samples=1)


def test_generate_refuses_hub_only_tasks(tokenizer):
    with pytest.raises(ValueError, match="qa_1"):
        ruler.generate(tokenizer, ["qa_1"], 512, n_samples=1)


def test_offline_load_skips_qa_with_a_warning(tokenizer):
    with pytest.warns(UserWarning, match="qa_1.*SQuAD"):
        df = ruler.load("offline", "512", tokenizer, n_samples=1, seed=0, tasks=["vt", "qa_1", "qa_2"])
    assert df["task"].tolist() == ["vt"]
    assert set(df.columns) >= {"sample_id", "task", "context", "question", "answer_prefix", "answers", "max_new_tokens"}


def test_local_load_in_hub_layout(tmp_path):
    (tmp_path / "4096").mkdir()
    hub = pd.DataFrame(
        {
            "context": ["c"] * 5,
            "question": ["q"] * 5,
            "answer_prefix": ["a"] * 5,
            "answer": [["x"], ["y"], ["z"], ["u", "v"], ["w"]],
            "task": ["vt", "vt", "vt", "cwe", "cwe"],
            "max_new_tokens": [30, 30, 30, 120, 120],
        }
    )
    hub.to_parquet(tmp_path / "4096" / "test-00000.parquet")
    df = ruler.load(f"local:{tmp_path}", "4096", None, n_samples=2, seed=0)
    assert df.groupby("task").size().to_dict() == {"cwe": 2, "vt": 2}
    assert df.loc[df["sample_id"] == "cwe-0", "answers"].item() == ["u", "v"]
    # Ids are assigned before sampling: the same row keeps its id whatever is sampled.
    full = ruler.load(f"local:{tmp_path}", "4096", None, n_samples=None, seed=0)
    merged = df.merge(full, on="sample_id")
    assert (merged["answers_x"] == merged["answers_y"]).all()


def test_score():
    df = pd.DataFrame(
        {
            "task": ["niah_multivalue", "niah_multivalue", "qa_1"],
            "answers": [["1", "2"], ["3", "4"], ["Paris", "paris, france"]],
            "prediction": ["1 and 2", "3 only", "It is Paris."],
        }
    )
    # niah_multivalue: (1 + 0.5) / 2 = 75; qa_1 (any reference): 100; mean over tasks 87.5.
    scored = ruler.score(df)
    assert {k: scored[k] for k in ("per_task", "average")} == {
        "per_task": {"niah_multivalue": 75.0, "qa_1": 100.0},
        "average": 87.5,
    }
    # qa_1: one success out of one, Wilson's interval; niah_multivalue: partial credit, bootstrap over 2 samples
    assert scored["per_task_ci"]["qa_1"] == [20.65, 100.0]
    assert scored["per_task_ci"]["niah_multivalue"] == [50.0, 100.0]
    assert scored["average_ci"] == [75.0, 100.0]
