"""Scores and prompts held against kvpress's own evaluation code (tests/kvpress_reference.py), which produced the
paper's numbers: every prediction of the bank (tests/scoring_bank.py) scores the same, and every row is cut into the
same (context, question, answer prefix), byte for byte. The departures a config may opt into are tested both ways."""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from kvpress_reference import SDIST, longbench_builder, module, ruler_builder
from kvzap.evaluation.metrics import aime_answered, aime_correct, extract_boxed, longbench_score, ruler_score
from kvzap.evaluation.suites import aime, catalog, longbench, ruler
from scoring_bank import CLASSIFICATION, aime_cases, longbench_cases, ruler_cases
from tiny_models import tiny_tokenizer

FIXTURES = Path(__file__).parent / "fixtures" / "longbench"
FIX = frozenset({"longbench_classification_fix"})


def test_the_bank_is_large_and_reaches_every_task():
    cases = ruler_cases() + longbench_cases() + aime_cases()
    assert len(cases) >= 1000
    assert {c.task for c in cases} == {*catalog.RULER_TASKS, *catalog.LONGBENCH_SUBSETS, "aime25"}
    text = "".join(c.prediction for c in cases)
    for edge in ("\n", "\r", "\t", "\x00", "\x07", "   ", "The ", "```", "# ", "//", "体育", "boxed{"):
        assert edge in text, edge


# ----------------------------------------------------------------------------------------------------- scoring


def _kvpress_ruler(case) -> float:
    frame = pd.DataFrame({"predicted_answer": [case.prediction], "answer": [list(case.references)], "task": case.task})
    return module("ruler.calculate_metrics").calculate_metrics(frame)[case.task]["string_match"]


def test_ruler_scores_equal_kvpress_on_every_prediction():
    differing = [
        (c.task, c.prediction, ours, theirs)
        for c in ruler_cases()
        if (ours := round(100 * ruler_score(c.task, c.prediction, list(c.references)), 2))
        != (theirs := _kvpress_ruler(c))
    ]
    assert differing == []


def _kvpress_longbench(case) -> float:
    scorer = module("longbench.calculate_metrics").scorer
    return scorer(case.task, [case.prediction], [list(case.references)], list(case.all_classes))


def _longbench_differences(departures=frozenset()) -> list[tuple]:
    out = []
    for c in longbench_cases():
        ours = round(
            100 * longbench_score(c.task, c.prediction, list(c.references), list(c.all_classes), departures), 2
        )
        theirs = _kvpress_longbench(c)
        if ours != theirs:
            out.append((c.task, c.prediction, c.references[0], ours, theirs))
    return out


def test_longbench_scores_equal_kvpress_on_every_prediction():
    assert _longbench_differences() == []


def test_classification_fix_departs_only_where_longbench_skips_a_name():
    """Opted in, the fix changes exactly the trec/lsht predictions naming a part of the reference before another
    class name (LongBench's loop then skips that next name), and only upwards."""
    differing = _longbench_differences(FIX)
    assert differing, "the bank must reach the loop's skip, or this departure is untested"
    for task, prediction, reference, ours, theirs in differing:
        assert task in ("trec", "lsht") and ours > theirs
        parts = [c for c in _classes(task) if c in prediction.lstrip().split("\n")[0] and c in reference]
        assert any(p != reference for p in parts), (prediction, reference)


def _classes(task: str) -> list[str]:
    return CLASSIFICATION[task][1]


def test_longbench_task_averages_equal_kvpress():
    cases = longbench_cases()
    frame = pd.DataFrame(
        {
            "task": [c.task for c in cases],
            "prediction": [c.prediction for c in cases],
            "answers": [list(c.references) for c in cases],
            "all_classes": [list(c.all_classes) for c in cases],
        }
    )
    ours = longbench.score(frame)["per_task"]
    calculate = module("longbench.calculate_metrics").calculate_metrics
    for task, rows in frame.groupby("task"):
        theirs = calculate(rows.rename(columns={"prediction": "predicted_answer"}))
        assert ours[task] == theirs, task  # to the last of the 2 decimals both round to


def test_aime_scores_equal_kvpress_on_every_prediction():
    score = module("aime25.calculate_metrics").score_aime
    differing = [
        (c.prediction, c.references[0])
        for c in aime_cases()
        if aime_correct(c.prediction, c.references[0]) != score(c.prediction, c.references[0])
    ]
    assert differing == []
    frame = pd.DataFrame(
        {
            "sample_id": [f"p{i % 7}" for i in range(len(aime_cases()))],
            "rollout": [i // 7 for i in range(len(aime_cases()))],
            "prediction": [c.prediction for c in aime_cases()],
            "answers": [[c.references[0]] for c in aime_cases()],
        }
    )
    theirs = module("aime25.calculate_metrics").calculate_metrics(
        frame.assign(predicted_answer=frame["prediction"], answer=[a[0] for a in frame["answers"]])
    )
    assert theirs["answered"] == sum(aime_answered(p) for p in frame["prediction"]) == aime.score(frame)["answered"]
    assert theirs["correct"] == sum(aime_correct(p, a[0]) for p, a in zip(frame["prediction"], frame["answers"]))


def test_the_papers_aime_script_agrees_wherever_a_box_closes():
    """kvpress's kvzap/evaluate_aime.py (the paper's Table 4 runs) reads `boxed{` up to the first `}` instead of
    matching braces: the two kvpress rules differ only on rollouts without a closed box (docs/methods.md)."""
    path = SDIST / "kvzap" / "evaluate_aime.py"
    spec = importlib.util.spec_from_file_location("kvpress_reference_evaluate_aime", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    differing = [
        c
        for c in aime_cases()
        if script.calculate_metrics(pd.DataFrame({"predicted_answer": [c.prediction], "answer": [c.references[0]]}))[
            "correct"
        ]
        != aime_correct(c.prediction, c.references[0])
    ]
    assert differing and all(extract_boxed(c.prediction) is None for c in differing)


# ----------------------------------------------------------------------------------------------------- prompts


def _edge_records(task: str) -> list[dict]:
    """Raw THUDM rows whose text reaches the cutting rules: braces, a 'Question:' inside the document, inputs with
    and without the answer cue, with spaces and newlines around it, empty, Chinese, code."""
    cue = {"trec": "Type:", "triviaqa": "Answer:", "samsum": "Summary:", "lsht": "类别："}.get(task, "")
    inputs = [
        "What is it?",
        f"Question: Who {{input}} wrote it ?\n{cue}",
        f"  Which one?  \n\n{cue}",
        f"{cue} at the start, not the end",
        f"ends with the cue without a newline{cue}",
        "",
        "新闻：国足昨晚两球战胜对手。\n类别：",
        "def f(x):\n    return {x: 1}\n",
    ]
    context = "Doc {context} with {braces}, a 'Question: not one' line,\nand 中文 text.\n\nAnswer: not the answer."
    return [
        {
            "input": text,
            "context": context + f" #{i}",
            "answers": [f"answer {i}"],
            "length": 42,
            "dataset": task,
            "language": "en",
            "all_classes": ["City", "Country"] if task in ("trec", "lsht") else None,
            "_id": f"{task}-{i}",
        }
        for i, text in enumerate(inputs)
    ]


def _record_groups() -> list[dict[str, list[dict]]]:
    """Raw rows per LongBench subset, in groups of one schema each (Arrow wants one type per column): the edge rows
    with the rehearsal's fixture rows, then the repository's fixture files (integer answers among them)."""
    from tests.rehearsal.hub_datasets import _essay_sentences, _longbench_record

    sentences = _essay_sentences()
    code = [line for line in Path(textwrap.__file__).read_text(encoding="utf-8").splitlines() if line.strip()]
    built = {
        task: _edge_records(task) + [_longbench_record(task, i, sentences, code) for i in range(2)]
        for task in catalog.LONGBENCH_SUBSETS
    }
    files = {
        path.stem: [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        for path in FIXTURES.glob("*.jsonl")
    }
    return [built, files]


@pytest.mark.parametrize("group", [0, 1], ids=["edges and rehearsal rows", "fixture files"])
def test_longbench_prompts_equal_kvpress_builder(group, monkeypatch):
    records = _record_groups()[group]
    built = longbench_builder(records, monkeypatch)
    assert set(built) == set(records)
    for task, raw in records.items():
        ours = pd.DataFrame([longbench.to_row(task, r) for r in raw])
        theirs = built[task]
        assert len(ours) == len(theirs) == len(raw)
        for column in ("context", "question", "answer_prefix", "max_new_tokens"):
            assert ours[column].tolist() == theirs[column].tolist(), (task, column)
        assert ours["answers"].tolist() == [[str(a) for a in answers] for answers in theirs["answers"]]


def test_the_prompt_bank_covers_every_subset():
    assert set(_record_groups()[0]) == set(catalog.LONGBENCH_SUBSETS)


def test_narrativeqa_keeps_the_official_typo():
    context, _, _ = longbench.split_prompt("narrativeqa", "STORY", "Q")
    assert context.count("asconcisely") == 2 and "as concisely" not in context


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def _write_ruler_outputs(folder: Path, rows: pd.DataFrame) -> None:
    """RULER's own output layout (what its prepare.py writes and kvpress's builder reads): one jsonl per task
    with the whole prompt as `input` and the answers as `outputs`."""
    for task, group in rows.groupby("task"):
        path = folder / task / "validation.jsonl"
        path.parent.mkdir(parents=True)
        lines = [
            json.dumps({"index": i, "input": r.context + r.question + r.answer_prefix, "outputs": list(r.answers)})
            for i, r in enumerate(group.itertuples())
        ]
        path.write_text("\n".join(lines) + "\n")


def test_ruler_generator_cuts_prompts_as_kvpress_builder(tokenizer, tmp_path):
    """The offline generator's rows for every offline task equal what kvpress's builder makes of their prompts."""
    ours = ruler.generate(tokenizer, list(catalog.RULER_OFFLINE_TASKS), 2048, n_samples=2, seed=3)
    _write_ruler_outputs(tmp_path / "4096", ours)
    theirs = ruler_builder(tmp_path / "4096")
    assert sorted(theirs["task"].unique()) == sorted(catalog.RULER_OFFLINE_TASKS)
    for task, group in ours.groupby("task"):
        expected = theirs[theirs["task"] == task].reset_index(drop=True)
        got = group.reset_index(drop=True)
        for column in ("context", "question", "answer_prefix", "max_new_tokens"):
            assert got[column].tolist() == expected[column].tolist(), (task, column)
        assert got["answers"].tolist() == [list(a) for a in expected["answer"]]


QA_PROMPT = (
    "Answer the question based on the given documents. Only give me the answer and do not output any other words."
    "\n\nThe following are given documents.\n\nDocument 1:\n{doc}\n\nAnswer the question based on the given "
    "documents. Only give me the answer and do not output any other words.\n\nQuestion: {question} Answer:"
)


def test_ruler_hub_rows_pass_through_unchanged(tokenizer, tmp_path):
    """kvpress's builder on RULER prompts of every task (qa in RULER's qa template, whose documents may themselves
    say 'Answer:'), saved as the Hub's parquet, reads back through the project's loader byte for byte."""
    qa = pd.DataFrame(
        [
            {
                "task": task,
                "context": QA_PROMPT.format(doc=doc, question=question),
                "question": "",
                "answer_prefix": "",
                "answers": answers,
            }
            for task, doc, question, answers in [
                ("qa_1", "Paris is the capital. Answer: not this.", "What is the capital?", ["Paris"]),
                ("qa_2", "Marie Curie won twice.", "Who won twice?", ["Marie Curie", "Curie"]),
            ]
        ]
    )
    generated = ruler.generate(tokenizer, list(catalog.RULER_OFFLINE_TASKS), 2048, n_samples=1, seed=5)
    _write_ruler_outputs(tmp_path / "raw" / "4096", pd.concat([generated, qa], ignore_index=True))
    built = ruler_builder(tmp_path / "raw" / "4096")
    (tmp_path / "hub" / "4096").mkdir(parents=True)
    built.to_parquet(tmp_path / "hub" / "4096" / "test-00000-of-00001.parquet", index=False)
    loaded = ruler.load(f"local:{tmp_path / 'hub'}", "4096", tokenizer)
    assert sorted(loaded["task"]) == sorted(catalog.RULER_TASKS)
    for column in ("context", "question", "answer_prefix", "max_new_tokens", "task"):
        assert loaded[column].tolist() == built[column].tolist(), column
    assert loaded["answers"].tolist() == [list(a) for a in built["answer"]]
    qa_row = loaded[loaded["task"] == "qa_1"].iloc[0]
    assert qa_row["question"].startswith("Answer the question based on") and qa_row["answer_prefix"] == "Answer:"
