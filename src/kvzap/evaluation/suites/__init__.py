"""Benchmarks by name. Each module exposes load(source, subset, tokenizer, n_samples, seed, revision=...) -> rows
(`attrs["revision"]` naming what was read) and score(predictions, departures) -> metrics; AIME25 also GENERATION
(sampling and decoding-time compression)."""

import importlib

BENCHMARKS = {
    "ruler": "kvzap.evaluation.suites.ruler",
    "longbench": "kvzap.evaluation.suites.longbench",
    "aime25": "kvzap.evaluation.suites.aime",
}


def benchmark_module(name: str):
    if name not in BENCHMARKS:
        raise ValueError(f"Unknown benchmark {name!r}; known benchmarks: {', '.join(BENCHMARKS)}.")
    return importlib.import_module(BENCHMARKS[name])
