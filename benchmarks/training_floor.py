"""KVzap-MLP training against its floor, and what reading its minibatches costs. `fit_mlp` is timed whole on the
demo's oracle shards (checksums, reading, every epoch's minibatches gathered from the memory-mapped shards,
validation, checkpoints); its floor is the same number of optimizer steps of the same network on minibatches
already in memory, copied into reused buffers, with no gathering, validation or checkpoints. Reading: one
epoch's minibatches gathered into fresh arrays and converted to float32 (what fit_mlp did before) against
`fit.Minibatches`, which gathers into buffers it reuses, in the same run; both give the same tensors (checked).

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

from kvzap.atomic import atomic_write_json
from kvzap.training import fit
from kvzap.training.shards import ShardRows
from records import cpu_flags, output_file, positive_int, print_table

COLUMNS = ["pairs", "epochs", "fit_mlp_s", "floor_s", "fit_over_floor", "core_minutes"]
READ_COLUMNS = ["batches", "fresh_ms", "reused_ms", "fresh_over_reused"]


def step_time(network: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int, steps: int) -> float:
    """Seconds of `steps` AdamW steps (forward, backward, clipping, update) on in-memory minibatches."""
    optimizer = torch.optim.AdamW(network.parameters(), lr=5e-3)
    order = torch.from_numpy(np.random.default_rng(0).permutation(len(x)))
    xb, yb = torch.empty(batch, *x.shape[1:]), torch.empty(batch, *y.shape[1:])
    start = time.perf_counter()
    for s in range(steps):
        idx = order[(s * batch) % (len(x) - batch) :][:batch]
        torch.index_select(x, 0, idx, out=xb)
        torch.index_select(y, 0, idx, out=yb)
        loss = torch.nn.functional.mse_loss(network(xb), yb)
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


def reading_ms(rows: ShardRows, batch: int) -> dict:
    """Milliseconds per minibatch of one epoch's order, read into fresh arrays, then into reused buffers."""
    batches = fit._epoch_batches(np.arange(len(rows)), batch, seed=0, epoch=0)
    fresh = [rows.gather(n, batches[-1]).to(torch.float32) for n in ("h", "y")]
    minibatch = fit.Minibatches(rows, batch, torch.device("cpu"))
    if not all(torch.equal(a, b) for a, b in zip(fresh, minibatch(batches[-1]))):
        raise AssertionError("fit.Minibatches reads other values than ShardRows.gather")
    for name in ("h", "y"):  # both variants read warm pages
        rows.gather(name, np.arange(len(rows)))
    start = time.perf_counter()
    for idx in batches:
        rows.gather("h", idx).to(torch.float32), rows.gather("y", idx).to(torch.float32)
    fresh_s = time.perf_counter() - start
    start = time.perf_counter()
    for idx in batches:
        minibatch(idx)
    reused_s = time.perf_counter() - start
    return {
        "batches": len(batches),
        "fresh_ms": 1000 * fresh_s / len(batches),
        "reused_ms": 1000 * reused_s / len(batches),
        "fresh_over_reused": fresh_s / reused_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="an oracle train/ folder")
    parser.add_argument("--epochs", type=positive_int, default=15)
    parser.add_argument("--batch-size", type=positive_int, default=512)
    parser.add_argument("--threads", type=positive_int, default=1, help="as the DAG's training jobs (cpus: 1)")
    parser.add_argument("--out", type=output_file, required=True)
    args = parser.parse_args()
    if not (args.data / "manifest.json").is_file():
        parser.error(f"--data {args.data} holds no finished oracle collection (manifest.json): run make demo first")
    torch.set_num_threads(args.threads)
    rows = ShardRows(fit.shards(args.data))
    reading = reading_ms(rows, args.batch_size)
    print_table([reading], READ_COLUMNS)
    fit_s = fit_seconds(args)

    pairs = len(rows)
    x, y = rows.gather("h", np.arange(pairs)).float(), rows.gather("y", np.arange(pairs)).float()
    surrogate = fit.new_surrogate(fit.load_manifest(args.data), x.shape[-1] // 8)
    steps = args.epochs * round(0.95 * pairs / args.batch_size)  # fit_mlp holds 5 % of the prompts out
    floor = step_time(surrogate.train().requires_grad_(True), x, y, args.batch_size, steps)
    record = {
        "pairs": pairs,
        "epochs": args.epochs,
        "fit_mlp_s": fit_s,
        "floor_s": floor,
        "fit_over_floor": fit_s / floor,
        "core_minutes": fit_s * args.threads / 60,
    }
    print_table([record], COLUMNS)
    atomic_write_json(
        args.out,
        {"data": str(args.data), "threads": args.threads, "cpu_flags": cpu_flags(), **record, "reading": reading},
    )


if __name__ == "__main__":
    main()
