"""Surrogate checkpoints: round trip, interop with kvpress's KVzapModel, clear errors."""

import json

import pytest
import torch
from kvpress.presses.kvzap_press import KVzapModel

from kvzap.surrogate.model import Surrogate


@pytest.mark.parametrize("hidden_dim", [None, 8])
def test_round_trip_and_kvpress_loads_ours(tmp_path, hidden_dim):
    torch.manual_seed(0)
    model = Surrogate(input_dim=32, output_dim=2, n_modules=3, hidden_dim=hidden_dim)
    model.save_pretrained(tmp_path)
    x = torch.randn(5, 3, 32)
    ours = Surrogate.from_pretrained(tmp_path)
    theirs = KVzapModel.from_pretrained(tmp_path)
    torch.testing.assert_close(ours(x), model(x))
    torch.testing.assert_close(theirs(x), model(x))
    config = json.loads((tmp_path / "config.json").read_text())
    assert {k: config[k] for k in ("input_dim", "output_dim", "hidden_dim", "n_modules")} == {
        "input_dim": 32,
        "output_dim": 2,
        "hidden_dim": hidden_dim,
        "n_modules": 3,
    }


def test_we_load_kvpress_checkpoints(tmp_path):
    from kvpress.presses.kvzap_press import KVzapConfig

    theirs = KVzapModel(KVzapConfig(input_dim=16, output_dim=2, n_modules=2, hidden_dim=4))
    theirs.save_pretrained(tmp_path)
    x = torch.randn(4, 2, 16)
    torch.testing.assert_close(Surrogate.from_pretrained(tmp_path)(x), theirs(x))


def test_score_layer_shape():
    model = Surrogate(16, 2, 3)
    assert model.score_layer(1, torch.randn(1, 7, 16)).shape == (1, 2, 7)


def test_truncated_weights_named_in_error(tmp_path):
    Surrogate(16, 2, 2).save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:50])
    with pytest.raises(ValueError, match="model.safetensors"):
        Surrogate.from_pretrained(tmp_path)


def test_missing_checkpoint_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        Surrogate.from_pretrained(tmp_path)


def test_dimension_mismatch_is_explained():
    from tiny_models import tiny_config

    with pytest.raises(ValueError, match="does not match"):
        Surrogate(32, 2, 2).check_matches(tiny_config("llama", 100))


def test_scores_are_float32_whatever_the_models_dtype():
    """A bfloat16 model's attention inputs are scored by the float32 surrogate, which is never cast: not even a layer
    moved `in_place` (a press's own surrogate) loses precision, so a later float32 model scores as a fresh load."""
    torch.manual_seed(0)
    model = Surrogate(16, 2, 2, hidden_dim=4)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    h = torch.randn(1, 5, 16)
    scores = model.score_layer(0, h.bfloat16())
    assert scores.dtype == torch.float32
    assert torch.equal(scores, model.score_layer(0, h.bfloat16().float()))  # only the input was rounded
    assert model.layer_like(1, h.bfloat16(), in_place=True) is model.layers[1]
    assert all(torch.equal(v, original[k]) for k, v in model.state_dict().items())


def test_the_class_imports_from_its_package_and_the_settings_stay_torch_free():
    import subprocess
    import sys

    from kvzap.surrogate import Surrogate as FromPackage

    assert FromPackage is Surrogate
    check = "import sys, kvzap.surrogate.settings; assert 'torch' not in sys.modules, 'torch imported'"
    assert subprocess.run([sys.executable, "-c", check], capture_output=True).returncode == 0
