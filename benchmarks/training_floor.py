"""KVzap-MLP training against its floor. `fit_mlp` is timed whole on the demo's oracle shards (checksums, reading,
every epoch's minibatches gathered from the memory-mapped shards, validation, checkpoints); its floor is the same
number of optimizer steps of the same network on minibatches already in memory, with no gathering, validation or
checkpoints.

    python benchmarks/training_floor.py --data results/smollm2-135m/oracle/train \
        --out benchmarks/cpu/training_floor.json
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from kvzap import dtypes
from kvzap.atomic import atomic_write_json
from kvzap.training import fit
from kvzap.training.shards import ShardRows
from records import output_file, positive_int, print_table

COLUMNS = ["pairs", "epochs", "fit_mlp_s", "floor_s", "fit_over_floor", "core_minutes"]


def step_time(network: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int, steps: int) -> float:
    """Seconds of `steps` AdamW steps (forward, backward, clipping, update) on in-memory minibatches."""
    optimizer = torch.optim.AdamW(network.parameters(), lr=5e-3)
    order = np.random.default_rng(0).permutation(len(x))
    start = time.perf_counter()
    for s in range(steps):
        idx = torch.from_numpy(order[(s * batch) % (len(x) - batch) :][:batch])
        loss = torch.nn.functional.mse_loss(network(x[idx]), y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(network.parameters(), 1.0)
        optimizer.step()
    return time.perf_counter() - start


def fit_seconds(args) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        fit.fit_mlp(args.data, Path(scratch), args.epochs, batch_size=args.batch_size, device=torch.device("cpu"))
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="an oracle train/ folder")
    parser.add_argument("--epochs", type=positive_int, default=15)
    parser.add_argument("--batch-size", type=positive_int, default=512)
    parser.add_argument("--threads", type=positive_int, default=1, help="as the DAG's training jobs (cpus: 1)")
    parser.add_argument("--out", type=output_file, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    fit = fit_seconds(args)

    rows = ShardRows(fit.shards(args.data))
    pairs = len(rows)
    x, y = rows.gather("h", np.arange(pairs)).float(), rows.gather("y", np.arange(pairs)).float()
    surrogate = fit.new_surrogate(fit.load_manifest(args.data), x.shape[-1] // 8)
    steps = args.epochs * round(0.95 * pairs / args.batch_size)  # fit_mlp holds 5 % of the prompts out
    floor = step_time(surrogate.train().requires_grad_(True), x, y, args.batch_size, steps)
    record = {
        "pairs": pairs,
        "epochs": args.epochs,
        "fit_mlp_s": fit,
        "floor_s": floor,
        "fit_over_floor": fit / floor,
        "core_minutes": fit * args.threads / 60,
    }
    print_table([record], COLUMNS)
    flags = sorted(dtypes.cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
    atomic_write_json(args.out, {"data": str(args.data), "threads": args.threads, "cpu_flags": flags, **record})


if __name__ == "__main__":
    main()
