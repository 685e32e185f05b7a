"""`snakemake prefetch` downloads everything a config reads from the Hub, at the revisions it pins, and the run then
reads all of it offline through the pipeline's own loaders.

The Hub is tests/fake_hub.py serving a small Hub cache written with tests/rehearsal/hub_cache.py: a Llama-3.1 model
(two commits, the config pinning the older), RULER (a tag v1 and a newer main), LongBench, AIME25, the Nemotron
sample, the Q-Filters repo, kmfoda/booksum, and DuoAttention's pattern under /raw/ (GitHub's stand-in). Prefetch
runs in a child process (huggingface_hub reads HF_ENDPOINT when imported) into empty caches; the read-back runs in
another with HF_HUB_OFFLINE=1, and the fake Hub must see no request from it.
"""

from __future__ import annotations

import copy
import io
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml
from huggingface_hub import constants
from tests.rehearsal import hub_datasets, hub_models
from tests.rehearsal.hub_cache import write_repo

from fake_hub import FakeHub, client_env
from kvzap.evaluation import duo_patterns
from kvzap.evaluation.suites import aime, longbench, ruler
from kvzap.plan import hub_assets, model_configs, overlays, sweep
from kvzap.prepare.prefetch import MODEL_FILES, Fetch, HubRefusal, prefetch
from kvzap.training.corpus import NEMOTRON, NEMOTRON_SUBSETS
from plan_helpers import BASE, ROOT, config_files, planned

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_CONFIG = hub_models.MODELS[LLAMA][0]
QFILTERS = "nthngdy/Llama-3.1-8B-Instruct_qfilt"
DUO_FOLDER = duo_patterns.duo_pattern_name(LLAMA)


def _parquet(df: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    df.to_parquet(buffer, index=False)
    return buffer.getvalue()


def _ruler_rows(marker: str) -> bytes:
    return _parquet(
        pd.DataFrame(
            {
                "context": [f"{marker} context one", f"{marker} context two"],
                "question": ["What is the number?", "Which variables?"],
                "answer_prefix": ["Answer:", "Answer:"],
                "answer": [["7"], ["X1", "X2"]],
                "task": ["niah_single_1", "vt"],
                "max_new_tokens": [8, 16],
            }
        )
    )


def _qfilter_files() -> dict[str, bytes]:
    from kvpress.presses.qfilter_press import QFilters

    with tempfile.TemporaryDirectory() as folder:
        QFilters(2, 2, 128).save_pretrained(folder)
        return {p.name: p.read_bytes() for p in Path(folder).iterdir() if p.is_file()}


def _model_files(marker: str) -> dict[str, bytes]:
    config = {**LLAMA_CONFIG, "kvzap_test_commit": marker}
    return {
        "config.json": json.dumps(config).encode(),
        "tokenizer_config.json": b"{}",
        "model.safetensors": marker.encode() * 16,
        "README.md": b"not a model file",
        "original/consolidated.00.pth": b"not fetched",
    }


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The source Hub cache and the commits the config's revisions name."""
    cache = tmp_path_factory.mktemp("served")
    commits = {"model": write_repo(cache, LLAMA, _model_files("old"), revision="old").name}
    write_repo(cache, LLAMA, _model_files("new"))
    commits["ruler"] = write_repo(cache, ruler.HUB_DATASET, _ruler_files("v1"), "dataset", revision="v1").name
    write_repo(cache, ruler.HUB_DATASET, _ruler_files("main"), "dataset")
    commits["longbench"] = write_repo(
        cache, longbench.HUB_DATASET, {"data.zip": hub_datasets.longbench_zip(1), "README.md": b"x"}, "dataset"
    ).name
    commits["aime"] = write_repo(
        cache, aime.HUB_DATASET, {"data/test-00000-of-00001.parquet": hub_datasets.aime_parquet()}, "dataset"
    ).name
    texts = pd.DataFrame({"id": ["a", "b", "c"], "text": [" ".join(["word"] * n) for n in (5, 8, 200)]})
    nemotron = {f"{subset}/part_000000.parquet": _parquet(texts) for subset in NEMOTRON_SUBSETS}
    commits["nemotron"] = write_repo(cache, NEMOTRON, nemotron, "dataset").name
    commits["qfilter"] = write_repo(cache, QFILTERS, _qfilter_files()).name
    commits["booksum"] = write_repo(cache, "kmfoda/booksum", {"train.csv": hub_datasets.booksum_csv()}, "dataset").name
    raw = tmp_path_factory.mktemp("raw")
    (raw / DUO_FOLDER).mkdir(parents=True)
    (raw / DUO_FOLDER / "config.json").write_text(json.dumps({"sink_size": 64, "recent_size": 256}))
    (raw / DUO_FOLDER / "full_attention_heads.tsv").write_text("0.1\t0.9\n0.5\t0.2\n")
    return cache, raw, commits


def _ruler_files(marker: str) -> dict[str, bytes]:
    return {f"{n}/test-00000-of-00001.parquet": _ruler_rows(f"{marker} {n}") for n in (4096, 16384)}


def prefetch_config(commit: str) -> dict:
    """A small config reading every kind of Hub asset: the model pinned to `commit`, RULER to the tag v1."""
    config = copy.deepcopy(BASE)
    config["results"] = "results/prefetch-test"
    config["models"] = {"llama": {"id": LLAMA, "revision": commit, "dtype": "float32", "thresholds": [-6]}}
    config["oracle"].update(corpus=NEMOTRON, min_tokens=3, max_tokens=50)
    config["evaluation"] = {
        "methods": ["full", "qfilter", "duo_attention", "duo_attention_on_the_fly"],
        "ratios": [0.5],
        "benchmarks": {
            "ruler-4k": {"benchmark": "ruler", "source": "hub", "subsets": ["4096"], "revision": "v1"},
            "longbench": {"benchmark": "longbench", "source": "hub", "subsets": ["lcc"]},
            "aime25": {"benchmark": "aime25", "source": "hub", "subsets": ["aime25"], "methods": ["full"]},
        },
    }
    config.pop("tables")
    config["figures"] = {}
    return config


READ_BACK = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from datasets import load_dataset
    from kvpress.presses.qfilter_press import QFilterPress
    from kvzap.evaluation import duo_patterns
    from kvzap.evaluation.suites import aime, longbench, ruler
    from kvzap.plan.model_configs import model_config
    from kvzap.prepare.models import prepare
    from kvzap.training import corpus

    llama, commit, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])

    class Words:  # a tokenizer counting words, for the oracle's token window
        encode = staticmethod(str.split)

    record = prepare(llama, out, revision=commit)
    selected = corpus.select(corpus.NEMOTRON, Words(), 3, 50, n_test=1, n_train=1)
    lb, am = longbench.load("hub", "lcc"), aime.load("hub")
    print(json.dumps({
        "model": [record["revision"], sorted(p.relative_to(record["path"]).as_posix()
                                             for p in Path(record["path"]).rglob("*") if p.is_file())],
        "model_config": model_config(llama, commit)["kvzap_test_commit"],
        "ruler": [ruler.load("hub", "4096", None, revision="v1").attrs["revision"],
                  ruler.load("hub", "4096", None, revision="v1")["context"].tolist()],
        "longbench": [lb.attrs["revision"], len(lb)],
        "aime": [am.attrs["revision"], len(am)],
        "nemotron": [corpus.read_revision(corpus.NEMOTRON), len(selected["test"]), len(selected["train"])],
        "qfilter": list(QFilterPress.load_q_filters("Llama-3.1-8B-Instruct").shape),
        "booksum": len(load_dataset("kmfoda/booksum", split="train")),
        "duo": [list(duo_patterns.read_pattern(llama)[:2]), duo_patterns.read_pattern(llama)[2].tolist()],
    }))
""")


def test_prefetch_then_offline_run_reads_it_all(served, tmp_path):
    cache, raw, commits = served
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(prefetch_config(commits["model"])))
    (tmp_path / "work").mkdir()
    with FakeHub(cache, raw=raw) as hub:
        path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
        env = client_env(hub.url, tmp_path, PATH=path, KVZAP_DUO_PATTERNS=f"{hub.url}/raw")
        command = ["snakemake", "-s", str(ROOT / "workflow" / "Snakefile"), "-d", str(tmp_path / "work")]
        result = subprocess.run(
            [*command, "prefetch", "--cores", "1", "--configfile", str(config)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        table = result.stdout
        for repo in (LLAMA, ruler.HUB_DATASET, longbench.HUB_DATASET, aime.HUB_DATASET, NEMOTRON, QFILTERS):
            assert f"| {repo} " in table, table
        for name in ("model", "ruler", "longbench", "aime", "nemotron", "qfilter"):
            assert commits[name] in table, (name, table)

        hub_cache = tmp_path / "hub"
        model = hub_cache / f"models--{LLAMA.replace('/', '--')}" / "snapshots" / commits["model"]
        assert sorted(p.name for p in model.rglob("*") if p.is_file()) == [
            "config.json",
            "model.safetensors",
            "tokenizer_config.json",
        ]  # MODEL_FILES of the pinned commit: no README, nothing under original/
        assert not (hub_cache / f"models--{LLAMA.replace('/', '--')}" / "refs" / "main").exists()
        rulers = hub_cache / "datasets--simonjegou--ruler"
        assert (rulers / "refs" / "v1").read_text() == commits["ruler"]
        assert [p.parent.name for p in (rulers / "snapshots").rglob("*.parquet")] == ["4096"]  # the subset asked
        mirror = hub_cache / "duo-attention-patterns" / DUO_FOLDER
        for name in duo_patterns.FILES:
            assert (mirror / name).read_bytes() == (raw / DUO_FOLDER / name).read_bytes()
        assert (tmp_path / "datasets" / "kmfoda___booksum").is_dir()

        asked = len(hub.requests)
        offline = client_env(
            hub.url,
            tmp_path,
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            KVZAP_DUO_PATTERNS=str(hub_cache / "duo-attention-patterns"),
        )
        read = subprocess.run(
            [sys.executable, "-c", READ_BACK, LLAMA, commits["model"], str(tmp_path / "prepared")],
            env=offline,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert read.returncode == 0, read.stderr[-3000:]
        assert len(hub.requests) == asked, hub.requests[asked:]  # the offline run asked the Hub nothing
    got = json.loads(read.stdout.strip().splitlines()[-1])
    assert got["model"] == [commits["model"], ["config.json", "model.safetensors", "tokenizer_config.json"]]
    assert got["model_config"] == "old"
    assert got["ruler"] == [f"{ruler.HUB_DATASET}@{commits['ruler']}", ["v1 4096 context one", "v1 4096 context two"]]
    assert got["longbench"] == [f"{longbench.HUB_DATASET}@{commits['longbench']}", 1]
    assert got["aime"] == [f"{aime.HUB_DATASET}@{commits['aime']}", len(hub_datasets.AIME_PROBLEMS)]
    assert got["nemotron"] == [f"{NEMOTRON}@{commits['nemotron']}", len(NEMOTRON_SUBSETS), len(NEMOTRON_SUBSETS)]
    assert got["qfilter"] == [2, 2, 128]
    assert got["booksum"] == 64
    assert got["duo"] == [[64, 256], [[0.1, 0.9], [0.5, 0.2]]]


def test_prefetch_refuses_offline_mode(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubRefusal, match=r"HF_HUB_OFFLINE=1 forbids it\. Fix: run prefetch where the Hub is reachable"):
        prefetch([Fetch("snapshot", LLAMA, patterns=MODEL_FILES)], tmp_path)
    assert prefetch([], tmp_path) == []  # nothing to download: nothing to refuse


def test_paper_config_fetches_every_hub_asset_it_reads(offline_plan):
    """The paper config: its three models, every Hub dataset, and the assets of the Hub methods, once each."""
    config = planned_offline(config_files("paper.yaml"))
    items = {(f.kind, f.repo): f for f in hub_assets.fetches(config)}
    models = {m["id"] for m in config["models"].values()}
    assert {r for k, r in items if k == "snapshot" and not r.startswith("nthngdy/")} == models
    assert all(items["snapshot", m].patterns == MODEL_FILES for m in models)
    assert items["dataset", ruler.HUB_DATASET].patterns == ("4096/*test*.parquet", "16384/*test*.parquet")
    assert items["file", longbench.HUB_DATASET].patterns == ("data.zip",)
    assert items["dataset", aime.HUB_DATASET].patterns == (aime.HUB_TEST_FILES,)
    assert items["dataset", NEMOTRON].patterns == tuple(f"{s}/*.parquet" for s in NEMOTRON_SUBSETS)
    # Q-Filters for the two models that evaluate qfilter (Qwen3-32B skips it), DuoAttention's Llama pattern
    assert {r for k, r in items if r.startswith("nthngdy/")} == {
        "nthngdy/Qwen3-8B_qfilt",
        "nthngdy/Llama-3.1-8B-Instruct_qfilt",
    }
    assert items["mirror", DUO_FOLDER].patterns == duo_patterns.FILES
    assert ("datasets-cache", hub_assets.BOOKSUM) in items
    assert len(items) == len(hub_assets.fetches(config))  # one item per repository


@pytest.fixture
def offline_plan(monkeypatch):
    """Plan without asking the Hub for model configs (on a networked machine without a token, the gated
    Llama-3.1 would be refused: that is tests/test_gated.py's subject, not this module's)."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    model_configs.model_config.cache_clear()
    yield
    model_configs.model_config.cache_clear()


def planned_offline(files) -> dict:
    """The merged, checked config (run under offline_plan)."""
    return planned(overlays.load(files))


def test_method_assets_cover_every_hub_method():
    """Each method that loads Hub assets at run time has its fetch: a new one cannot be forgotten silently."""
    from kvzap.evaluation import methods

    needs_hub = sorted(name for name, info in methods.METHODS.items() if info.needs_hub)
    assert needs_hub and all(hub_assets.method_fetches(LLAMA, name) for name in needs_hub), needs_hub
    assert not hub_assets.method_fetches(LLAMA, "kvzap_mlp")


def test_pairs_agree_with_the_sweep(offline_plan):
    """Method assets are fetched for exactly the (model, method) pairs the sweep evaluates."""
    config = planned_offline(config_files("paper.yaml"))
    pairs = {(c.model, c.method) for c in sweep.cells(config)}
    qwen3_32b = [p for p in pairs if p[0] == "qwen3-32b"]
    assert ("qwen3-32b", "qfilter") not in pairs and qwen3_32b  # the paper config skips it for 32B
    fetched = {r for f in hub_assets.fetches(config) for r in f.needed_by if r.endswith(")")}
    ids = {name: model["id"] for name, model in config["models"].items()}
    expected = {f"{method} ({model})" for model, method in pairs if hub_assets.method_fetches(ids[model], method)}
    assert fetched == expected and "qfilter (qwen3-8b)" in expected


def test_qfilter_repo_is_the_one_kvpress_loads(monkeypatch):
    from kvpress.presses import qfilter_press

    asked = []
    monkeypatch.setattr(qfilter_press.QFilters, "from_pretrained", lambda repo: asked.append(repo) or None)
    for model_id in ("meta-llama/Meta-Llama-3.1-8B-Instruct", "Qwen/Qwen3-8B", "meta-llama/Meta-Llama-3.1-405B"):
        qfilter_press.QFilterPress.load_q_filters.cache_clear()
        with pytest.raises(AttributeError):  # None.q_filters: the repo name was asked first
            qfilter_press.QFilterPress.load_q_filters(model_id.split("/")[-1])
        assert asked[-1] == hub_assets.qfilter_repo(model_id)


def test_booksum_is_what_kvpress_loads():
    """kvpress's on-the-fly DuoAttention loads this dataset and split; the datasets cache must hold it offline."""
    from kvpress.presses import duo_attention_press

    source = Path(duo_attention_press.__file__).read_text()
    assert f'load_dataset("{hub_assets.BOOKSUM}", split="{hub_assets.BOOKSUM_SPLIT}")' in source
