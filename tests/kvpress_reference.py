"""kvpress's own evaluation code, run as the reference: the scorers and dataset builders behind the paper's numbers.

`make setup-test` unpacks the `evaluation/` and `kvzap/` folders of the kvpress sdist (the version installed) into
.cache/kvpress-sdist. Their modules are imported from there under a private package name, unchanged; the builders,
which download from and push to the Hub at import, run with `datasets.load_dataset` serving given raw rows and
`Dataset.push_to_hub` catching what they would push.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import sys
from pathlib import Path

import pandas as pd

SDIST = Path(__file__).resolve().parents[1] / ".cache" / "kvpress-sdist"
PACKAGE = "kvpress_reference_benchmarks"


def _benchmarks_dir() -> Path:
    folder = SDIST / "evaluation" / "benchmarks"
    if not (SDIST / ".fetched").exists() or not folder.is_dir():
        raise FileNotFoundError(
            f"kvpress's evaluation code is missing from {SDIST}: run `make setup-test` (it downloads the sdist of "
            f"kvpress=={importlib.metadata.version('kvpress')} from PyPI)."
        )
    return folder


def private_package(package: str, folder) -> None:
    """A folder of the sdist importable, unchanged, as the package `package` (once; `folder` is called for its path
    only then, so a missing folder is reported by whoever asks first)."""
    if package in sys.modules:
        return
    path = folder()
    spec = importlib.util.spec_from_file_location(package, path / "__init__.py", submodule_search_locations=[str(path)])
    sys.modules[package] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules[package])


def module(name: str):
    """A module of kvpress's evaluation/benchmarks package, e.g. "longbench.calculate_metrics"."""
    private_package(PACKAGE, _benchmarks_dir)
    return importlib.import_module(f"{PACKAGE}.{name}")


def longbench_builder(records: dict[str, list[dict]], monkeypatch) -> dict[str, pd.DataFrame]:
    """What kvpress's LongBench `create_huggingface_dataset.py` pushes for each task of `records` (THUDM rows).

    The script loops over the 16 English subsets; its prompt tables cover all 21, so its first loop is widened to
    the tasks given (and its LongBench-e loop dropped) before it runs, everything else unchanged."""
    import datasets

    source_path = _benchmarks_dir() / "longbench" / "create_huggingface_dataset.py"
    tree = ast.parse(source_path.read_text(encoding="utf-8"))
    loops = [node for node in tree.body if isinstance(node, ast.For)]
    loops[0].iter = ast.List(elts=[ast.Constant(task) for task in records], ctx=ast.Load())
    tree.body = [node for node in tree.body if node is not loops[1]]
    pushed: dict[str, pd.DataFrame] = {}

    def load_dataset(path, name, split):
        assert (path, split) == ("THUDM/LongBench", "test"), (path, split)
        return datasets.Dataset.from_list(records[name])

    def push_to_hub(self, repo_id, config_name, split):
        pushed[config_name] = self.to_pandas()

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(datasets.Dataset, "push_to_hub", push_to_hub)
    exec(compile(ast.fix_missing_locations(tree), str(source_path), "exec"), {"__name__": "kvpress_longbench_builder"})
    return pushed


def ruler_builder(folder: Path) -> pd.DataFrame:
    """kvpress's RULER `get_dataframe` on a RULER output folder `<...>/<length>/<task>/*.jsonl` (input, outputs)."""
    return module("ruler.create_huggingface_dataset").get_dataframe(folder)
