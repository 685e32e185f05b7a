"""Hybrid sliding-window models: the oracle, the collection, both surrogates and their checks over the full-attention
layers only; the sliding-window layers are skipped (their bounded cache is not KVzap's to prune).

A tiny Gemma 3 with layers [sliding, full, sliding, full] and a 16-token window, far shorter than the prompts.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from kvpress.presses.kvzap_press import KVzapModel
from transformers import DynamicCache

from family_models import build
from kvzap import publish
from kvzap.ablations import training_data
from kvzap.oracle.attention import LayerScorer
from kvzap.oracle.scores import build_repeat_prompt, oracle_scores
from kvzap.pruning import SurrogateScorerPress
from kvzap.pruning.calibration import collect_scores
from kvzap.report import figures
from kvzap.surrogate.model import Surrogate
from kvzap.training import fit
from kvzap.training.collect import collect_split
from kvzap.training.corpus import Prompt
from kvzap.training.shards import read_shard
from oracle_reference import eager_log_kvzip_plus
from tiny_models import TEXT, tiny_model, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

SLIDING, FULL = "sliding_attention", "full_attention"
LAYERS = [SLIDING, FULL, SLIDING, FULL]
SCORED, SKIPPED = [1, 3], [0, 2]
WINDOW = 16
RECORD = {"model_id": "tiny/hybrid", "revision": "none"}


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def hybrid(tok, window: int = WINDOW):
    return build("gemma3_text", len(tok), num_hidden_layers=len(LAYERS), layer_types=LAYERS, sliding_window=window)


def test_oracle_scores_the_full_layers_as_eager_attention_does(tok, monkeypatch):
    model = hybrid(tok)
    prompt = build_repeat_prompt(tok, TEXT[:200])
    assert prompt.repeat.stop > 4 * WINDOW
    observed = []
    score = LayerScorer._score
    monkeypatch.setattr(LayerScorer, "_score", lambda self, layer, *a: observed.append(layer) or score(self, layer, *a))
    keep = torch.tensor([0, 5, 9])
    ours = oracle_scores(model, prompt, keep_positions=keep, query_chunk=16, keep_kv=True)
    assert ours.layers == SCORED and set(observed) == set(SCORED)  # skipped layers are never scored
    n_ctx = prompt.context.stop - prompt.context.start
    assert ours.kvzip_plus_log.shape == (2, 2, n_ctx) and ours.hidden.shape == (2, 3, 128)
    assert ours.kv.shape[:3] == (2, 2, 3)
    reference, inputs = eager_log_kvzip_plus(model, prompt)  # one forward of the whole prompt: the model's masks
    error = (ours.kvzip_plus_log - reference[SCORED]).abs().max().item()
    print(f"gemma3_text, window {WINDOW}: max |log KVzip+ - eager| over the full layers = {error:.1e}")
    assert error <= 1e-3
    torch.testing.assert_close(ours.hidden, inputs[SCORED][:, prompt.context][:, keep])

    wide = oracle_scores(hybrid(tok, window=4096), prompt, query_chunk=16)  # the window does change the scores
    assert (wide.kvzip_plus_log - ours.kvzip_plus_log).abs().max() > 0.1


def test_a_full_layer_cache_runs_the_model_own_sliding_forward(tok):
    """The oracle's DynamicCache holds every key, yet the sliding layers see their window: a prefill then the rest on
    the model's own (sliding) cache gives the logits of one forward on a full-layer cache."""
    model = hybrid(tok)
    ids = build_repeat_prompt(tok, TEXT[:200]).input_ids
    own = DynamicCache(config=model.config)
    model(ids[:, :40], past_key_values=own)
    assert type(own.layers[0]).__name__ == "DynamicSlidingWindowLayer"
    tail = model(ids[:, 40:], past_key_values=own).logits
    torch.testing.assert_close(tail, model(ids, past_key_values=DynamicCache()).logits[:, 40:], atol=1e-5, rtol=1e-5)


def test_a_model_whose_every_layer_slides_is_refused(tok):
    model = build("gemma3_text", len(tok), layer_types=[SLIDING, SLIDING], sliding_window=WINDOW)
    with pytest.raises(NotImplementedError, match="cannot score gemma3_text models: every layer is sliding-window"):
        oracle_scores(model, build_repeat_prompt(tok, TEXT[:100]))


def _collect(model, tok, data, counts=(("train", 6), ("test", 2))) -> dict:
    manifests = {}
    for split, n in counts:
        prompts = [Prompt("s", i, TEXT[i * 17 : i * 17 + 160]) for i in range(n)]
        manifests[split] = collect_split(model, tok, prompts, data / split, {"split": split}, 12, 40, 1, RECORD)
    return manifests


def _train(kind: str, data, out, monkeypatch) -> None:
    settings = (
        ["--alpha", "1"]
        if kind == "linear"
        else ["--epochs", "2", "--lr", "5e-3", "--batch-size", "16", "--valid-split", "pairs", "--keep", "last"]
    )
    argv = ["train", "--kind", kind, "--data", str(data), "--out", str(out), "--seed", "0", *settings]
    monkeypatch.setattr(sys, "argv", [*argv, *(["--hidden-dim", "8"] if kind == "mlp" else [])])
    fit.main()


@pytest.fixture(scope="module")
def trained(tok, tmp_path_factory):
    """Oracle data of the hybrid, and both surrogates trained on it by the training CLI."""
    root = tmp_path_factory.mktemp("hybrid")
    model = hybrid(tok)
    manifests = _collect(model, tok, root / "data")
    with pytest.MonkeyPatch.context() as patch:
        for kind in ("linear", "mlp"):
            _train(kind, root / "data", root / "surrogates" / kind, patch)
    return model, manifests, root


def test_collection_holds_the_scored_layers(trained):
    _, manifests, root = trained
    manifest = manifests["train"]
    assert manifest["n_layers"] == 4 and manifest["layers"] == SCORED
    assert manifest["params"]["skipped_layers"] == SKIPPED  # data of every layer (older kvzap) would not resume
    shard = read_shard(root / "data" / "train" / manifest["shards"][0]["file"])
    assert shard["h"].shape[1:] == (2, 128) and shard["y"].shape[1:] == (2, 2)


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_surrogate_keeps_a_zero_module_per_skipped_layer(trained, kind):
    model, _, root = trained
    folder = root / "surrogates" / kind
    surrogate = Surrogate.from_pretrained(folder)
    assert surrogate.n_modules == 4 and surrogate.skipped_layers == SKIPPED and surrogate.scored == SCORED
    assert json.loads((folder / "config.json").read_text())["skipped_layers"] == SKIPPED
    for i, module in enumerate(surrogate.layers):
        assert all(bool((p == 0).all()) == (i in SKIPPED) for p in module.parameters()), i
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["layers"] == SCORED and torch.tensor(metrics["r2"]).shape == (2, 2)
    surrogate.check_matches(model.config)
    assert publish.verified_metrics(folder)["layers"] == SCORED

    theirs = KVzapModel.from_pretrained(folder)  # kvpress indexes the modules by decoder layer
    h = torch.randn(3, 4, 128)
    torch.testing.assert_close(theirs(h)[:, SCORED], surrogate(h[:, SCORED]))
    assert not theirs(h)[:, SKIPPED].any()


def test_ridge_module_of_a_layer_fits_that_layer(trained):
    _, manifests, root = trained
    shards = [read_shard(root / "data" / "train" / s["file"]) for s in manifests["train"]["shards"]]
    h, y = torch.cat([s["h"] for s in shards]).double(), torch.cat([s["y"] for s in shards]).double()
    weight, bias = fit.ridge_solve([(h[:, 1], y[:, 1])], 1.0, "layer 3")  # the shards' second row: decoder layer 3
    linear = Surrogate.from_pretrained(root / "surrogates" / "linear").layers[3]
    torch.testing.assert_close(linear.weight.double(), weight.T, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(linear.bias.double(), bias, rtol=1e-4, atol=1e-5)


def test_a_surrogate_with_other_skipped_layers_is_refused(trained, tok):
    model, _, _ = trained
    with pytest.raises(ValueError, match=r"skips layers \[0\], but the model's sliding-window layers .* are \[0, 2\]"):
        Surrogate(128, 2, 4, skipped_layers=[0]).check_matches(model.config)
    with pytest.raises(ValueError, match=r"skips layers \[\], but .* are \[0, 2\]"):
        Surrogate(128, 2, 4).check_matches(model.config)  # e.g. one trained on every layer
    plain = tiny_model("llama", len(tok))
    with pytest.raises(ValueError, match=r"skips layers \[1\], but .* are \[\]"):
        Surrogate(64, 2, 2, skipped_layers=[1]).check_matches(plain.config)


def test_model_card_and_figure_name_the_real_layers(trained, tmp_path):
    _, _, root = trained
    entry = publish.build_model_repo(root / "surrogates" / "mlp", tmp_path, "me", [], None, "apache-2.0")
    card = (tmp_path / "models" / entry["repo_id"].split("/")[-1] / "README.md").read_text()
    assert "| 1 |" in card and "| 3 |" in card and "| 0 |" not in card and "Layers 0, 2 are sliding-window" in card
    out = tmp_path / "fit.png"
    figures.surrogate_fit({}, out, [("hybrid", root / "surrogates" / "linear", root / "surrogates" / "mlp")])
    assert out.exists()


def test_a_config_skipping_impossible_layers_is_refused(tmp_path):
    Surrogate(16, 2, 3, skipped_layers=[1]).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "skipped_layers": [0, 3]}))
    with pytest.raises(ValueError, match="skipped_layers must be distinct layer indices below n_modules"):
        Surrogate.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="not all of them"):
        Surrogate(16, 2, 2, skipped_layers=[0, 1])


def test_models_without_skipped_layers_keep_their_records(tok, tmp_path):
    manifests = _collect(tiny_model("llama", len(tok)), tok, tmp_path, counts=(("train", 1),))
    assert "layers" not in manifests["train"] and "skipped_layers" not in manifests["train"]["params"]
    Surrogate(64, 2, 2).save_pretrained(tmp_path / "s")
    assert "skipped_layers" not in json.loads((tmp_path / "s" / "config.json").read_text())


def test_training_ablation_calibrates_on_what_a_press_judges(trained, tok):
    """The training-data ablation's recorded prefill judges the full layers, as a press on the hybrid does."""
    model, _, root = trained
    surrogate = Surrogate.from_pretrained(root / "surrogates" / "mlp")
    ids = [tok(TEXT[:n], return_tensors="pt")["input_ids"] for n in (700, 900)]
    press = SurrogateScorerPress(surrogate=surrogate, check_base_model=False)
    reference = collect_scores(model, ids, press, training_data.WINDOW)
    ours = training_data.score_samples(surrogate, training_data.attention_inputs(model, ids))
    for a, b in zip(reference, ours, strict=True):
        assert a.entries_per_layer == b.entries_per_layer and len(b.layer_scores) == len(SCORED)
        for x, y in zip(a.layer_scores, b.layer_scores, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
