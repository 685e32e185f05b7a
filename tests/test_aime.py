"""AIME25: the loader on a fixture in the Hub's columns and on a cut of llama.cpp's results file, and scoring."""

import json
from pathlib import Path

import pandas as pd
import pytest

from kvzap.evaluation.suites import aime

FIXTURES = Path(__file__).parent / "fixtures" / "aime25"


def test_generation_protocol():
    assert aime.GENERATION == dict(
        do_sample=True,
        temperature=0.6,
        top_p=0.95,
        top_k=20,
        n_rollouts=4,
        max_new_tokens=32000,
        enable_thinking=True,
        decoding_compression=True,
    )


def test_load_hub_schema_fixture():
    df = aime.load(f"local:{FIXTURES}", "aime25", tokenizer=None, n_samples=None, seed=0)
    assert df["sample_id"].tolist() == ["aime25-0", "aime25-1", "aime25-2"]
    assert df["answers"].tolist() == [["70"], ["117"], ["2"]]  # integers in the file, strings here
    assert df["question"][0].startswith("Find the sum of all integer bases")
    assert (df["context"] == "").all() and (df["answer_prefix"] == "").all()
    assert (df["max_new_tokens"] == 32000).all() and (df["task"] == "aime25").all()
    assert len(aime.load(f"local:{FIXTURES}", "aime25", None, n_samples=2, seed=0)) == 2


def test_offline_reads_llamacpp_results(monkeypatch):
    monkeypatch.setenv(aime.ENV_JSON, str(FIXTURES / "llamacpp_allresults.json"))
    df = aime.load("offline", "aime25", None, None, 0)
    hub = aime.load(f"local:{FIXTURES}", "aime25", None, None, 0)
    # 4 conversations over 2 distinct problems; the boxing instruction is stripped to match the Hub rows.
    assert df["question"].tolist() == hub["question"][:2].tolist()
    assert df["answers"].tolist() == [["70"], ["117"]]


def test_offline_conflicting_answers_raise():
    results = json.loads((FIXTURES / "llamacpp_allresults.json").read_text())
    results["htmls"][2] = results["htmls"][2].replace("70", "71")
    with pytest.raises(ValueError, match="Conflicting"):
        aime.parse_llamacpp_results(results)


def test_offline_missing_file_says_how_to_fetch(monkeypatch, tmp_path):
    monkeypatch.setenv(aime.ENV_JSON, str(tmp_path / "absent.json"))
    with pytest.raises(FileNotFoundError, match="kvzap.evaluation.suites.aime fetch"):
        aime.load("offline", "aime25", None, None, 0)


@pytest.mark.skipif(
    not aime.offline_json_path().exists() or aime.ENV_JSON in __import__("os").environ,
    reason="the real llama.cpp AIME file is not cached here",
)
def test_real_offline_file_has_the_30_problems():
    df = aime.load("offline", "aime25", None, None, 0)
    assert len(df) == 30 and df["sample_id"].is_unique
    assert sorted(int(a[0]) for a in df["answers"])[:3] == [16, 19, 49]
    assert not df["question"].str.contains("boxed").any()


def test_score_pass_at_1_and_4():
    rows = []
    for sample_id, answer, boxes in [("p0", "70", ["70", "3", "70", None]), ("p1", "117", ["1", "2", None, None])]:
        for rollout, box in enumerate(boxes):
            text = "thinking..." if box is None else rf"so \boxed{{{box}}}"
            rows.append(
                {"sample_id": sample_id, "task": "aime25", "answers": [answer], "prediction": text, "rollout": rollout}
            )
    result = aime.score(pd.DataFrame(rows))
    # p0: 2/4 correct, p1: 0/4. pass@1 = (0.5 + 0) / 2 = 25 %, pass@4 = (1 + 0) / 2 = 50 %.
    assert result["pass@1"] == 25.0 and result["average"] == 25.0 and result["per_task"] == {"aime25": 25.0}
    assert result["pass@4"] == 50.0
    assert result["answered"] == 5
    assert result["correct_by_rollout"] == {0: 1, 1: 0, 2: 1, 3: 0}
    assert result["n_problems"] == 2 and result["n_rollouts"] == 4
    assert aime.score(pd.DataFrame(rows[:1] + rows[4:5]))["pass@4"] is None  # one rollout: no pass@4

    # the same rollouts as surrogate seed 1, and seed 2 answering p1 right every time: each seed's rollouts stay
    # apart (pass@4 is per seed), then the seeds' mean per problem: pass@1 (25 + 75) / 2, pass@4 (50 + 100) / 2
    seed2 = [{**r, "prediction": r"\boxed{117}"} if r["sample_id"] == "p1" else dict(r) for r in rows]
    seeded = pd.DataFrame([{**r, "seed": 1} for r in rows] + [{**r, "seed": 2} for r in seed2])
    result = aime.score(seeded)
    assert (result["pass@1"], result["pass@4"], result["n_problems"]) == (50.0, 75.0, 2)
    assert result["correct_by_rollout"] == {0: 1.5, 1: 0.5, 2: 1.5, 3: 0.5} and result["answered"] == 6.0
