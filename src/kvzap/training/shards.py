"""The oracle shard format: safetensors files of aligned h / y / prompt rows (and optionally kv), checksummed.

Each shard's header metadata holds ONE key, "record" = JSON {n, last_prompt, sha256} (one key because
safetensors writes several in random order, and shards must be byte-reproducible). sha256 covers the raw
bytes of the tensors in name order, so corrupted tensor data stops the pipeline instead of training on it.
The optional `kv` tensor (the cached keys and values, for the (k, v) surrogate ablation) is covered by the
same checksum; a shard without it is the same file it was before `kv` existed.

Readers: `read_shard` loads and verifies one shard; `shard_record` reads the header only (resuming a
collection); `ShardRows` memory-maps many shards and gathers arbitrary rows (a global shuffle in bounded memory).
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from kvzap.atomic import atomic_path

TENSOR_NAMES = {"h", "y", "prompt"}  # every shard holds these
OPTIONAL_TENSOR_NAMES = {"kv"}  # written by `kvzap.training.collect --store-kv` only
# safetensors dtype -> (numpy storage dtype, torch dtype); bf16 has no numpy dtype: stored as int16, reinterpreted
DTYPES = {
    "BF16": (np.int16, torch.bfloat16),
    "F16": (np.float16, torch.float16),
    "F32": (np.float32, torch.float32),
    "F64": (np.float64, torch.float64),
    "I64": (np.int64, torch.int64),
}


def _corrupt(path: Path, problem: str) -> ValueError:
    return ValueError(
        f"Corrupt oracle shard {path}: {problem}. Delete it and rerun the oracle stage (kvzap.training.collect)."
    )


def _sha256(byte_arrays: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for name in sorted(byte_arrays):
        digest.update(byte_arrays[name].reshape(-1))
    return digest.hexdigest()


def _tensor_bytes(tensor: torch.Tensor) -> np.ndarray:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy()


def write_shard(path: Path, tensors: dict[str, torch.Tensor]) -> dict:
    """Write aligned h / y / prompt (/ kv) tensors atomically; returns the shard's manifest entry."""
    tensors = {name: t.contiguous() for name, t in tensors.items()}
    record = {
        "n": len(tensors["y"]),
        "last_prompt": int(tensors["prompt"].max()),
        "sha256": _sha256({name: _tensor_bytes(t) for name, t in tensors.items()}),
    }
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"record": json.dumps(record, sort_keys=True)})
    return {"file": path.name, **record}


def _header(path: Path) -> tuple[int, dict]:
    """(offset of the data section, JSON header) of a safetensors file."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
    except (OSError, struct.error, ValueError) as err:
        raise _corrupt(path, f"unreadable header ({err!r})") from err
    return 8 + length, header


def shard_record(path: Path) -> dict:
    """A shard's manifest entry from its header alone (resuming never reads the tensors)."""
    _, header = _header(path)
    try:
        record = json.loads(header["__metadata__"]["record"])
        return {
            "file": path.name,
            "n": int(record["n"]),
            "last_prompt": int(record["last_prompt"]),
            "sha256": str(record["sha256"]),
        }
    except (KeyError, TypeError, ValueError) as err:
        raise _corrupt(path, f"no valid record in its header ({err!r}; older kvzap wrote none)") from err


def _check_aligned(path: Path, lengths: dict[str, int], record: dict) -> None:
    names_ok = TENSOR_NAMES <= set(lengths) <= TENSOR_NAMES | OPTIONAL_TENSOR_NAMES
    if not names_ok or len(set(lengths.values())) != 1 or lengths["y"] != record["n"]:
        raise _corrupt(path, f"expected aligned h / y / prompt (/ kv) tensors of {record['n']} rows, found {lengths}")


def read_shard(path: Path) -> dict[str, torch.Tensor]:
    """Load a whole shard, verifying its checksum."""
    record = shard_record(path)
    try:
        shard = load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise _corrupt(path, f"truncated or unreadable ({err})") from err
    _check_aligned(path, {name: len(t) for name, t in shard.items()}, record)
    if _sha256({name: _tensor_bytes(t) for name, t in shard.items()}) != record["sha256"]:
        raise _corrupt(path, "its tensor data does not match the sha256 in its header")
    return shard


def _memmaps(path: Path) -> dict[str, tuple[np.memmap, torch.dtype]]:
    start, header = _header(path)
    maps = {}
    try:
        for name in TENSOR_NAMES | (OPTIONAL_TENSOR_NAMES & set(header)):
            info = header[name]
            storage, dtype = DTYPES[info["dtype"]]
            begin, end = info["data_offsets"]
            if end - begin != int(np.prod(info["shape"])) * np.dtype(storage).itemsize:
                raise ValueError(f"{name}: data_offsets do not match shape {info['shape']}")
            array = np.memmap(path, dtype=storage, mode="r", offset=start + begin, shape=tuple(info["shape"]))
            maps[name] = (array, dtype)
    except (KeyError, TypeError, ValueError, OSError) as err:
        raise _corrupt(path, f"truncated or malformed ({err!r})") from err
    return maps


class ShardRows:
    """The rows of several shards under one global index (shard after shard), memory-mapped: only
    the rows gathered are read, so a minibatch may draw from every shard at the cost of its own size."""

    def __init__(self, paths: list[Path]):
        self.paths = list(paths)
        self.records = [shard_record(path) for path in self.paths]
        self._maps = [_memmaps(path) for path in self.paths]
        for path, maps, record in zip(self.paths, self._maps, self.records):
            _check_aligned(path, {name: len(array) for name, (array, _) in maps.items()}, record)
        self.starts = np.concatenate([[0], np.cumsum([record["n"] for record in self.records])])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def verify(self) -> None:
        """Check every shard's checksum (one sequential read of the data, through the page cache)."""
        for path, maps, record in zip(self.paths, self._maps, self.records):
            if _sha256({name: array.view(np.uint8) for name, (array, _) in maps.items()}) != record["sha256"]:
                raise _corrupt(path, "its tensor data does not match the sha256 in its header")

    def row_shape(self, name: str) -> tuple[int, ...]:
        """The shape of one row of tensor `name`, read from the first shard's header (gather assumes all agree)."""
        return tuple(self._maps[0][name][0].shape[1:])

    def gather(self, name: str, index: np.ndarray | torch.Tensor, out: np.ndarray | None = None) -> torch.Tensor:
        """Rows `index` (global, any order) of tensor `name`, in that order; into the first rows of `out` (a
        buffer of the storage dtype, reused by a training loop: a fresh 18 MB array per minibatch costs more in
        page faults than the copy itself) when given."""
        index = np.asarray(index, dtype=np.int64)
        shard = np.searchsorted(self.starts, index, side="right") - 1
        rows = index - self.starts[shard]
        first, dtype = self._maps[0][name]
        if out is None:
            out = self.buffer(name, len(index))
        elif len(out) < len(index) or out.dtype != first.dtype or out.shape[1:] != first.shape[1:]:
            raise ValueError(
                f"gather of {len(index)} rows of {name!r} into a buffer of shape {out.shape} and dtype {out.dtype}: "
                f"pass ShardRows.buffer({name!r}, rows) with rows >= {len(index)}"
            )
        out = out[: len(index)]
        for s in np.unique(shard):
            chosen = shard == s
            out[chosen] = self._maps[s][name][0][rows[chosen]]
        return torch.from_numpy(out).view(dtype)

    def buffer(self, name: str, rows: int) -> np.ndarray:
        """An uninitialised `gather(..., out=)` buffer for up to `rows` rows of tensor `name`."""
        first = self._maps[0][name][0]
        return np.empty((rows, *first.shape[1:]), dtype=first.dtype)
