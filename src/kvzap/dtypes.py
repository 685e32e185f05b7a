"""The dtype a run computes in. `auto` is the fastest exact one the machine has: bfloat16 where it multiplies
bf16 natively (a GPU that supports it; a CPU with avx512_bf16 or AMX), float32 elsewhere. On an AVX2-only CPU torch
emulates bf16 matmuls and they run slower than float32; with AMX they run several times faster
(benchmarks/dtype_speed.py measures both on the machine at hand)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CHOICES = ("auto", *NAMES)  # what a config or a --dtype flag may say
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere, which means float32)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


MATMUL_FLAGS = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})


def matmul_flags() -> list[str]:
    """The CPU's matmul-relevant flags, which every CPU timing and float32/bfloat16 choice depends on: named with each
    record."""
    return sorted(cpu_flags() & MATMUL_FLAGS)


def native_bf16(device: str | torch.device) -> bool:
    """A GPU that supports bf16; a CPU with bf16 units whose AVX-512 kernels torch dispatches (ATEN_CPU_CAPABILITY=avx2
    turns them off, and with them the bf16 speed)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    return avx512 and any(flag in cpu_flags() for flag in NATIVE_BF16_FLAGS)


def resolve(name: str, device: str | torch.device | None = None) -> str:
    """A concrete dtype name for `name` on `device` (default: the GPU when present, else the CPU)."""
    if name != "auto":
        if name not in NAMES:
            raise ValueError(f"dtype {name!r} is not one of {list(CHOICES)}.")
        return name
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return "bfloat16" if native_bf16(device) else "float32"
