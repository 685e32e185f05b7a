"""What every benchmark script shares: its records printed as one table (tabulate), the CPU flags they name, and the
argument types that refuse a bad command-line value at parse time, naming it, before any model loads or any timing
starts."""

from __future__ import annotations

import argparse
from pathlib import Path


def print_table(records: list[dict], keys: list[str]) -> None:
    from tabulate import tabulate  # here: vllm_engine.py reads the argument types in an environment without it

    if records:
        print(tabulate([[r[k] for k in keys] for r in records], headers=keys, floatfmt=".3f"))


def cpu_flags() -> list[str]:
    """The CPU's matmul-relevant flags, which a record's figures depend on."""
    from kvzap import dtypes  # here: vllm_engine.py reads the argument types without loading kvzap

    return dtypes.matmul_flags()


def _integer(text: str, least: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer: give {what}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value} is below {least}: give {what}")
    return value


def positive_int(text: str) -> int:
    """Tokens, steps, repeats, threads, samples: at least one."""
    return _integer(text, 1, "a whole number of at least 1")


def nonnegative_int(text: str) -> int:
    """A window, which may be empty."""
    return _integer(text, 0, "a whole number of tokens, 0 or more")


def unit_fraction(text: str) -> float:
    """A compression ratio: the fraction of entries removed, in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: give a ratio in [0, 1)") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{value} is outside [0, 1): a ratio is the fraction of entries removed")
    return value


def seconds(text: str) -> float:
    """A measured duration: a finite number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: give seconds, e.g. 54") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{value} is not a duration: give 0 or more seconds")
    return value


def output_file(text: str) -> Path:
    """Where a record's JSON goes: a file path (its folder is created), not an existing folder."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder: give a file path such as {path / 'record.json'}")
    return path


def output_folder(text: str) -> Path:
    """A folder a script keeps its files in (created if missing), not an existing file."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file: give a folder path such as {path.parent / 'engines'}")
    return path


def add_group_arguments(parser: argparse.ArgumentParser, cells: list[str], context: int, n_samples: int) -> None:
    """What a script that evaluates one prefill group reads: a prepared model and its surrogates, the cells, and the
    RULER-style rows they answer."""
    parser.add_argument("--model", type=Path, required=True, help="model.json of a prepared model")
    parser.add_argument("--surrogates", type=Path, required=True, help="folder with linear/ and mlp/")
    parser.add_argument("--cells", nargs="+", default=cells, help="METHOD or METHOD=VALUE, methods that share")
    parser.add_argument("--context", type=positive_int, default=context)
    parser.add_argument("--tasks", nargs="+", default=["niah_single_2", "niah_multikey_1"])
    parser.add_argument("--n-samples", type=positive_int, default=n_samples, help="per task")


def group_cells(parser: argparse.ArgumentParser, texts: list[str]) -> list[tuple]:
    """The cells as (method, value), refused by name unless every method shares a prefill (a group holds no other)."""
    from kvzap.evaluation import methods
    from kvzap.evaluation.spec import JobError, parse_cell

    try:
        cells = [parse_cell(c) for c in texts]
    except JobError as err:
        parser.error(str(err))
    unshared = [m for m, _ in cells if not methods.METHODS[m].shares_prefill]
    if unshared:
        parser.error(f"{unshared} prune with their own prefill: a group holds only methods that share one.")
    return cells
