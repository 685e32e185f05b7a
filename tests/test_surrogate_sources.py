"""Where a surrogate comes from: a path is never sent to the Hub, and one trained for another model is refused."""

from pathlib import Path

import huggingface_hub
import pytest
import torch
from kvpress.presses.kvzap_press import KVzapConfig, KVzapModel

from kvzap.pruning import KVzapPress
from kvzap.pruning.scorer_presses import SurrogateScorerPress
from kvzap.surrogate.model import Surrogate
from tiny_models import tiny_model

TINY = dict(input_dim=64, output_dim=2, n_modules=2)  # tiny_model's hidden size, kv heads, layers


@pytest.fixture
def no_hub(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"went to the Hub with {args}")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    """snapshot_download serving folders saved under tmp_path/hub/<org>/<name>; records what was asked."""
    asked = []

    def download(repo_id, revision=None, allow_patterns=None):
        asked.append(repo_id)
        return str(tmp_path / "hub" / repo_id)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    return asked


@pytest.mark.parametrize(
    "name",
    [
        "{tmp}/trained/surrogate",
        "./not-there",
        "~/no-such-kvzap-surrogate",
        "results/Qwen3-8B/surrogates/mlp",
        "results/mlp",
    ],
)
def test_missing_folder_is_not_sent_to_the_hub(name, tmp_path, monkeypatch, no_hub):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()  # "results/mlp" is org/name-shaped, but results/ is a local folder
    name = name.format(tmp=tmp_path)
    weights = Path(name) / "model.safetensors"
    expected = rf"Surrogate folder {name} does not exist: train it first \(snakemake {weights}\)"
    with pytest.raises(FileNotFoundError, match=expected + r" or pass a Hub id"):
        Surrogate.from_pretrained(name)
    with pytest.raises(FileNotFoundError, match=expected):  # at construction, before any model is loaded
        KVzapPress(name, threshold=-4.0)


def test_folder_without_weights_says_how_to_make_them(tmp_path, no_hub):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"lacks model.safetensors: train it first \(snakemake "):
        Surrogate.from_pretrained(tmp_path)


def test_only_org_slash_name_is_a_hub_id(tmp_path, monkeypatch):
    from kvzap.surrogate.model import is_hub_id

    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    assert is_hub_id("nvidia/KVzap-mlp-Qwen3-8B") and is_hub_id("me/my.surrogate_v2")
    for path in ("results/mlp", "a/b/c", "./x", "/x/y", "~/x", "plain-name", "org/-bad", "org/na me", ""):
        assert not is_hub_id(path), path


def test_hub_id_goes_to_the_hub(tmp_path, fake_hub):
    torch.manual_seed(0)
    Surrogate(**TINY).save_pretrained(tmp_path / "hub" / "me" / "surrogate")
    assert Surrogate.from_pretrained("me/surrogate").n_modules == 2
    assert fake_hub == ["me/surrogate"]


def _saved(folder: Path, base_model: str | None) -> str:
    Surrogate(**TINY).save_pretrained(folder, extra_config={"base_model": base_model} if base_model else None)
    return str(folder)


def _named_model(kvzap_model_id=None, name_or_path=""):
    model = tiny_model("llama")
    model.config.name_or_path = name_or_path
    if kvzap_model_id:
        model.config.kvzap_model_id = kvzap_model_id
    return model


def test_surrogate_for_another_model_is_refused(tmp_path):
    press = KVzapPress(_saved(tmp_path, "Qwen/Qwen3-8B"), threshold=-4.0)
    with pytest.raises(
        ValueError,
        match=r"trained for Qwen/Qwen3-8B, but the model is meta-llama/Llama-3.1-8B"
        r"-Instruct: .* check_base_model=False",
    ):
        with press(_named_model("meta-llama/Llama-3.1-8B-Instruct")):
            pass


@pytest.mark.parametrize(
    "model_kwargs",
    [
        dict(name_or_path="meta-llama/Llama-3.1-8B-Instruct"),  # a Hub name_or_path is the identity
        dict(kvzap_model_id="meta-llama/Llama-3.1-8B-Instruct", name_or_path="{tmp}"),  # the id wins over a folder
        dict(name_or_path="{tmp}"),  # a local folder: its name is the identity
    ],
)
def test_identity_from_hub_name_or_kvzap_model_id(tmp_path, model_kwargs):
    model_kwargs = {k: v.format(tmp=tmp_path) for k, v in model_kwargs.items()}
    press = KVzapPress(_saved(tmp_path / "s", "Qwen/Qwen3-8B"), threshold=-4.0)
    with pytest.raises(ValueError, match="trained for Qwen/Qwen3-8B"):
        with press(_named_model(**model_kwargs)):
            pass


@pytest.mark.parametrize(
    "base_model, model_kwargs",
    [
        ("Qwen/Qwen3-8B", dict(kvzap_model_id="Qwen/Qwen3-8B", name_or_path="/some/local/folder")),
        ("Qwen/Qwen3-8B", dict(name_or_path="{tmp}/Qwen3-8B")),  # a local folder named as the model
        ("Qwen/Qwen3-8B", dict()),  # empty name_or_path: unknown
        (None, dict(kvzap_model_id="meta-llama/Llama-3.1-8B-Instruct")),  # surrogate's base model unknown
    ],
)
def test_matching_or_unknown_identities_are_accepted(tmp_path, base_model, model_kwargs):
    model_kwargs = {k: v.format(tmp=tmp_path) for k, v in model_kwargs.items()}
    press = KVzapPress(_saved(tmp_path / "s", base_model), threshold=-4.0)
    with press(_named_model(**model_kwargs)):
        pass
    assert press.scorer.surrogate.base_model == base_model


def test_escape_hatch_accepts_a_renamed_model(tmp_path):
    folder = _saved(tmp_path, "Qwen/Qwen3-8B")
    model = _named_model("my-org/Qwen3-8B-renamed")
    with KVzapPress(folder, threshold=-4.0, check_base_model=False)(model):
        pass
    scorer = SurrogateScorerPress(surrogate_path=folder)
    press = KVzapPress(scorer, threshold=-4.0, check_base_model=False)
    with press(model):
        pass
    assert scorer.check_base_model  # the caller's scorer is not changed
    with pytest.raises(ValueError, match="check_base_model=False"):
        with KVzapPress(scorer, threshold=-4.0)(model):
            pass


@pytest.mark.parametrize(
    "model_id, accepted",
    [("Qwen/Qwen3-8B", True), ("qwen/qwen3-8b", True), ("meta-llama/Llama-3.1-8B-Instruct", False)],
)
def test_nvidia_checkpoints_are_checked_by_their_repo_name(tmp_path, fake_hub, model_id, accepted):
    """nvidia/KVzap-* config.json records no base model (KVzapConfig has none): kvpress's naming rule does."""
    KVzapModel(KVzapConfig(**TINY)).save_pretrained(tmp_path / "hub" / "nvidia" / "KVzap-linear-Qwen3-8B")
    press = KVzapPress("nvidia/KVzap-linear-Qwen3-8B", threshold=-4.0)
    model = _named_model(model_id)
    if accepted:
        with press(model):
            pass
    else:
        with pytest.raises(ValueError, match="trained for Qwen3-8B, but the model is meta-llama/Llama-3.1-8B-Instruct"):
            with press(model):
                pass
