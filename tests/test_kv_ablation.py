"""The (k, v) surrogate ablation: collection stores the cached keys/values at the sampled tokens (checked against
an independent recomputation), the per-head kv ridge equals scikit-learn's, --store-kv is part of the resume
key, shards without kv train as before, and the entry point writes both rows."""

import json
import sys

import numpy as np
import pytest
import torch

from kvzap.ablations import kv_input
from kvzap.oracle.scores import build_repeat_prompt, oracle_scores
from kvzap.training import collect, fit
from kvzap.training.collect import collect_split, sample_positions
from kvzap.training.shards import ShardRows, read_shard
from oracle_data import RECORD, SETTINGS, tiny_prompts, write_split
from tiny_models import tiny_model, tiny_tokenizer

TOKENS, SEED = 10, 1


def _collect(folder, family="llama", n_prompts=3, store_kv=True, prompts=None):
    tok = tiny_tokenizer()
    model = tiny_model(family, len(tok))
    manifest = collect_split(
        model,
        tok,
        prompts or tiny_prompts(n_prompts),
        folder,
        SETTINGS,
        tokens_per_prompt=TOKENS,
        shard_tokens=15,
        seed=SEED,
        model_record=RECORD,
        store_kv=store_kv,
    )
    return manifest, model, tok


def _all_rows(folder):
    loaded = [read_shard(path) for path in fit.shards(folder)]
    return {name: torch.cat([shard[name] for shard in loaded]) for name in loaded[0]}


def _rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _expected_kv(model, prompt, positions):
    """[k; v] per layer from the residual stream: RMSNorm, projections, (Qwen3) k-norm, RoPE written out here."""
    cfg = model.config
    d = cfg.head_dim
    ids = prompt.input_ids[:, : prompt.context.stop]
    streams = model.model(input_ids=ids, output_hidden_states=True).hidden_states  # layer l's input at [l]
    t = torch.arange(ids.shape[1], dtype=torch.float64)
    inv_freq = 1.0 / cfg.rope_parameters["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.cat([t[:, None] * inv_freq] * 2, dim=-1)  # (T, d)
    cos, sin = angles.cos()[:, None].float(), angles.sin()[:, None].float()
    rows = prompt.context.start + positions
    out = []
    for layer, stream in zip(model.model.layers, streams):
        attn = layer.self_attn
        x = _rms_norm(stream[0], layer.input_layernorm.weight, cfg.rms_norm_eps)
        k = (x @ attn.k_proj.weight.T).view(len(x), -1, d)
        v = (x @ attn.v_proj.weight.T).view(len(x), -1, d)
        if hasattr(attn, "k_norm"):
            k = _rms_norm(k, attn.k_norm.weight, cfg.rms_norm_eps)
        k = k * cos + torch.cat([-k[..., d // 2 :], k[..., : d // 2]], dim=-1) * sin
        out.append(torch.cat([k, v], dim=-1)[rows])  # (n, H, 2d)
    return torch.stack(out, dim=1)  # (n, L, H, 2d)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_stored_kv_equals_an_independent_recomputation(tmp_path, family):
    _, model, tok = _collect(tmp_path, family, n_prompts=2)
    rows = _all_rows(tmp_path)
    cfg = model.config
    assert rows["kv"].shape == (2 * TOKENS, cfg.num_hidden_layers, cfg.num_key_value_heads, 2 * cfg.head_dim)
    assert rows["kv"].dtype == rows["h"].dtype == torch.float32  # the model's dtype
    for index, prompt_text in enumerate(tiny_prompts(2)):
        prompt = build_repeat_prompt(tok, prompt_text.text)
        positions = sample_positions(prompt.context.stop - prompt.context.start, TOKENS, SEED, index)
        with torch.no_grad():
            expected = _expected_kv(model, prompt, positions)
        torch.testing.assert_close(rows["kv"][rows["prompt"] == index], expected, rtol=1e-4, atol=1e-5)


def test_kv_is_stored_in_the_model_dtype():
    tok = tiny_tokenizer()
    model = tiny_model("qwen3", len(tok)).to(torch.bfloat16)
    prompt = build_repeat_prompt(tok, tiny_prompts(1)[0].text)
    scores = oracle_scores(model, prompt, keep_positions=torch.tensor([0, 3, 7]), keep_kv=True)
    assert scores.kv.dtype == torch.bfloat16 and scores.kv.shape == (2, 2, 3, 32)


def test_keep_kv_needs_positions():
    tok = tiny_tokenizer()
    with pytest.raises(ValueError, match="keep_kv=True needs keep_positions"):
        oracle_scores(tiny_model("llama", len(tok)), build_repeat_prompt(tok, "some context"), keep_kv=True)


def _count_oracle_calls(monkeypatch):
    calls = []
    real = collect.oracle_scores

    def counted(*args, **kwargs):
        calls.append(kwargs.get("keep_kv"))
        return real(*args, **kwargs)

    monkeypatch.setattr(collect, "oracle_scores", counted)
    return calls


def _shard_bytes(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.glob("shard-*"))}


def test_store_kv_is_part_of_the_resume_key(tmp_path, monkeypatch):
    _collect(tmp_path, store_kv=False)
    without = _shard_bytes(tmp_path)
    assert "store_kv" not in json.loads((tmp_path / "settings.json").read_text())  # older collections still resume
    calls = _count_oracle_calls(monkeypatch)
    _collect(tmp_path, store_kv=True)
    assert calls == [True] * 3  # nothing taken from the kv-less shards
    with_kv = _shard_bytes(tmp_path)
    assert all("kv" in read_shard(tmp_path / name) for name in with_kv)

    (tmp_path / "shard-00001.safetensors").unlink()  # killed before the last shard: resumes, same bytes
    calls.clear()
    _collect(tmp_path, store_kv=True)
    assert len(calls) == 1 and _shard_bytes(tmp_path) == with_kv

    calls.clear()
    _collect(tmp_path, store_kv=False)
    assert calls == [False] * 3 and _shard_bytes(tmp_path) == without


def test_shards_without_kv_train_as_before(tmp_path):
    """kv-less shards keep exactly h / y / prompt; the h ridge and the MLP reader are unchanged by a kv tensor."""
    _collect(tmp_path / "plain", store_kv=False)
    _collect(tmp_path / "kv", store_kv=True)
    plain, with_kv = _all_rows(tmp_path / "plain"), _all_rows(tmp_path / "kv")
    assert set(plain) == {"h", "y", "prompt"}
    for name in plain:
        assert torch.equal(plain[name], with_kv[name])
    cpu = torch.device("cpu")
    for a, b in zip(
        fit.fit_ridge(tmp_path / "plain", device=cpu).state_dict().values(),
        fit.fit_ridge(tmp_path / "kv", device=cpu).state_dict().values(),
    ):
        assert torch.equal(a, b)
    kv_rows = ShardRows(fit.shards(tmp_path / "kv"))
    kv_rows.verify()
    index = np.array([29, 0, 17])
    assert torch.equal(kv_rows.gather("kv", index), with_kv["kv"][torch.from_numpy(index)])
    _, history = fit.fit_mlp(tmp_path / "kv", tmp_path / "mlp", epochs=1, batch_size=8, hidden_dim=4, device=cpu)
    assert len(history) == 1 and np.isfinite(history[0]["valid_loss"])


def test_corrupted_kv_bytes_fail_the_checksum(tmp_path):
    _collect(tmp_path, n_prompts=1)
    path = tmp_path / "shard-00000.safetensors"
    shard = read_shard(path)
    raw = bytearray(path.read_bytes())
    at = bytes(raw).index(shard["kv"][3].numpy().tobytes())  # a row of kv, wherever safetensors put it
    raw[at : at + 8] = b"\x00\x00\xc0\x7f" * 2  # two NaNs
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="shard-00000.*sha256"):
        read_shard(path)


def _synthetic_kv_split(folder, n, seed, layers=2, heads=3, kv_dim=8, shard=50):
    """Shards whose y[:, l, h] = kv[:, l, h] . w_lh - 7 + noise (w the same for every seed), written as
    kvzap.training.collect --store-kv writes them."""
    w = torch.randn(layers, heads, kv_dim, generator=torch.Generator().manual_seed(1234))
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(n, layers, heads, kv_dim, generator=g) * 2 + 0.5
    y = torch.einsum("nlhd,lhd->nlh", kv, w) - 7 + 0.5 * torch.randn(n, layers, heads, generator=g)
    h = torch.randn(n, layers, 6, generator=g)
    rows = {"h": h, "y": y, "kv": kv, "prompt": torch.arange(n)}
    write_split(
        folder,
        rows,
        shard,
        hidden_size=6,
        n_kv_heads=heads,
        n_layers=layers,
        n_pairs=n,
        params_hash=f"synthetic-{seed}",
        model_id="synthetic",
        model_revision="none",
    )
    return kv, y


def test_kv_ridge_equals_scikit_learn_per_head(tmp_path, monkeypatch):
    from sklearn.linear_model import Ridge

    monkeypatch.setattr(kv_input, "ROW_CHUNK", 16)  # several batches per shard, several shards
    kv, y = _synthetic_kv_split(tmp_path / "train", n=130, seed=0)
    test_kv, test_y = _synthetic_kv_split(tmp_path / "test", n=40, seed=1)
    weight, bias = kv_input.fit_kv_ridge(tmp_path / "train", alpha=2.5, device=torch.device("cpu"))
    y_true, y_pred = kv_input.predict_kv(weight, bias, tmp_path / "test")
    assert torch.equal(y_true, test_y.double())
    for layer in range(2):
        for head in range(3):
            ref = Ridge(alpha=2.5).fit(kv[:, layer, head].double().numpy(), y[:, layer, head].double().numpy())
            np.testing.assert_allclose(weight[layer, head].numpy(), ref.coef_, rtol=1e-8, atol=1e-10)
            assert bias[layer, head].item() == pytest.approx(ref.intercept_, rel=1e-8)
            np.testing.assert_allclose(
                y_pred[:, layer, head].numpy(), ref.predict(test_kv[:, layer, head].double().numpy()), rtol=1e-8
            )


def test_entry_point_writes_both_rows(tmp_path, monkeypatch):
    _synthetic_kv_split(tmp_path / "data" / "train", n=130, seed=0)
    _synthetic_kv_split(tmp_path / "data" / "test", n=40, seed=1)
    monkeypatch.setattr(
        sys, "argv", ["kv_ablation", "--data", str(tmp_path / "data"), "--alpha", "2.5", "--out", str(tmp_path / "out")]
    )
    kv_input.main()
    result = json.loads((tmp_path / "out" / "kv_ablation.json").read_text())
    assert result["params"] == {"alpha": 2.5, "data": "synthetic-0"} and result["git_commit"]
    assert result["model_id"] == "synthetic" and result["n_test_pairs"] == 40
    rows = {row["input"]: row for row in result["rows"]}
    assert list(rows) == ["h", "kv"]
    h_model = fit.fit_ridge(tmp_path / "data" / "train", alpha=2.5, device=torch.device("cpu"))
    assert rows["h"]["r2"] == fit.squared_pearson(*fit.predict(h_model, tmp_path / "data" / "test")[:2]).tolist()
    for row in rows.values():
        assert np.array(row["r2"]).shape == (2, 3) and row["r2_mean"] == pytest.approx(np.mean(row["r2"]))
    # y is linear in kv and independent of h here: the kv ridge must win by far
    assert rows["kv"]["r2_mean"] > 0.9 > 0.3 > rows["h"]["r2_mean"]
    # and the pipeline's table reads what the entry point wrote
    from kvzap.report.aggregate import kv_ablation_table

    table = kv_ablation_table([tmp_path / "out" / "kv_ablation.json"])
    assert table["input"].tolist() == ["h", "kv"] and table["n_test_pairs"].tolist() == [40, 40]
    assert table["r2_ci_low"].tolist() == [round(rows[k]["r2_mean_ci"][0], 4) for k in ("h", "kv")]


def test_ablation_refuses_shards_without_kv(tmp_path):
    _collect(tmp_path / "train", n_prompts=1, store_kv=False)
    with pytest.raises(ValueError, match=r"shard-00000.safetensors holds no keys/values.*--store-kv"):
        kv_input.fit_kv_ridge(tmp_path / "train", device=torch.device("cpu"))


def test_ridge_on_no_pairs_is_refused():
    from pathlib import Path

    with pytest.raises(ValueError, match=r"empty-split holds no oracle pairs.*rerun the oracle stage"):
        fit.ridge_solve(iter([]), 1.0, Path("empty-split"))
