"""This CPU's matmul speed in float32 and bfloat16 at the demo's shapes (1024 tokens x hidden 576 by 576 x 1536, the
MLP's up-projection), one thread: the measurement behind `dtype: auto` (kvzap.dtypes), and a yardstick for how long
the demo takes here against the records in benchmarks/cpu/.

    python benchmarks/dtype_speed.py --out benchmarks/cpu/dtype_speed.json
"""

from __future__ import annotations

import argparse
import time

import torch

from kvzap import dtypes
from kvzap.atomic import atomic_write_json
from records import output_file, positive_int, print_table


def gflops(dtype: torch.dtype, m: int, k: int, n: int, repeats: int) -> float:
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    for _ in range(3):
        a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * m * k * n * repeats / (time.perf_counter() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_int, default=50)
    parser.add_argument("--out", type=output_file, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    speed = {name: gflops(dtypes.NAMES[name], 1024, 576, 1536, args.repeats) for name in ("float32", "bfloat16")}
    record = {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "native_bf16_flags": sorted(dtypes.cpu_flags() & set(dtypes.NATIVE_BF16_FLAGS)),
        "float32_gflops": speed["float32"],
        "bfloat16_gflops": speed["bfloat16"],
        "auto": dtypes.resolve("auto", "cpu"),
    }
    print_table([record], list(record))
    atomic_write_json(args.out, record)


if __name__ == "__main__":
    main()
