"""The Hub loaders read the rehearsal's fake Hub cache offline, and return exactly the rows stored there.

huggingface_hub reads HF_HUB_CACHE / HF_HUB_OFFLINE when it is imported, so the fixtures are written and the
loaders run in one child process with those set; the expectations are computed here from the stored files.
"""

import json
import os
import pickle
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pandas as pd
import pytest
from tests.rehearsal import hub_datasets
from transformers import AutoTokenizer

import kvzap
from kvzap.evaluation.suites import aime, longbench, ruler
from kvzap.training.corpus import NEMOTRON, NEMOTRON_SUBSETS

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(kvzap.__file__).resolve().parents[1]  # the kvzap this session imports (a worktree's src first)
QWEN3 = ROOT / ".cache" / "tokenizers" / "qwen3"
LENGTHS = (4096, 16384)
WINDOW = (100, 200)
N_TEST, N_TRAIN = 1, 3
CJK = re.compile(r"[\u4e00-\u9fff]")

CHILD = textwrap.dedent("""
    import pickle, sys
    from pathlib import Path
    from datasets import load_dataset
    from transformers import AutoTokenizer
    from kvzap.training import corpus
    from kvzap.evaluation.suites import aime, longbench, ruler
    from tests.rehearsal import hub_datasets

    cache, datasets_cache, qwen3, out = map(Path, sys.argv[1:5])
    tokenizer = AutoTokenizer.from_pretrained(qwen3)
    snapshots = hub_datasets.build(cache, tokenizer, min_tokens={lo}, max_tokens={hi}, datasets_cache=datasets_cache)
    try:
        ruler.load("hub", "8192", None)
        missing = None
    except FileNotFoundError as error:
        missing = str(error)
    results = {{
        "snapshots": snapshots, "missing_length": missing,
        "ruler": {{n: ruler.load("hub", str(n), None) for n in {lengths}}},
        "ruler_sampled": ruler.load("hub", "4096", None, n_samples=1, seed=0, tasks=["qa_1", "vt"]),
        "longbench": {{t: longbench.load("hub", t) for t in longbench.LONGBENCH_SUBSETS}},
        "aime": aime.load("hub"),
        "booksum": load_dataset("kmfoda/booksum", split="train").to_pandas(),  # as kvpress's DuoAttention loads it
        "nemotron": corpus.select(corpus.NEMOTRON, tokenizer, {lo}, {hi}, n_test={n_test}, n_train={n_train}),
    }}
    out.write_bytes(pickle.dumps(results))
""").format(lo=WINDOW[0], hi=WINDOW[1], lengths=LENGTHS, n_test=N_TEST, n_train=N_TRAIN)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(QWEN3)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """Build the fixtures into a fresh Hub cache and run every Hub loader on it, offline, in a child process."""
    tmp = tmp_path_factory.mktemp("hub")
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(tmp / "cache"),
        "HF_DATASETS_CACHE": str(tmp / "datasets"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": str(tmp / "home"),
        "PYTHONPATH": os.pathsep.join([str(SRC), str(ROOT)]),
    }
    subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp / "cache"), str(tmp / "datasets"), str(QWEN3), str(tmp / "out.pkl")],
        env=env,
        check=True,
        timeout=300,
    )
    return pickle.loads((tmp / "out.pkl").read_bytes())


def test_ruler_hub_rows_are_the_stored_rows(hub, tokenizer):
    for n in LENGTHS:
        stored = pd.read_parquet(hub["snapshots"][ruler.HUB_DATASET] / str(n) / "test-00000-of-00001.parquet")
        df = hub["ruler"][n]
        assert sorted(df["task"]) == sorted(ruler.RULER_TASKS) and len(df) == 13
        assert df["context"].tolist() == stored["context"].tolist()
        assert df["answers"].tolist() == [list(a) for a in stored["answer"]]
        assert df["sample_id"].tolist() == [f"{t}-0" for t in stored["task"]]
        for row in df.itertuples():
            # Every answer is in the context (needles, variable names, qa titles), except the counted word tasks.
            if row.task not in ("cwe", "fwe"):
                assert all(a in row.context for a in row.answers), row.task
            size = len(tokenizer(row.context + row.question + row.answer_prefix, add_special_tokens=False)["input_ids"])
            assert 0.75 * n <= size <= n, (row.task, n, size)
    sampled = hub["ruler_sampled"]
    assert sorted(sampled["task"]) == ["qa_1", "vt"] and sampled["sample_id"].tolist() == ["vt-0", "qa_1-0"]


def test_ruler_hub_names_a_missing_length(hub):
    assert "'8192/*test*.parquet'" in hub["missing_length"] and ruler.HUB_DATASET in hub["missing_length"]


def test_longbench_hub_reads_all_21_subsets_from_data_zip(hub):
    with zipfile.ZipFile(hub["snapshots"][longbench.HUB_DATASET] / "data.zip") as zf:
        stored = {
            t: [json.loads(line) for line in zf.read(f"data/{t}.jsonl").decode().splitlines()]
            for t in longbench.LONGBENCH_SUBSETS
        }
    assert set(hub["longbench"]) == set(longbench.LONGBENCH_SUBSETS)
    for task, df in hub["longbench"].items():
        records = stored[task]
        assert len(df) == len(records) == 2
        assert set(records[0]) == {"input", "context", "answers", "length", "dataset", "language", "all_classes", "_id"}
        for row, record in zip(df.itertuples(), records):
            # cut as kvpress cuts (tests/test_kvpress_reference.py holds split_prompt against kvpress's builder)
            cut = longbench.split_prompt(task, record["context"], record["input"])
            assert (row.context, row.question, row.answer_prefix) == cut
            assert row.answers == record["answers"] and row.sample_id == f"{task}-{record['_id']}"
            assert record["dataset"] == task
            if record["language"] == "zh":
                assert CJK.search(record["context"]) and CJK.search(row.answers[0])
        if task in ("trec", "lsht"):
            assert all(a in row.all_classes for row in df.itertuples() for a in row.answers)
    assert {r["language"] for rs in stored.values() for r in rs} == {"en", "zh", "python"}


def test_aime_hub_rows(hub):
    df = hub["aime"]
    assert df["answers"].tolist() == [[str(a)] for _, a in hub_datasets.AIME_PROBLEMS]
    assert df["question"].tolist() == [q for q, _ in hub_datasets.AIME_PROBLEMS]
    assert df["sample_id"].tolist() == ["aime25-0", "aime25-1", "aime25-2"]
    assert (df["max_new_tokens"] == aime.GENERATION["max_new_tokens"]).all()


def test_nemotron_select_reads_every_subset_untouched(hub, tokenizer):
    split = hub["nemotron"]
    snapshot = hub["snapshots"][NEMOTRON]
    expected_test, expected_train = [], []
    for subset in NEMOTRON_SUBSETS:
        (path,) = (snapshot / subset).glob("*.parquet")
        texts = pd.read_parquet(path)["text"].tolist()
        inside = [t for t in texts if WINDOW[0] < len(tokenizer.encode(t)) < WINDOW[1]]
        assert len(inside) < len(texts)  # the fixture also holds texts the window rejects
        expected_test += [(subset, i, t) for i, t in enumerate(inside[:N_TEST])]
        expected_train += [(subset, i + N_TEST, t) for i, t in enumerate(inside[N_TEST : N_TEST + N_TRAIN])]

    # The splits interleave the subsets (round i holds every subset's i-th prompt), so any prefix is diverse.
    def interleaved(items):
        return sorted(items, key=lambda item: (item[1], NEMOTRON_SUBSETS.index(item[0])))

    assert [(p.subset, p.index, p.text) for p in split["test"]] == interleaved(expected_test)
    assert [(p.subset, p.index, p.text) for p in split["train"]] == interleaved(expected_train)
    texts = [p.text for p in split["test"] + split["train"]]
    assert {p.subset for p in split["train"]} == set(NEMOTRON_SUBSETS)
    assert any(t != t.strip() for t in texts) and any(t.startswith("\n\n  ") for t in texts)
    assert all(not t.isascii() for t in texts)
    assert any(CJK.search(t) for t in texts)


def test_booksum_loads_offline_as_kvpress_loads_it(hub):
    df = hub["booksum"]
    stored = pd.read_csv(hub["snapshots"][hub_datasets.BOOKSUM] / "train.csv")
    assert df["chapter"].tolist() == stored["chapter"].tolist() and list(df.columns) == list(stored.columns)
    # kvpress's duo_attention_on_the_fly samples 50 rows of the train split and reads `chapter`.
    chapters = df.sample(50, random_state=42)["chapter"]
    assert chapters.str.len().min() >= 300 and chapters.is_unique


def test_fixtures_are_deterministic(tokenizer):
    assert hub_datasets.longbench_zip() == hub_datasets.longbench_zip()
    assert hub_datasets.booksum_csv() == hub_datasets.booksum_csv()
    assert hub_datasets.aime_parquet() == hub_datasets.aime_parquet()
    assert hub_datasets.nemotron_files(tokenizer, *WINDOW) == hub_datasets.nemotron_files(tokenizer, *WINDOW)


def test_dataset_files_filters_like_allow_patterns_and_sorts(tmp_path, monkeypatch):
    import huggingface_hub

    from kvzap.prepare.hub_files import dataset_files

    for name in (
        "4096/test-00001-of-00002.parquet",
        "4096/test-00000-of-00002.parquet",
        "4096/train-0.parquet",
        "16384/test-0.parquet",
        "README.md",
    ):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    calls = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: calls.append((a, k)) or str(tmp_path))
    files = dataset_files("org/repo", "4096/*test*.parquet", revision="abc")
    assert [f.relative_to(tmp_path).as_posix() for f in files] == [
        "4096/test-00000-of-00002.parquet",
        "4096/test-00001-of-00002.parquet",
    ]
    assert calls == [
        (("org/repo",), {"repo_type": "dataset", "allow_patterns": ["4096/*test*.parquet"], "revision": "abc"})
    ]
    with pytest.raises(FileNotFoundError, match=r"'8192/\*\.parquet'.*org/repo"):
        dataset_files("org/repo", "8192/*.parquet")


def test_nemotron_texts_stream_file_by_file_in_order(tmp_path, monkeypatch):
    from kvzap.training import corpus

    texts = [" lead", "trail\n", "naïve ✓", "数学", "\tboth\t"]
    paths = [tmp_path / "part_0.parquet", tmp_path / "part_1.parquet"]
    pd.DataFrame({"id": ["a", "b", "c"], "text": texts[:3]}).to_parquet(paths[0])
    pd.DataFrame({"id": ["d", "e"], "text": texts[3:]}).to_parquet(paths[1])
    asked = []
    monkeypatch.setattr(
        corpus, "dataset_files", lambda repo, pattern, revision: asked.append((repo, pattern, revision)) or paths
    )
    stream = corpus._hub_texts("Nemotron-SFT-Code", batch_rows=2)
    assert asked == []  # nothing is fetched before the stream is read
    assert list(stream) == texts
    assert asked == [(NEMOTRON, "Nemotron-SFT-Code/*.parquet", None)]
