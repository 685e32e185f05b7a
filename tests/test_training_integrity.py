"""Surrogate training never reports success on something it did not do: resumes continue only the
same run, corrupted or non-finite data stops it, and each epoch shuffles all pairs across shards."""

import json
import struct

import numpy as np
import pytest
import torch

from kvzap.training import fit
from oracle_data import synthetic_split

KWARGS = dict(epochs=6, lr=5e-3, batch_size=64, hidden_dim=8, device=torch.device("cpu"))


def _killed_in_epoch(monkeypatch, n: int) -> None:
    """Interrupt training during epoch `n`, after epochs 1..n-1 were checkpointed."""
    real = fit._validation_loss
    calls = []

    def validation(*args, **kwargs):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(fit, "_validation_loss", validation)


@pytest.mark.parametrize("change", [{"epochs": 2}, {"lr": 1e-3}, {"batch_size": 32}, {"hidden_dim": 4}, {"seed": 7}])
def test_resume_with_other_settings_restarts(tmp_path, monkeypatch, capsys, change):
    """The issue: killed at epoch 4 of 6, rerun with 2 epochs, reported 2 epochs but held epochs 1-3."""
    synthetic_split(tmp_path / "train")
    _killed_in_epoch(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        fit.fit_mlp(tmp_path / "train", tmp_path / "b", **KWARGS)
    monkeypatch.undo()
    changed = {**KWARGS, **change}
    resumed, history = fit.fit_mlp(tmp_path / "train", tmp_path / "b", **changed)
    assert (
        f"Discarding {tmp_path / 'b' / 'checkpoint.safetensors'}: it was made with different {next(iter(change))}"
        in capsys.readouterr().out
    )
    fresh, fresh_history = fit.fit_mlp(tmp_path / "train", tmp_path / "c", **changed)
    assert [h["epoch"] for h in history] == list(range(1, changed["epochs"] + 1))
    assert history == fresh_history
    for a, b in zip(fresh.state_dict().values(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b)
    progress = json.loads((tmp_path / "b" / "history.json").read_text())
    assert progress["run"]["epochs"] == changed["epochs"] and progress["history"] == history


def test_resume_with_other_training_data_restarts(tmp_path, monkeypatch, capsys):
    synthetic_split(tmp_path / "train")
    _killed_in_epoch(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        fit.fit_mlp(tmp_path / "train", tmp_path / "b", **KWARGS)
    monkeypatch.undo()
    for path in (tmp_path / "train").iterdir():
        path.unlink()
    (tmp_path / "train").rmdir()
    synthetic_split(tmp_path / "train", seed=1)  # recollected data, same shard names and sizes
    resumed, history = fit.fit_mlp(tmp_path / "train", tmp_path / "b", **KWARGS)
    assert "made with different data" in capsys.readouterr().out
    fresh, fresh_history = fit.fit_mlp(tmp_path / "train", tmp_path / "c", **KWARGS)
    assert history == fresh_history


def test_each_epoch_shuffles_all_pairs_across_shards(tmp_path, monkeypatch):
    from kvzap.training.shards import ShardRows

    synthetic_split(tmp_path / "train", n=600, shard=200)
    gathered, real_gather = [], ShardRows.gather
    monkeypatch.setattr(
        ShardRows,
        "gather",
        lambda self, name, index, out=None: (
            gathered.append((name, np.array(index))) or real_gather(self, name, index, out)
        ),
    )
    real_validation = fit._validation_loss

    def epoch_end(*args, **kwargs):
        gathered.append(("epoch end", None))
        before = len(gathered)
        loss = real_validation(*args, **kwargs)
        del gathered[before:]
        return loss

    monkeypatch.setattr(fit, "_validation_loss", epoch_end)
    fit.fit_mlp(tmp_path / "train", tmp_path / "out", **{**KWARGS, "epochs": 2})

    held_out = torch.randperm(600, generator=torch.Generator().manual_seed(42))[:30].numpy()  # seeded 5%
    training_pairs = np.setdiff1d(np.arange(600), held_out)
    marks = [i for i, (name, _) in enumerate(gathered) if name == "epoch end"]
    assert len(marks) == 2
    epochs = [gathered[: marks[0]], gathered[marks[0] + 1 : marks[1]]]
    orders = []
    for calls in epochs:
        batches = [index for name, index in calls if name == "h"]
        assert len(batches) == 9  # ceil(570 / 64)
        order = np.concatenate(batches)
        assert np.array_equal(np.sort(order), training_pairs)  # every training pair exactly once, none held out
        for batch in batches[:-1]:
            assert len(np.unique(batch // 200)) == 3  # each minibatch draws from all three shards
        orders.append(order)
    assert not np.array_equal(orders[0], orders[1])  # a new shuffle every epoch


def _corrupt_tensor_bytes(path):
    raw = bytearray(path.read_bytes())
    (length,) = struct.unpack("<Q", raw[:8])
    raw[8 + length + 40 : 8 + length + 104] = np.random.default_rng(0).bytes(64)
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("kind", ["ridge", "mlp"])
def test_corrupted_shard_stops_training(tmp_path, kind):
    """The issue: random bytes in a shard's tensor data gave NaN surrogates and rc 0."""
    synthetic_split(tmp_path / "train")
    _corrupt_tensor_bytes(tmp_path / "train" / "shard-00001.safetensors")
    with pytest.raises(ValueError, match=r"shard-00001.*Delete it and rerun the oracle stage"):
        if kind == "ridge":
            fit.fit_ridge(tmp_path / "train", device=torch.device("cpu"))
        else:
            fit.fit_mlp(tmp_path / "train", tmp_path / "out", **KWARGS)


def _split_with_a_non_finite_target(folder):
    """Shards that pass their checksum but hold an inf target (as an unguarded collection could write)."""
    from kvzap.training.shards import read_shard, write_shard

    synthetic_split(folder)
    path = folder / "shard-00000.safetensors"
    shard = read_shard(path)
    shard["y"][5, 0, 1] = float("inf")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["shards"][0] = write_shard(path, shard)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_ridge_refuses_a_non_finite_solution(tmp_path):
    _split_with_a_non_finite_target(tmp_path / "train")
    with pytest.raises(FloatingPointError, match="ridge solution .* is not finite"):
        fit.fit_ridge(tmp_path / "train", device=torch.device("cpu"))


def test_mlp_stops_on_a_non_finite_loss(tmp_path):
    _split_with_a_non_finite_target(tmp_path / "train")
    with pytest.raises(FloatingPointError, match=r"diverged in epoch 1: the minibatch loss is (nan|inf)"):
        fit.fit_mlp(tmp_path / "train", tmp_path / "out", **KWARGS)


def test_mlp_stops_on_non_finite_weights(tmp_path):
    """One minibatch per epoch: the loss before the step is finite, the weights after it are not."""
    synthetic_split(tmp_path / "train")
    with pytest.raises(FloatingPointError, match="diverged in epoch 1: the weights are no longer finite"):
        fit.fit_mlp(tmp_path / "train", tmp_path / "out", **{**KWARGS, "lr": float("inf"), "batch_size": 1024})
    assert not (tmp_path / "out" / "checkpoint.safetensors").exists()


def test_checkpoint_without_recorded_settings_is_discarded(tmp_path, capsys):
    """A checkpoint of an older kvzap (no settings in its header) cannot be trusted to match: restart."""
    from safetensors.torch import save_file

    synthetic_split(tmp_path / "train")
    (tmp_path / "out").mkdir()
    save_file({"model.layers.0.0.weight": torch.zeros(8, 12)}, str(tmp_path / "out" / "checkpoint.safetensors"))
    _, history = fit.fit_mlp(tmp_path / "train", tmp_path / "out", **{**KWARGS, "epochs": 1})
    assert "made with different kvzap version" in capsys.readouterr().out
    assert [h["epoch"] for h in history] == [1]


def test_the_papers_split_holds_out_pairs_and_the_demos_whole_prompts():
    """skorch's ValidSplit(0.05) (the paper's) draws pairs from nearly every prompt; the demo's holds prompts out whole,
    so no validation prompt has a pair in training. Both hold out 5 % and are seeded."""
    prompts = np.repeat(np.arange(40), 25)  # 40 prompts of 25 pairs
    for by in fit.VALID_SPLITS:
        train, valid = fit._split(prompts, 0.05, seed=3, by=by)
        assert sorted(np.concatenate([train, valid])) == list(range(len(prompts)))
        again = fit._split(prompts, 0.05, seed=3, by=by)
        assert np.array_equal(valid, again[1]) and not np.array_equal(valid, fit._split(prompts, 0.05, 4, by=by)[1])
        shared = set(prompts[train]) & set(prompts[valid])
        if by == "pairs":
            assert len(valid) == 50 and len(set(prompts[valid])) > 20 and shared
        else:
            assert len(set(prompts[valid])) == 2 and not shared


def test_keep_last_returns_the_last_epochs_weights_and_best_the_lowest_validation_loss(tmp_path, monkeypatch):
    """The paper keeps the last epoch (skorch without a checkpoint); the demo the best. A scripted validation loss,
    lowest at epoch 2 of 4, tells them apart; each epoch's weights are caught where the loss is measured."""
    synthetic_split(tmp_path / "train")
    scripted = [3.0, 1.0, 2.0, 4.0]
    for keep, chosen in (("last", 3), ("best", 1)):
        weights = []

        def validation(model, *args):
            weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})
            return scripted[len(weights) - 1]

        monkeypatch.setattr(fit, "_validation_loss", validation)
        model, history = fit.fit_mlp(tmp_path / "train", tmp_path / keep, keep=keep, **{**KWARGS, "epochs": 4})
        assert [h["valid_loss"] for h in history] == scripted
        for name, value in model.state_dict().items():
            torch.testing.assert_close(value, weights[chosen][name])
        assert any(not torch.equal(weights[chosen][k], weights[2][k]) for k in weights[2])
    with pytest.raises(ValueError, match="keep one of"):
        fit.fit_mlp(tmp_path / "train", tmp_path / "bad", keep="first", **KWARGS)
