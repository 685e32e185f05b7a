"""Hostile use of the library and its command lines: every call works or stops with one clear message.

Like tests/test_config_hostile.py for configs: each case asserts the exact outcome, a working result or the
message (its key words). Tiny random models (tests/tiny_models.py), so the whole file runs in seconds.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from kvpress import KnormPress
from transformers import DynamicCache

from kvzap import publish
from kvzap.plan import __main__ as plan_cli
from kvzap.pruning import KVzapPress, PrecomputedScorerPress, TopKPerHeadPress, TopKPerLayerPress, held_kv_bytes
from kvzap.pruning.calibration import ScoreSample, calibrate
from kvzap.pruning.scorer_presses import SurrogateScorerPress
from kvzap.surrogate.model import Surrogate
from kvzap.training import calibrate as calibration_cli
from surrogate_folders import make_surrogate
from tiny_models import tiny_model, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 8


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 400, (1, n), generator=torch.Generator().manual_seed(seed))


def _surrogate(seed: int = 1) -> Surrogate:
    torch.manual_seed(seed)
    return Surrogate(64, 2, 2).eval()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("surrogate") / "s"
    _surrogate().save_pretrained(path)
    return str(path)


@pytest.fixture
def model():
    return tiny_model("llama")


def _press(folder, **kwargs):
    return KVzapPress(folder, kwargs.pop("threshold", 0.0), kwargs.pop("window", WINDOW), **kwargs)


def _prefill(model, press, n: int = 40):
    cache = DynamicCache()
    with press(model):
        logits = model(_ids(n), past_key_values=cache).logits
    return logits, cache


def _cli(main, *argv: str) -> None:
    """Run a CLI's main as the shell would (sys.argv), so the same call works for every main."""
    saved = sys.argv
    sys.argv = ["prog", *map(str, argv)]
    try:
        main()
    finally:
        sys.argv = saved


def _stops(main, *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        _cli(main, *argv)
    assert isinstance(info.value.code, str), "stopped without a message"
    assert "\n" not in info.value.code
    return info.value.code


# ---- press constructors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda f: KVzapPress(f, -4.0), (-4.0, 128)),  # as documented, positionally as DMSPress
        (lambda f: KVzapPress(f, np.float32(-4.0), np.int64(64)), (-4.0, 64)),  # numbers from numpy / a config
        (lambda f: KVzapPress(f, float("inf")), (float("inf"), 128)),  # keeps the window only
    ],
)
def test_constructor_accepts_numbers(folder, make, expected):
    press = make(folder)
    assert (press.threshold, press.window) == expected and type(press.window) is int


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda f: KVzapPress(f, -4.0, evict="no"), ValueError, "evict must be True or False, got 'no'"),
        (lambda f: KVzapPress(f, -4.0, check_base_model="no"), ValueError, "check_base_model must be True or False"),
        (lambda f: KVzapPress(f, -4.0, 128, 1), ValueError, "decoding must be True or False, got 1"),
        (lambda f: KVzapPress(f, "-4"), ValueError, "threshold must be a number"),
        (lambda f: KVzapPress(f, -4.0, 12.5), ValueError, "window must be an integer >= 0"),
        (lambda f: KVzapPress(f, -4.0, prefill_chunk=0), ValueError, "prefill_chunk must be None or an integer"),
        (lambda f: KVzapPress(f + "-missing", -4.0), FileNotFoundError, "does not exist: train it first"),
        (lambda f: KVzapPress(42, -4.0), TypeError, "scorer must be a kvpress ScorerPress or a surrogate path"),
        (lambda f: KVzapPress(KVzapPress(f, 0.0), -4.0), TypeError, "scorer must be a kvpress ScorerPress"),
        (lambda f: TopKPerHeadPress(f, 1.0), ValueError, "ratio must be a number in [0, 1)"),
        (lambda f: TopKPerLayerPress(f, 0.5, safeguard=3), ValueError, "safeguard must be a number in [0, 1]"),
        (lambda f: SurrogateScorerPress(surrogate=f), TypeError, "surrogate must be a kvzap Surrogate"),
        (lambda f: PrecomputedScorerPress(), ValueError, "scores must be a (layers, kv_heads, T)"),
        (lambda f: PrecomputedScorerPress(scores=torch.zeros(2, 40)), ValueError, "got (2, 40)"),
        (lambda f: PrecomputedScorerPress(scores=torch.full((2, 2, 4), torch.nan)), ValueError, "without NaN"),
        (lambda f: PrecomputedScorerPress(scores=torch.zeros(2, 2, 4), offset=-1), ValueError, "offset must be"),
    ],
)
def test_constructor_refuses(folder, make, error, message):
    with pytest.raises(error) as info:
        make(folder)
    assert message in str(info.value)


# ---- entering a press ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target, message",
    [
        (lambda m: None, "takes a transformers causal LM"),
        (lambda m: "Qwen/Qwen3-8B", "takes a transformers causal LM"),
        (lambda m: m.model, "takes a transformers causal LM"),  # the decoder, not the CausalLM
    ],
)
def test_entry_refuses_what_is_not_a_model(folder, model, target, message):
    with pytest.raises(TypeError, match=message):
        with _press(folder)(target(model)):
            pass


def test_entry_refuses_weights_not_loaded(folder):
    with torch.device("meta"):
        model = tiny_model("llama")
    with pytest.raises(ValueError, match="meta device"):
        with _press(folder)(model):
            pass


def test_entry_refuses_a_surrogate_of_another_shape(model, tmp_path):
    Surrogate(32, 2, 2).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="does not match the model's"):
        with _press(str(tmp_path))(model):
            pass


def test_entry_refuses_precomputed_scores_of_another_model(model):
    press = KVzapPress(PrecomputedScorerPress(scores=torch.zeros(5, 2, 40)), 0.0, WINDOW)
    with pytest.raises(ValueError, match=r"\(layers, kv_heads\) = \(5, 2\), the model \(2, 2\)"):
        _prefill(model, press)


def test_two_presses_do_not_nest(folder, model):
    outer, inner = _press(folder), _press(folder, threshold=1.0)
    with pytest.raises(RuntimeError, match="KVzapPress is already active on this model: presses do not nest"):
        with outer(model), inner(model):
            pass


def test_the_same_press_does_not_nest(folder, model):
    press = _press(folder, decoding=True)
    with pytest.raises(RuntimeError, match="already active on a model: leave its `with` block first"):
        with press(model), press(model):
            model.generate(_ids(40), max_new_tokens=3)


def test_one_press_is_not_active_on_two_models(folder, model):
    press = _press(folder)
    with pytest.raises(RuntimeError, match="already active on a model"):
        with press(model), press(tiny_model("llama")):
            pass


def test_no_press_inside_a_kvpress_press(folder, model):
    with pytest.raises(RuntimeError, match="KnormPress is already active on this model"):
        with KnormPress(0.5)(model), _press(folder)(model):
            pass


def test_a_kvpress_press_entered_inside_ours_is_refused_at_the_prefill(folder, model):
    with pytest.raises(RuntimeError, match="KnormPress was entered inside KVzapPress's block"):
        with _press(folder)(model), KnormPress(0.5)(model):
            model(_ids(40), past_key_values=DynamicCache())


def test_a_press_is_reusable_one_prompt_after_another(folder, model):
    press = _press(folder)
    _prefill(model, press, 40)
    first = press.compression_ratio
    _prefill(model, press, 40)
    assert press.compression_ratio == first and 0 < first < 1


# ---- what a press changes on the model -----------------------------------------------------------------------


def _state(model):
    return model.config._attn_implementation, [hasattr(layer.self_attn, "rotary_emb") for layer in model.model.layers]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_leaving_restores_the_model(folder, attn):
    model = tiny_model("llama", attn=attn)
    before = (_state(model), model.config.to_dict())
    with _press(folder)(model):
        model(_ids(40), use_cache=False)  # nothing cached, so nothing pruned
    assert (_state(model), model.config.to_dict()) == before == ((attn, [False, False]), before[1])


def test_a_pruned_cache_outlives_the_block(folder, model):
    press = _press(folder)
    _, cache = _prefill(model, press)
    assert _state(model) == ("kvzap", [False, False])  # kept: only "kvzap" reads a pruned cache
    with torch.no_grad():
        dense = model(_ids(40), past_key_values=DynamicCache())
        step = model(_ids(1, seed=5), past_key_values=cache).logits
    assert step.shape == (1, 1, 400) and torch.isfinite(step).all() and dense.logits.shape == (1, 40, 400)


def test_after_a_block_an_eager_model_returns_its_attention_weights_and_still_reads_the_pruned_cache(folder):
    """The "kvzap" attention stays for forwards over the pruned cache only: a forward over a new cache gets eager's
    attention weights, as the user asked, and the pruned cache reads as it did before that forward."""
    model = tiny_model("llama", attn="eager")
    _, cache = _prefill(model, _press(folder))
    with torch.no_grad():
        before = model(_ids(1, seed=5), past_key_values=copy.deepcopy(cache)).logits
        dense = model(_ids(40), past_key_values=DynamicCache(), output_attentions=True)
        after = model(_ids(1, seed=5), past_key_values=cache).logits
    assert [a.shape for a in dense.attentions] == [(1, 4, 40, 40)] * 2
    assert torch.equal(before, after)
    with _press(folder)(model):  # a new block takes the model as the user left it
        pass
    assert _state(model) == ("eager", [False, False])


def test_the_callers_surrogate_is_not_cast(folder):
    model = tiny_model("llama").to(torch.bfloat16)
    given = _surrogate()
    owned, borrowed = _press(folder), KVzapPress(SurrogateScorerPress(surrogate=given), 0.0, WINDOW)
    _prefill(model, owned)
    _prefill(model, borrowed)
    assert {p.dtype for p in given.parameters()} == {torch.float32}
    assert borrowed.compression_ratio == owned.compression_ratio


# ---- gradients enabled ---------------------------------------------------------------------------------------


def _trainable():
    return tiny_model("llama").requires_grad_(True)  # what from_pretrained gives


def _prefill_and_step(model, press, grad: bool):
    cache = DynamicCache()
    with torch.set_grad_enabled(grad), press(model):
        model(_ids(40), past_key_values=cache)
        return model(_ids(1, seed=5), past_key_values=cache).logits


def test_forwards_with_gradients_enabled_work(folder):
    model = _trainable()
    with_grad = _prefill_and_step(model, _press(folder, decoding=True), True)
    without = _prefill_and_step(model, _press(folder, decoding=True), False)
    assert with_grad.requires_grad and torch.equal(with_grad.detach(), without)


def test_a_backward_through_a_pruned_cache_says_why(folder):
    logits = _prefill_and_step(_trainable(), _press(folder, decoding=True), True)
    with pytest.raises(RuntimeError, match="No gradient flows through a pruned KV cache"):
        logits.sum().backward()


# ---- which model a surrogate belongs to ----------------------------------------------------------------------


def _saved(folder: Path, base_model: str) -> str:
    _surrogate().save_pretrained(folder, extra_config={"base_model": base_model})
    return str(folder)


@pytest.mark.parametrize(
    "loaded_from",
    [
        "{tmp}/my-llama",  # a local folder: its name
        "{tmp}/hub/models--meta-llama--Llama-3.1-8B/snapshots/abc",  # a Hub cache snapshot: its repo id
    ],
)
def test_a_surrogate_of_another_model_is_refused_for_local_folders(model, tmp_path, loaded_from):
    model.config.name_or_path = loaded_from.format(tmp=tmp_path)
    press = _press(_saved(tmp_path / "s", "Qwen/Qwen3-8B"))
    with pytest.raises(ValueError, match=r"trained for Qwen/Qwen3-8B, but the model is .*loaded from"):
        with press(model):
            pass


def test_a_local_folder_named_as_the_base_model_is_accepted(model, tmp_path):
    model.config.name_or_path = str(tmp_path / "models--Qwen--Qwen3-8B" / "snapshots" / "abc")
    _prefill(model, _press(_saved(tmp_path / "s", "Qwen/Qwen3-8B")))
    model.config.name_or_path = str(tmp_path / "Qwen3-8B")
    _prefill(model, _press(_saved(tmp_path / "s", "Qwen/Qwen3-8B")))


# ---- Surrogate.from_pretrained -------------------------------------------------------------------------------


def _broken(tmp_path: Path, config=None, weights=None) -> Path:
    _surrogate().save_pretrained(tmp_path)
    if config is not None:
        (tmp_path / "config.json").write_bytes(config)
    if weights is not None:
        (tmp_path / "model.safetensors").write_bytes(weights(tmp_path / "model.safetensors"))
    return tmp_path


def _nan_weights(path: Path) -> bytes:
    from safetensors.torch import load_file, save_file

    state = load_file(str(path))
    state["layers.0.weight"][0, 0] = torch.nan
    save_file(state, str(path))
    return path.read_bytes()


@pytest.mark.parametrize(
    "change, error, message",
    [
        (dict(config=b"\xff\xfe\x00garbage"), ValueError, "not JSON text"),
        (dict(config=b"[1, 2]"), ValueError, "a JSON object is needed, got list"),
        (
            dict(config=b'{"input_dim": -1, "output_dim": 2, "n_modules": 2}'),
            ValueError,
            "input_dim must be a positive",
        ),
        (dict(config=b'{"input_dim": 64, "output_dim": 2, "n_modules": 2, "hidden_dim": 0}'), ValueError, "hidden_dim"),
        (dict(weights=lambda p: p.read_bytes()[:100]), ValueError, "Corrupt or truncated surrogate weights"),
        (dict(weights=_nan_weights), ValueError, "hold NaN or inf in ['layers.0.weight']"),
    ],
)
def test_from_pretrained_refuses_broken_checkpoints(tmp_path, change, error, message):
    with pytest.raises(error) as info:
        Surrogate.from_pretrained(_broken(tmp_path, **change))
    assert message in str(info.value)


def test_from_pretrained_refuses_what_is_not_a_name():
    with pytest.raises(TypeError, match="takes a folder or a Hub id"):
        Surrogate.from_pretrained(123)


# ---- the calibration CLI -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def calib(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("calib")
    tokenizer = tiny_tokenizer()
    tiny_model("llama", len(tokenizer)).save_pretrained(root / "hf")
    tokenizer.save_pretrained(root / "hf")
    (root / "model.json").write_text(json.dumps({"model_id": "tiny/llama", "path": str(root / "hf")}))
    Surrogate(64, 2, 2).save_pretrained(root / "s")
    (root / "texts.json").write_text(json.dumps(["The quick brown fox jumps over the lazy dog. " * 8] * 2))
    return root


def _calibrate(root: Path, **changes) -> list[str]:
    args = {
        "--model-json": root / "model.json",
        "--surrogate": root / "s",
        "--texts": root / "texts.json",
        "--window": "4",
        "--out": root / "tau.json",
        **changes,
    }
    return [  # a None value drops the flag
        str(x)
        for item in args.items()
        if item[1] is not None
        for x in ([item[0]] + (item[1] if isinstance(item[1], list) else [item[1]]))
    ]


def _texts(root: Path, content: bytes) -> Path:
    path = root / "bad_texts.json"
    path.write_bytes(content)
    return path


def test_calibration_cli_works(calib):
    _cli(calibration_cli.main, *_calibrate(calib, **{"--targets": ["0.3", "0.5"]}))
    found = json.loads((calib / "tau.json").read_text())["thresholds"]
    assert [row["target"] for row in found] == [0.3, 0.5]
    assert all(abs(row["compression_ratio"] - row["target"]) < 0.05 for row in found)


def test_calibration_on_ruler_prompts_of_another_seed(calib, monkeypatch):
    """--ruler calibrates on the prompts the evaluation would build, from the generator's seed 7 (not the
    evaluation's 42), cut to --max-tokens."""
    seen, real = [], calibration_cli.collect_scores
    monkeypatch.setattr(
        calibration_cli, "collect_scores", lambda model, ids, *rest: real(model, seen.extend(ids) or ids, *rest)
    )
    ruler = {"--texts": None, "--ruler": "300", "--ruler-tasks": ["niah_single_1", "vt"]}
    _cli(calibration_cli.main, *_calibrate(calib, **{"--targets": ["0.3"]}, **ruler))
    tokenizer = tiny_tokenizer()
    want = calibration_cli.ruler_texts(tokenizer, 300, ["niah_single_1", "vt"], 7)
    assert [ids[0].tolist() for ids in seen] == [tokenizer(t).input_ids[:4096] for t in want]
    assert want != calibration_cli.ruler_texts(tokenizer, 300, ["niah_single_1", "vt"], 42)
    assert "special magic" in want[0] and "<|im_start|>" in want[0]
    assert json.loads((calib / "tau.json").read_text())["thresholds"][0]["target"] == 0.3


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"--texts": None, "--ruler": "20"}, "--ruler 20: a RULER-style prompt needs 64 tokens or more"),
        (dict(texts=b"[]"), "a non-empty JSON list of non-empty strings is needed"),
        (dict(texts=b'{"a": "b"}'), "a non-empty JSON list of non-empty strings is needed"),
        (dict(texts=b'["ok", 3]'), "a non-empty JSON list of non-empty strings is needed"),
        (dict(texts=b'["ok", ""]'), "a non-empty JSON list of non-empty strings is needed"),
        (dict(texts=b"not json"), "not a readable JSON text file"),
        (dict(texts=b"\xff\xfe\x00"), "not a readable JSON text file"),
        ({"--texts": "missing.json"}, "not a readable JSON text file"),
        ({"--targets": ["1.5"]}, "--targets 1.5: a target is a fraction removed in [0, 1)"),
        ({"--targets": ["-0.1"]}, "--targets -0.1: a target is a fraction removed in [0, 1)"),
        ({"--window": "-1"}, "need window >= 0"),
        ({"--max-tokens": "0"}, "max-tokens >= 1"),
        ({"--model-json": "missing.json"}, "--model-json missing.json: not readable JSON"),
        (dict(model_json=b"{oops"), "not readable JSON"),
        (dict(model_json=b"[1]"), "not a model.json (no path)"),
        ({"--surrogate": "missing-surrogate"}, "Surrogate folder missing-surrogate does not exist"),
        ({"--out": "."}, "is a folder: name the JSON file to write"),
    ],
)
def test_calibration_cli_stops_before_loading_the_model(calib, tmp_path, monkeypatch, changes, message):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(calibration_cli, "load", no_model)
    if "texts" in changes:
        changes = {"--texts": _texts(tmp_path, changes["texts"])}
    if "model_json" in changes:
        changes = {"--model-json": _texts(tmp_path, changes["model_json"])}
    assert message in _stops(calibration_cli.main, *_calibrate(calib, **changes))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"--window": "4000"}, "No calibration token left the window"),  # texts within the window
        ({"--targets": ["0.99"]}, "target ratio 0.99 is out of reach"),
    ],
)
def test_calibration_cli_stops_when_the_texts_cannot_reach(calib, changes, message):
    assert message in _stops(calibration_cli.main, *_calibrate(calib, **changes))


def test_calibrate_from_python_refuses_a_target_outside_the_range():
    sample = ScoreSample([torch.randn(100)], 200)
    with pytest.raises(ValueError, match=r"target ratio 1.5 must be a number in \[0, 1\)"):
        calibrate([sample], [1.5])


# ---- the publish CLI -----------------------------------------------------------------------------------------


@pytest.fixture
def published(tmp_path) -> tuple[Path, list[str]]:
    folders = [make_surrogate(tmp_path / "results" / "qwen3-8b", kind)[0] for kind in ("linear", "mlp")]
    return tmp_path, ["--dry-run", "--out", tmp_path / "out", "--surrogates", *folders]


def _publish(root: Path, argv: list, *extra) -> str:
    return _stops(publish.main, *argv, "--namespace", "me", *extra)


def test_publish_dry_run_works(published):
    root, argv = published
    _cli(publish.main, *argv, "--namespace", "me")
    plan = json.loads((root / "out" / "plan.json").read_text())
    assert [r["repo_id"] for r in plan["repos"]] == ["me/KVzap-linear-Qwen3-8B", "me/KVzap-mlp-Qwen3-8B"]


def _edit(root: Path, kind: str, name: str, edit) -> None:
    path = root / "results" / "qwen3-8b" / "surrogates" / kind / name
    path.write_bytes(edit(path.read_bytes()))


def _metrics(change):
    return lambda raw: json.dumps({**json.loads(raw), **change}).encode()


@pytest.mark.parametrize(
    "kind, name, edit, message",
    [
        ("mlp", "model.safetensors", lambda raw: raw[: len(raw) // 2], "Corrupt or truncated surrogate weights"),
        ("mlp", "config.json", _metrics({"base_model": "meta-llama/Llama-3.1-8B"}), "trained for meta-llama/Llama"),
        ("mlp", "metrics.json", lambda raw: b"{oops", "Fix: retrain or re-save the surrogate"),
        ("mlp", "metrics.json", _metrics({"kind": None}), "needs kind (linear or mlp) and model_id"),
        ("linear", "metrics.json", _metrics({"kind": "mlp"}), "metrics say mlp, the weights are linear"),
        ("mlp", "metrics.json", _metrics({"r2": []}), "r2 needs one row of numbers per layer"),
        ("mlp", "metrics.json", _metrics({"r2": [[0.1], [0.2], ["x"]]}), "r2 needs one row of numbers per layer"),
    ],
)
def test_publish_verifies_each_surrogate(published, kind, name, edit, message):
    root, argv = published
    _edit(root, kind, name, edit)
    assert message in _publish(root, argv)
    assert not (root / "out" / "plan.json").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--namespace", "bad name!"], "is not a valid Hub name"),
        (["--namespace", "a/b"], "without '/'"),
        (["--dataset-repo", "KVzap-results", "--tables", ROOT / "pyproject.toml"], "name it namespace/name"),
        (["--dataset-repo", "me/bad--name", "--tables", ROOT / "pyproject.toml"], "is not a valid Hub name"),
        (["--license", "MIT License!"], "use a Hub license identifier"),
        (["--tables", "missing.csv"], "--tables missing.csv: not a readable CSV table"),
        (["--tables", sys.executable], "not a readable CSV table"),
        (["--dataset-repo", "me/results", "--tables", ROOT / "pyproject.toml"], "pyproject.toml: not a readable CSV"),
    ],
)
def test_publish_refuses_bad_names_and_tables(published, extra, message):
    root, argv = published
    assert message in _publish(root, argv, *extra)


def test_publish_refuses_two_surrogates_for_one_repo(published):
    root, argv = published
    twin = make_surrogate(root / "results" / "other", "mlp")[0]
    assert "would be uploaded as ['me/KVzap-mlp-Qwen3-8B']" in _publish(root, [*argv, twin])


def test_publish_refuses_nothing_to_publish(tmp_path):
    assert "Nothing to publish" in _stops(publish.main, "--dry-run", "--out", tmp_path, "--namespace", "me")


def test_publish_refuses_a_table_with_non_numeric_thresholds(published):
    root, argv = published
    table = root / "t.csv"
    pd.DataFrame({"method": ["kvzap_mlp"], "value": ["high"], "compression_ratio": [0.5]}).to_csv(table, index=False)
    assert "kvzap_mlp rows need numeric value and compression_ratio" in _publish(root, argv, "--tables", table)


# ---- the plan CLI --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (["missing.yaml"], "missing.yaml: not a readable text file"),
        ([sys.executable], "not a readable text file"),
        ([ROOT / "config"], "not a readable text file"),
        ([ROOT / "config" / "ci.yaml", "--throughput", "t.json"], "--throughput t.json is read by the forecast only"),
    ],
)
def test_plan_cli_refuses_files_that_are_not_configs(argv, message):
    assert message in _stops(plan_cli.main, *argv)


def test_held_kv_bytes_refuses_what_is_not_a_cache():
    with pytest.raises(TypeError, match="held_kv_bytes takes a transformers Cache .*got Tensor"):
        held_kv_bytes(torch.zeros(3))
