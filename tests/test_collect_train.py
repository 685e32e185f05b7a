"""Oracle collection to shards (resume, corruption) and surrogate training (ridge = scikit-learn, MLP resume)."""

import numpy as np
import pytest
import torch

from kvzap.training import fit
from kvzap.training.collect import collect_split
from kvzap.training.shards import read_shard
from oracle_data import RECORD, SETTINGS, collect_tiny, synthetic_split, tiny_prompts
from tiny_models import tiny_model, tiny_tokenizer


def test_collection_shards_and_resume(tmp_path):
    manifest, model, tok = collect_tiny(tmp_path)
    assert manifest["n_pairs"] == 40 and len(manifest["shards"]) == 2
    first = {p.name: p.read_bytes() for p in tmp_path.glob("shard-*")}
    (tmp_path / "shard-00001.safetensors").unlink()  # as if killed before the last shard
    (tmp_path / "manifest.json").unlink()
    again = collect_split(model, tok, tiny_prompts(4), tmp_path, SETTINGS, 10, 15, 1, RECORD)
    assert again["n_pairs"] == 40
    assert {p.name: p.read_bytes() for p in tmp_path.glob("shard-*")} == first  # same sampled tokens


def test_changed_settings_restart_collection(tmp_path):
    collect_tiny(tmp_path)
    tok = tiny_tokenizer()
    manifest = collect_split(
        tiny_model("llama", len(tok)), tok, tiny_prompts(2), tmp_path, {"test": 2}, 10, 100, 1, RECORD
    )
    assert manifest["n_pairs"] == 20 and len(list(tmp_path.glob("shard-*"))) == 1


def test_truncated_shard_named(tmp_path):
    collect_tiny(tmp_path)
    shard = tmp_path / "shard-00000.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(ValueError, match="shard-00000"):
        read_shard(shard)


def test_ridge_equals_scikit_learn(tmp_path):
    from sklearn.linear_model import Ridge

    x, y = synthetic_split(tmp_path / "train")
    model = fit.fit_ridge(tmp_path / "train", alpha=1.0, device=torch.device("cpu"))
    for layer in range(2):
        ref = Ridge(alpha=1.0).fit(x[:, layer].double().numpy(), y[:, layer].double().numpy())
        np.testing.assert_allclose(model.layers[layer].weight.numpy(), ref.coef_, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(model.layers[layer].bias.numpy(), ref.intercept_, rtol=1e-4, atol=1e-5)


def test_squared_pearson_matches_numpy():
    g = torch.Generator().manual_seed(0)
    t, p = torch.randn(50, 2, 3, generator=g), torch.randn(50, 2, 3, generator=g)
    r2 = fit.squared_pearson(t, p)
    ref = np.corrcoef(t[:, 1, 2].numpy(), p[:, 1, 2].numpy())[0, 1] ** 2
    assert r2[1, 2].item() == pytest.approx(ref, rel=1e-5)


def test_mlp_learns_and_resumes_identically(tmp_path, monkeypatch):
    synthetic_split(tmp_path / "train")
    kwargs = dict(epochs=4, lr=5e-3, batch_size=64, hidden_dim=8, device=torch.device("cpu"))
    full, history = fit.fit_mlp(tmp_path / "train", tmp_path / "a", **kwargs)
    assert history[-1]["valid_loss"] < history[0]["valid_loss"]

    save = fit._save_checkpoint

    def killed_after_second_epoch(out, run, model, optimizer, scheduler, epoch, history, best):
        save(out, run, model, optimizer, scheduler, epoch, history, best)
        if epoch == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(fit, "_save_checkpoint", killed_after_second_epoch)
    with pytest.raises(KeyboardInterrupt):
        fit.fit_mlp(tmp_path / "train", tmp_path / "b", **kwargs)
    monkeypatch.setattr(fit, "_save_checkpoint", save)
    resumed, resumed_history = fit.fit_mlp(tmp_path / "train", tmp_path / "b", **kwargs)
    assert [h["epoch"] for h in resumed_history] == [1, 2, 3, 4]
    for a, b in zip(full.state_dict().values(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b)


def test_truncated_training_checkpoint_named(tmp_path):
    synthetic_split(tmp_path / "train")
    kwargs = dict(epochs=1, lr=5e-3, batch_size=64, hidden_dim=8, device=torch.device("cpu"))
    fit.fit_mlp(tmp_path / "train", tmp_path / "out", **kwargs)
    checkpoint = tmp_path / "out" / "checkpoint.safetensors"
    checkpoint.write_bytes(checkpoint.read_bytes()[:64])
    with pytest.raises(ValueError, match="checkpoint.safetensors"):
        fit.fit_mlp(tmp_path / "train", tmp_path / "out", **{**kwargs, "epochs": 2})


def test_nemotron_selection_follows_the_paper(monkeypatch):
    """Per subset: token length strictly inside (min, max); the first n_test kept are held out, the next n_train
    train."""
    from kvzap.training import corpus

    texts = {s: [f"{s} " + "word " * n for n in (5, 20, 30, 12, 40, 25, 10)] for s in corpus.NEMOTRON_SUBSETS}
    monkeypatch.setattr(corpus, "_hub_texts", lambda subset, revision: iter(texts[subset]))
    tok = tiny_tokenizer()
    count = lambda t: len(tok.encode(t))  # noqa: E731
    split = corpus.select(
        corpus.NEMOTRON,
        tok,
        min_tokens=count(texts["Nemotron-SFT-Code"][3]) - 1,
        max_tokens=count(texts["Nemotron-SFT-Code"][4]),
        n_test=1,
        n_train=2,
    )
    assert len(split["test"]) == 9 and len(split["train"]) == 18
    code = [p.text for p in split["test"] + split["train"] if p.subset == "Nemotron-SFT-Code"]
    kept = [
        t
        for t in texts["Nemotron-SFT-Code"]
        if count(texts["Nemotron-SFT-Code"][3]) - 1 < count(t) < count(texts["Nemotron-SFT-Code"][4])
    ]
    assert code == kept[:3]


def test_truncated_shard_named_on_resume(tmp_path):
    _, model, tok = collect_tiny(tmp_path)
    (tmp_path / "manifest.json").unlink()
    shard = tmp_path / "shard-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:40])
    with pytest.raises(ValueError, match="shard-00001"):
        collect_split(model, tok, tiny_prompts(4), tmp_path, SETTINGS, 10, 15, 1, RECORD)


def test_ridge_on_chosen_pairs_equals_scikit_learn_on_those_rows(tmp_path):
    from sklearn.linear_model import Ridge

    x, y = synthetic_split(tmp_path / "train")
    pairs = np.r_[5:150, 310:420]  # spans three shards, skips rows in each
    model = fit.fit_ridge(tmp_path / "train", alpha=1.0, device=torch.device("cpu"), pairs=pairs)
    ref = Ridge(alpha=1.0).fit(x[pairs, 1].double().numpy(), y[pairs, 1].double().numpy())
    np.testing.assert_allclose(model.layers[1].weight.numpy(), ref.coef_, rtol=1e-4, atol=1e-6)


def test_mlp_keeps_its_best_validation_epoch(tmp_path, monkeypatch):
    """Scripted validation losses: the weights returned are those after epoch 2, the lowest, not the last."""
    synthetic_split(tmp_path / "train")
    losses = iter([3.0, 1.0, 2.0, 4.0])
    monkeypatch.setattr(fit, "_validation_loss", lambda *args: next(losses))
    snapshots = []
    save = fit._save_checkpoint

    def snapshot(out, run, model, *args):
        snapshots.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        save(out, run, model, *args)

    monkeypatch.setattr(fit, "_save_checkpoint", snapshot)
    model, history = fit.fit_mlp(
        tmp_path / "train", tmp_path / "out", epochs=4, lr=5e-3, batch_size=64, hidden_dim=8, device=torch.device("cpu")
    )
    assert [h["valid_loss"] for h in history] == [3.0, 1.0, 2.0, 4.0]
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, snapshots[1][name])
    assert not torch.equal(snapshots[1]["layers.0.0.weight"], snapshots[3]["layers.0.0.weight"])


def test_all_tokens_scored(tmp_path):
    from kvzap.training.collect import parse_token_count, sample_positions

    assert parse_token_count("all") is None and parse_token_count("250") == 250
    assert sample_positions(7, None, 1, 0).tolist() == list(range(7))
    tok = tiny_tokenizer()
    manifest = collect_split(
        tiny_model("llama", len(tok)), tok, tiny_prompts(2), tmp_path, SETTINGS, None, 1000, 1, RECORD
    )
    from kvzap.oracle.scores import build_repeat_prompt

    contexts = [build_repeat_prompt(tok, p.text).context for p in tiny_prompts(2)]
    assert manifest["n_pairs"] == sum(c.stop - c.start for c in contexts)
    assert manifest["prompt_subsets"] == ["s", "s"]


def test_validation_holds_out_whole_prompts():
    prompts = np.repeat(np.arange(40), 7)  # 40 prompts of 7 pairs
    train_index, valid_index = fit._split(prompts, 0.05, seed=3)
    assert len(set(prompts[valid_index])) == 2 and len(valid_index) == 14  # 5% of the prompts, all their pairs
    assert not set(prompts[valid_index]) & set(prompts[train_index])
    assert sorted([*train_index, *valid_index]) == list(range(len(prompts)))


def test_ridge_solves_after_set_num_threads():
    """torch 2.13's batched LU solve fails on CPU once torch.set_num_threads(2) has run (as any benchmark or user
    script may do); the ridge must still solve, and equal numpy's per-layer solution. A fresh process keeps the
    thread setting out of the other tests."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import numpy as np, torch
        from kvzap.training.fit import ridge_solve
        torch.set_num_threads(2)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(30, 1500, 576, generator=g, dtype=torch.float64)
        y = torch.randn(30, 1500, 3, generator=g, dtype=torch.float64)
        weight, bias = ridge_solve([(x, y)], 1.0, "synthetic")
        for layer in (0, 29):
            xc, yc = x[layer].numpy() - x[layer].numpy().mean(0), y[layer].numpy() - y[layer].numpy().mean(0)
            ref = np.linalg.solve(xc.T @ xc + np.eye(576), xc.T @ yc)
            assert np.allclose(weight[layer].numpy(), ref, atol=1e-10), layer
        print("solved")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "solved" in done.stdout, done.stderr[-2000:]
