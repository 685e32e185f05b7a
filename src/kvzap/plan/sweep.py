"""The evaluation cells a config asks for: (model, benchmark entry, subset, method, value) with exact value labels."""

from __future__ import annotations

from dataclasses import dataclass

from kvzap.evaluation import methods
from kvzap.evaluation.suites import catalog


@dataclass(frozen=True)
class Cell:
    model: str
    bench: str  # benchmark entry name
    subset: str
    method: str
    value: str  # value_label of the threshold / ratio, "none" for the full cache


def value_label(value: float | None) -> str:
    """The path label of a threshold or ratio, exact: float(label) == value (-4 -> '-4', 0.875 -> '0.875')."""
    if value is None:
        return "none"
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def method_values(config: dict, model: str, method: str, bench: dict) -> list[float | None]:
    """The thresholds or ratios a method sweeps on one benchmark entry: the entry's own, else the model's thresholds
    and the evaluation's ratios (an entry may run its costly baselines at fewer points)."""
    parameter = methods.METHODS[method].parameter
    if parameter == "none":
        return [None]
    if parameter == "threshold":
        return bench.get("thresholds") or config["models"][model]["thresholds"]
    return bench.get("ratios") or config["evaluation"]["ratios"]


def bench_models(config: dict, bench: dict) -> list[str]:
    return [m for m in config["models"] if m in bench.get("models", config["models"])]


def cells(config: dict) -> list[Cell]:
    """Every evaluation cell: (model, benchmark entry, subset, method, value label)."""
    out = []
    for name, bench in config["evaluation"]["benchmarks"].items():
        for model in bench_models(config, bench):
            for subset in bench["subsets"]:
                for method in bench.get("methods", config["evaluation"]["methods"]):
                    if method in config["models"][model].get("skip_methods", []):
                        continue
                    values = method_values(config, model, method, bench)
                    out += [Cell(model, name, subset, method, value_label(v)) for v in values]
    return out


@dataclass(frozen=True)
class EvalJob:
    """One evaluation job: cells of one (model, benchmark entry), every subset, run by one process.

    The prefill group (`group` = PREFILL_GROUP: every cell whose method prunes after attention) shares one prefill per
    sample and one batched decode; any other cell (its method changes the prefill, or the benchmark samples rollouts)
    is a job of its own (`group` None)."""

    model: str
    bench: str
    group: str | None
    cells: tuple[tuple[str, str], ...]  # (method, value label)


PREFILL_GROUP = "shared"


def eval_jobs(config: dict) -> list[EvalJob]:
    jobs = []
    for name, bench in config["evaluation"]["benchmarks"].items():
        sampled = bench["benchmark"] in catalog.SAMPLED_BENCHMARKS
        for model in bench_models(config, bench):
            shared = []
            for method in bench.get("methods", config["evaluation"]["methods"]):
                if method in config["models"][model].get("skip_methods", []):
                    continue
                info = methods.METHODS[method]
                for value in map(value_label, method_values(config, model, method, bench)):
                    if info.shares_prefill and not sampled:
                        shared.append((method, value))
                    else:
                        jobs.append(EvalJob(model, name, None, ((method, value),)))
            jobs += [EvalJob(model, name, PREFILL_GROUP, tuple(shared))] if shared else []
    return jobs
