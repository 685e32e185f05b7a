"""The demo model and RULER-style rows the accuracy scripts share (chunked_accuracy.py, oracle_ceiling.py)."""

from __future__ import annotations

import argparse

import pandas as pd
import torch
from transformers.utils import logging

from eviction import DEFAULT_MODEL, add_model_json
from kvzap.evaluation.suites import benchmark_module
from kvzap.prepare.models import ensure_prepared, load
from records import positive_int


def add_arguments(parser: argparse.ArgumentParser, subset: str, tasks: list[str], n_samples: int) -> None:
    """The model, rows and thread options, with the calling script's defaults for the rows."""
    add_model_json(parser)
    parser.add_argument("--subset", default=subset, help="RULER context length (offline generator)")
    parser.add_argument("--tasks", nargs="+", default=tasks)
    parser.add_argument("--n-samples", type=positive_int, default=n_samples, help="per task")
    parser.add_argument("--max-new-tokens", type=positive_int, default=12)
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--seed", type=int, default=42)


def model_and_rows(args) -> tuple:
    """(model, tokenizer, the RULER suite, its offline rows with max_new_tokens capped), on `args.threads` threads."""
    torch.set_num_threads(args.threads)
    logging.disable_progress_bar()
    ensure_prepared(args.model_json, DEFAULT_MODEL)
    model, tokenizer = load(args.model_json, dtype="float32", device_map="cpu")
    bench = benchmark_module("ruler")
    rows: pd.DataFrame = bench.load("offline", args.subset, tokenizer, args.n_samples, args.seed, tasks=args.tasks)
    rows["max_new_tokens"] = rows["max_new_tokens"].clip(upper=args.max_new_tokens)
    return model, tokenizer, bench, rows
