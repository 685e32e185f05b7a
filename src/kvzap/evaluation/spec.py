"""What one evaluation job runs with, as one typed value: the planner (kvzap.plan.jobs.evaluate_spec) builds it,
the rule hands it to `python -m kvzap.evaluation.job --spec` as JSON (shown by `snakemake -n -p`), and the job reads
it back; its fields, less the output layout, are the provenance stamped into every cell. The field names are those of
the job's former command-line flags, so the provenance of a cell is what it was."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from kvzap import dtypes
from kvzap.evaluation import long_samples, methods
from kvzap.evaluation.metrics import DEPARTURES
from kvzap.evaluation.suites import BENCHMARKS
from kvzap.refusal import Refusal

# How a job's cells and rows were laid out into processes and batches: no greedy output depends on it
LAYOUT = ("subsets", "cells", "decode_batch", "batch_size")


class JobError(Refusal):
    """A job that cannot run as asked (a bad spec, a missing surrogate, a model its method cannot serve), with the fix
    in its message: library callers catch it, `main` prints it and exits."""


@dataclass(frozen=True)
class CellSpec:
    """One cell of a job: a method at a value (a threshold or ratio; None for a method without one), and the folder
    each subset of the job's entry writes to (the cell's own, or its shard's)."""

    method: str
    value: float | None
    outs: dict[str, str]

    def __post_init__(self):
        known_method(self.method, f"cell {self.method!r}")
        if self.value is not None and (isinstance(self.value, bool) or not isinstance(self.value, int | float)):
            raise JobError(f"cell {self.method}: value {self.value!r} is not a number (a threshold or a ratio).")
        if self.value is not None:
            object.__setattr__(self, "value", float(self.value))


@dataclass(frozen=True)
class JobSpec:
    """One evaluation job: its cells (one, or a prefill group's) over every subset of one benchmark entry, one
    shard of its rows, on one prepared model."""

    model: str  # the model.json kvzap.prepare.models wrote
    benchmark: str  # ruler, longbench, aime25 (kvzap.evaluation.suites)
    subsets: tuple[str, ...]  # RULER context lengths, LongBench tasks, aime25
    cells: tuple[CellSpec, ...]
    model_name: str  # the model's and the entry's names in the config (recorded in metrics.json)
    bench_name: str
    source: str = "offline"  # hub, offline or local:<folder>
    tasks: tuple[str, ...] | None = None  # RULER tasks (None: all available)
    revision: str | None = None  # the Hub dataset's revision (None: its main branch)
    long_samples: str = "run"  # samples past the model's positions (kvzap.evaluation.long_samples.POLICIES)
    departures: tuple[str, ...] = ()  # deliberate departures from kvpress's scoring (metrics.DEPARTURES)
    surrogate_linear: tuple[str, ...] | None = None  # a surrogate folder per training seed, per kind
    surrogate_mlp: tuple[str, ...] | None = None
    n_samples: int | None = None  # per task (None: all)
    max_new_tokens: int | None = None  # a cap on the benchmark's lengths
    rollouts: int | None = None  # sampling benchmarks: rollouts per problem
    decode_batch: int | None = None  # a prefill group's cells decoded as one batch (None: all)
    batch_size: int = 1  # rows generated as one batch (rollouts, or a group's samples x cells)
    dtype: str = "auto"  # auto: the fastest exact one here
    seed: int = 42
    shard: int = 0  # this job evaluates rows shard, shard + n_shards, ...
    n_shards: int = 1

    def __post_init__(self):
        for name in ("subsets", "cells", "tasks", "departures", "surrogate_linear", "surrogate_mlp"):
            value = getattr(self, name)
            if isinstance(value, list):  # read from JSON
                object.__setattr__(self, name, tuple(value))
        object.__setattr__(self, "cells", tuple(c if isinstance(c, CellSpec) else _cell(c) for c in self.cells))
        if self.benchmark not in BENCHMARKS:
            raise JobError(f"benchmark {self.benchmark!r}: unknown. Fix: use one of {sorted(BENCHMARKS)}.")
        if self.long_samples not in long_samples.POLICIES:
            raise JobError(f"long_samples {self.long_samples!r}: use one of {sorted(long_samples.POLICIES)}.")
        if unknown := sorted(set(self.departures) - set(DEPARTURES)):
            raise JobError(f"departures {unknown}: unknown. Fix: use some of {sorted(DEPARTURES)}.")
        if self.dtype not in dtypes.CHOICES:
            raise JobError(f"dtype {self.dtype!r}: use one of {list(dtypes.CHOICES)}.")
        if not self.subsets or not self.cells:
            raise JobError("a job needs at least one subset and one cell.")
        for name in ("decode_batch", "batch_size", "n_samples", "max_new_tokens", "rollouts", "n_shards"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise JobError(f"{name} {value!r}: must be a whole number of at least 1.")
        if not 0 <= self.shard < self.n_shards:
            raise JobError(f"shard {self.shard}: must be one of 0..{self.n_shards - 1} (n_shards {self.n_shards}).")
        for cell in self.cells:
            if missing := [s for s in self.subsets if s not in cell.outs]:
                raise JobError(f"cell {cell.method}={cell.value}: no output folder for subsets {missing}.")

    @classmethod
    def read(cls, text: str) -> JobSpec:
        """A spec from its JSON, or from a file holding it."""
        if not text.lstrip().startswith("{"):
            try:
                text = Path(text).read_text()
            except OSError as err:
                raise JobError(f"--spec {text!r}: neither a JSON object nor a readable file ({err}).") from None
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as err:
            raise JobError(f"--spec is not valid JSON: {err}.") from None
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(raw) - known):
            raise JobError(f"--spec: unknown keys {unknown}; the keys are {sorted(known)}.")
        try:
            return cls(**raw)
        except TypeError as err:  # a required key missing
            raise JobError(f"--spec: {err}.") from None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def params(self, sampled: bool) -> dict:
        """The settings the job's outputs depend on (the provenance): everything but how cells and rows were laid
        out into processes and batches, which changes no greedy output (a sampled batch is seeded by its first
        row: its batch size stays)."""
        layout = LAYOUT[:-1] if sampled else LAYOUT
        return {k: v for k, v in asdict(self).items() if k not in layout}

    def resolved(self) -> JobSpec:
        """The spec with its dtype as this machine runs it ("auto" made concrete), as provenance records it."""
        return replace(self, dtype=dtypes.resolve(self.dtype))

    def surrogate_folders(self) -> dict[str, list[Path]]:
        return {kind: [Path(p) for p in getattr(self, f"surrogate_{kind}") or ()] for kind in ("linear", "mlp")}


def known_method(method: str, where: str) -> None:
    if method not in methods.METHODS:
        raise JobError(f"{where}: unknown method {method!r}. Fix: use one of {sorted(methods.METHODS)}.")


def _cell(raw) -> CellSpec:
    if not isinstance(raw, dict) or set(raw) != {"method", "value", "outs"}:
        raise JobError(f"a cell is {{'method', 'value', 'outs'}}, got {raw!r}.")
    return CellSpec(**raw)


def parse_cell(token: str) -> tuple[str, float | None]:
    """METHOD or METHOD=VALUE, as a person types a cell (a benchmark's --cells) -> (method, value)."""
    method, _, value = token.partition("=")
    known_method(method, f"--cells {token!r}")
    try:
        return method, float(value) if value else None
    except ValueError:
        raise JobError(
            f"--cells {token!r}: {value!r} is not a number. Fix: write METHOD=VALUE, e.g. knorm=0.5."
        ) from None
