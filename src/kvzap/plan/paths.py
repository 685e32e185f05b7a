"""Where every output lives, as one template per kind of file. The rules fill their patterns with wildcards
("{model}") and the command lines with names: both read these, so a path is written once."""

from __future__ import annotations

from kvzap.plan.sweep import Cell


def model_json(results: str, model: str) -> str:
    return f"{results}/{model}/model.json"


def oracle_dir(results: str, model: str, kv_ablation: bool = False) -> str:
    """The oracle collection; the (k, v)-input ablation has its own, which also stores k and v."""
    return f"{results}/{model}/{'oracle-kv' if kv_ablation else 'oracle'}"


def oracle_manifest(results: str, model: str, split: str, kv_ablation: bool = False) -> str:
    return f"{oracle_dir(results, model, kv_ablation)}/{split}/manifest.json"


def surrogate_dir(results: str, model: str, kind: str, seed: int | str | None = None) -> str:
    """A trained surrogate: the first training seed's (the published one), or beside it another seed's."""
    return f"{results}/{model}/surrogates/{kind}" + ("" if seed is None else f"-seed{seed}")


def cell_dir(results: str, cell: Cell) -> str:
    return f"{results}/{cell.model}/eval/{cell.bench}/{cell.subset}/{cell.method}/{cell.value}"


def shard_dir(results: str, cell: Cell, shard, n_shards: int) -> str:
    """Where one evaluation job writes a cell's share: the cell itself when it is not split (nothing to merge)."""
    return cell_dir(results, cell) if n_shards == 1 else f"{cell_dir(results, cell)}/shards/{shard}-of-{n_shards}"


def ablation_file(results: str, model: str, name: str) -> str:
    """An ablation's result: name is kv_ablation or training_pairs."""
    return f"{results}/{model}/ablations/{name}.json"


def table(results: str, name: str, suffix: str = "csv") -> str:
    return f"{results}/tables/{name}.{suffix}"


def figure(results: str, name: str, suffix: str = "png") -> str:
    return f"{results}/figures/{name}.{suffix}"


def publish_plan(results: str) -> str:
    return f"{results}/publish/plan.json"


def log(results: str, *parts: str) -> str:
    """A rule's log: <results>/logs/<stage>/<name>.log."""
    return f"{results}/logs/{'/'.join(parts)}.log"
