"""What the real run needs before and around its jobs: archives extracted once and atomically by concurrent first
jobs, placeholders refused before publishing, and the dataset revision each cell read recorded in its provenance."""

import multiprocessing
import zipfile
from pathlib import Path

import pytest

from kvzap import publish
from kvzap.plan import checks, jobs
from kvzap.plan.errors import ConfigError
from kvzap.plan.sweep import EvalJob
from kvzap.prepare import archives
from kvzap.prepare.hub_files import snapshot_commit
from plan_helpers import BASE, planned

N_MEMBERS, MEMBER_BYTES = 40, 200_000


def _archive(path: Path) -> Path:
    """A zip whose extraction takes long enough for two processes to overlap."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for i in range(N_MEMBERS):
            zf.writestr(f"data/part{i:03d}.txt", bytes([i]) * MEMBER_BYTES)
    return path


def _extract_and_read(archive, root, start, results):
    start.wait()
    folder = archives.extracted(Path(archive), Path(root))
    sizes = [(folder / "data" / f"part{i:03d}.txt").stat().st_size for i in range(N_MEMBERS)]
    results.put((str(folder), sizes))


def test_two_processes_extracting_one_archive_both_read_it_whole(tmp_path):
    archive = _archive(tmp_path / "data.zip")
    context = multiprocessing.get_context("spawn")
    for attempt in range(3):
        root, start, results = tmp_path / f"root{attempt}", context.Event(), context.Queue()
        workers = [context.Process(target=_extract_and_read, args=(archive, root, start, results)) for _ in range(2)]
        for worker in workers:
            worker.start()
        start.set()
        outcomes = [results.get(timeout=120) for _ in workers]
        for worker in workers:
            worker.join(timeout=60)
            assert worker.exitcode == 0
        assert {folder for folder, _ in outcomes} == {str(archives.extracted(archive, root))}
        assert all(sizes == [MEMBER_BYTES] * N_MEMBERS for _, sizes in outcomes)
        assert [p.name for p in root.iterdir()] == [Path(outcomes[0][0]).name]  # no partial copy left behind


def test_extraction_writes_nothing_beside_the_archive(tmp_path, monkeypatch):
    """A shared Hub cache may be read-only: the folder goes under $KVZAP_EXTRACT_DIR, named by content."""
    (tmp_path / "hub").mkdir()
    archive = _archive(tmp_path / "hub" / "data.zip")
    monkeypatch.setenv("KVZAP_EXTRACT_DIR", str(tmp_path / "scratch"))
    folder = archives.extracted(archive)
    assert folder.parent == tmp_path / "scratch" and [p.name for p in archive.parent.iterdir()] == ["data.zip"]
    assert archives.extracted(archive) == folder


def test_snapshot_commit_reads_the_hub_cache_layout(tmp_path):
    path = tmp_path / "datasets--org--name" / "snapshots" / "abc123" / "4096" / "test.parquet"
    assert snapshot_commit(path) == "abc123"
    assert snapshot_commit(tmp_path / "local" / "file.parquet") is None


@pytest.mark.parametrize("key", ["namespace", "dataset_repo"])
def test_publish_placeholders_are_refused_by_name(key):
    settings = {"namespace": "me", "dataset_repo": "me/results"}
    settings[key] = "your-hf-namespace" if key == "namespace" else "your-hf-namespace/KVzap-results"
    with pytest.raises(ConfigError, match=f"publish.{key}.*placeholder"):
        checks.check_publish(settings)
    checks.check_publish({"namespace": "me", "dataset_repo": "me/results"})
    with pytest.raises(ConfigError, match="empty"):
        checks.check_publish({"namespace": "", "dataset_repo": None})


def test_publish_command_refuses_a_placeholder(tmp_path):
    with pytest.raises(SystemExit, match="placeholder"):
        publish.main(["--namespace", "your-hf-namespace", "--dry-run", "--out", str(tmp_path), "--surrogates", "x"])


def test_the_paper_config_publishes_nothing_until_its_namespace_is_set():
    import yaml

    paper = yaml.safe_load((Path(__file__).parents[1] / "config" / "paper.yaml").read_text())
    with pytest.raises(ConfigError, match="placeholder"):
        checks.check_publish(paper["publish"])


def test_evaluation_flags_carry_revision_policy_and_departures():
    config = planned(BASE)
    bench = next(iter(config["evaluation"]["benchmarks"]))
    config["evaluation"]["benchmarks"][bench]["revision"] = "v2.1"
    config["evaluation"]["long_samples"] = "truncate_middle"
    config["evaluation"]["departures"] = ["longbench_classification_fix"]
    model = next(iter(config["models"]))
    spec = jobs.evaluate_spec(config, EvalJob(model, bench, None, (("full", "none"),)), 0, 1)
    assert spec.revision == "v2.1" and spec.long_samples == "truncate_middle"
    assert spec.departures == ("longbench_classification_fix",)
