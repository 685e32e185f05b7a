"""Oracle shards are trustworthy: resuming only continues identical work, tensor data is checksummed,
non-finite pairs are never written, and memory-mapped rows equal the loaded shards."""

import hashlib
import json
import struct

import numpy as np
import pytest
import torch

from kvzap.training import collect
from kvzap.training.collect import collect_split
from oracle_data import RECORD, SETTINGS, collect_tiny, synthetic_split, tiny_prompts
from tiny_models import tiny_model, tiny_tokenizer


def _count_oracle_calls(monkeypatch) -> list[int]:
    calls = []
    real = collect.oracle_scores

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(collect, "oracle_scores", counted)
    return calls


@pytest.mark.parametrize(
    "change",
    [
        {"model_record": {**RECORD, "revision": "new-snapshot"}},
        {"tokens_per_prompt": 8},
        {"seed": 2},
        {"prompts": "other texts"},
    ],
)
def test_any_change_that_alters_the_shards_restarts_collection(tmp_path, monkeypatch, change):
    manifest, model, tok = collect_tiny(tmp_path)
    calls = _count_oracle_calls(monkeypatch)
    prompts = tiny_prompts(4)
    if change.get("prompts"):
        prompts[0] = type(prompts[0])("s", 0, prompts[0].text[::-1])
    kwargs = dict(tokens_per_prompt=10, shard_tokens=15, seed=1, model_record=RECORD)
    kwargs.update({k: v for k, v in change.items() if k != "prompts"})
    again = collect_split(model, tok, prompts, tmp_path, SETTINGS, **kwargs)
    assert len(calls) == 4  # every prompt recomputed, none taken from the old shards
    assert again["model_revision"] == kwargs["model_record"]["revision"]
    assert again["n_pairs"] == 4 * kwargs["tokens_per_prompt"]


def test_unchanged_settings_still_resume(tmp_path, monkeypatch):
    _, model, tok = collect_tiny(tmp_path)
    (tmp_path / "shard-00001.safetensors").unlink()
    calls = _count_oracle_calls(monkeypatch)
    collect_split(model, tok, tiny_prompts(4), tmp_path, SETTINGS, 10, 15, 1, RECORD)
    assert len(calls) == 2  # shard 0 holds prompts 0-1 (20 pairs >= 15)


def test_settings_record_the_model_revision(tmp_path):
    collect_tiny(tmp_path)
    settings = json.loads((tmp_path / "settings.json").read_text())
    assert settings["model_revision"] == RECORD["revision"] and settings["model_dtype"] == "float32"


def _data_section(path):
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return raw, 8 + length, json.loads(raw[8 : 8 + length])


def test_shard_checksum_covers_the_tensor_bytes(tmp_path):
    """Independent check of the format: sha256 of each tensor's raw bytes, in name order, in ONE metadata key."""
    manifest, _, _ = collect_tiny(tmp_path)
    for entry in manifest["shards"]:
        raw, start, header = _data_section(tmp_path / entry["file"])
        assert list(header["__metadata__"]) == ["record"]
        digest = hashlib.sha256()
        for name in sorted(k for k in header if k != "__metadata__"):
            begin, end = header[name]["data_offsets"]
            digest.update(raw[start + begin : start + end])
        assert json.loads(header["__metadata__"]["record"])["sha256"] == entry["sha256"] == digest.hexdigest()


def test_corrupted_tensor_data_is_refused(tmp_path):
    from kvzap.training.shards import read_shard

    collect_tiny(tmp_path)
    path = tmp_path / "shard-00000.safetensors"
    raw, start, _ = _data_section(path)
    corrupted = bytearray(raw)
    corrupted[start + 100 : start + 164] = np.random.default_rng(0).bytes(64)
    path.write_bytes(bytes(corrupted))
    with pytest.raises(ValueError, match=r"shard-00000.*sha256.*Delete it and rerun the oracle stage"):
        read_shard(path)


def test_non_finite_oracle_output_is_not_written(tmp_path, monkeypatch):
    real = collect.oracle_scores

    calls = []

    def poisoned(model, prompt, keep_positions, **kwargs):
        scores = real(model, prompt, keep_positions=keep_positions, **kwargs)
        calls.append(1)
        if len(calls) == 3:  # the third prompt (index 2)
            scores.kvzip_plus_log[0, 0, keep_positions[0]] = float("-inf")
        return scores

    monkeypatch.setattr(collect, "oracle_scores", poisoned)
    tok = tiny_tokenizer()
    with pytest.raises(ValueError, match=r"Prompt 2 .*\(s #2\).*non-finite log KVzip\+ scores"):
        collect_split(tiny_model("llama", len(tok)), tok, tiny_prompts(4), tmp_path, SETTINGS, 10, 100, 1, RECORD)
    assert not list(tmp_path.glob("shard-*")) and not (tmp_path / "manifest.json").exists()


def test_memory_mapped_rows_equal_the_loaded_shards(tmp_path):
    """Global indices run shard after shard; bf16 comes back bit-exact through its int16 storage."""
    from kvzap.training.shards import ShardRows, read_shard

    x, _ = synthetic_split(tmp_path / "train", n=50, shard=20, dtype=torch.bfloat16)
    paths = sorted((tmp_path / "train").glob("shard-*"))
    rows = ShardRows(paths)
    rows.verify()
    loaded = [read_shard(p) for p in paths]
    index = np.array([49, 0, 21, 20, 19, 33, 0])
    for name in ("h", "y", "prompt"):
        expected = torch.cat([shard[name] for shard in loaded])[torch.from_numpy(index)]
        assert rows.gather(name, index).dtype == expected.dtype
        assert torch.equal(rows.gather(name, index), expected)
    assert torch.equal(rows.gather("h", index), x.bfloat16()[torch.from_numpy(index)])


def test_minibatches_in_reused_buffers_equal_fresh_gathers(tmp_path):
    """fit_mlp's reused buffers give the float32 rows a fresh gather gives, a shorter batch after a longer one
    included (no rows of the earlier batch leak into it), in the buffer's own memory."""
    from kvzap.training import fit
    from kvzap.training.shards import ShardRows

    synthetic_split(tmp_path / "train", n=50, shard=20, dtype=torch.bfloat16)
    rows = ShardRows(sorted((tmp_path / "train").glob("shard-*")))
    minibatch = fit.Minibatches(rows, 8, torch.device("cpu"))
    for index in (np.array([49, 0, 21, 20, 19, 33, 0, 7]), np.array([3, 45, 22])):
        read = minibatch(index)
        for name, got in zip(("h", "y"), read):
            expected = rows.gather(name, index).to(torch.float32)
            assert got.dtype == torch.float32 and got.shape == expected.shape
            assert torch.equal(got, expected)
        assert read[0].data_ptr() == minibatch.out["h"].data_ptr()
    with pytest.raises(ValueError, match=r"gather of 9 rows of 'h' into a buffer of shape \(8, .*ShardRows.buffer"):
        minibatch(np.arange(9))
