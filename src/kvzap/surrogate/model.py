"""The KVzap surrogate: per layer, attention input h_t -> one predicted log-KVzip+ score per KV head.

Checkpoints use the `nvidia/KVzap-*` layout on the Hub (config.json with input_dim, output_dim, hidden_dim,
n_modules; model.safetensors with `layers.{i}.weight` for linear, `layers.{i}.{0,2}.weight` for MLP), so
kvpress's `KVzapModel.from_pretrained` loads ours and we load theirs. Safetensors only: nothing unpickles.

Hybrid models: a sliding-window (or chunked) layer keeps its own bounded cache, which KVzap neither scores, trains
nor prunes (kvzap.layer_types). The surrogate still has one module per decoder layer (kvpress indexes them by
layer, and the `layers.{i}` layout stays as it is for every i), but a skipped layer's module is zero (it predicts
0 and is never used), and config.json lists them as "skipped_layers" (absent for models without, so older
checkpoints and nvidia/KVzap-* load unchanged).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from kvzap import layer_types
from kvzap.atomic import atomic_path, atomic_write_json

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
# Surrogates score in float32 whatever the model's dtype: they are tiny (under 1.1 % of a layer's FLOPs), and in
# bfloat16 a log score near the thresholds (-1 to -9) moves by up to 0.03, enough to flip keep/drop decisions
# (benchmarks/cpu/demo_science.json measures what it changes on the demo).
SCORE_DTYPE = torch.float32
# A Hub model id: org/name, each part of letters, digits, '-', '_', '.' (no leading/trailing '-' or '.').
HUB_ID = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?/[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?")
# kvpress names checkpoints nvidia/KVzap-{linear|mlp}-<basename of the base model>; their config.json has no
# base model, so the name is the only record of it.
KVPRESS_NAME = re.compile(r"KVzap-(?:linear|mlp)-(.+)")


def is_hub_id(name: str) -> bool:
    """True for a string that can only mean a Hub repository (org/name that is not a local path).

    Anything that exists locally, starts with '.', '/' or '~', has more than one '/', has characters a Hub id
    cannot have, or whose first part is a local folder (results/x) is a path.
    """
    name = str(name)
    return bool(HUB_ID.fullmatch(name)) and not Path(name).exists() and not Path(name.split("/")[0]).is_dir()


def resolve_folder(name_or_path: str | Path) -> Path | None:
    """The local checkpoint folder (checked for both files), or None for a Hub id.

    Fails with what to do when a path was meant but the checkpoint is not there, instead of the Hub's
    "repository not found" for a string that was never a repository.
    """
    if is_hub_id(str(name_or_path)):
        return None
    folder = Path(name_or_path).expanduser()
    fix = f"train it first (snakemake {Path(name_or_path) / WEIGHTS_NAME}) or pass a Hub id (org/name)"
    if not folder.is_dir():
        raise FileNotFoundError(f"Surrogate folder {name_or_path} does not exist: {fix}.")
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"Surrogate folder {name_or_path} lacks {name}: {fix}.")
    return folder


def read_config(path: Path) -> dict:
    """A surrogate's config.json, checked: sizes are positive integers (hidden_dim may be null: linear), and a
    recorded base_model is a string."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"Corrupt surrogate config {path}: not JSON text ({err}); save the surrogate again.") from err
    if not isinstance(config, dict):
        raise ValueError(f"Corrupt surrogate config {path}: a JSON object is needed, got {type(config).__name__}.")
    for key in ("input_dim", "output_dim", "n_modules", "hidden_dim"):
        value = config.get(key)
        if (value is not None or key != "hidden_dim") and (type(value) is not int or value < 1):
            raise ValueError(f"Corrupt surrogate config {path}: {key} must be a positive integer, got {value!r}.")
    if not isinstance(config.get("base_model") or "", str):
        raise ValueError(f"Corrupt surrogate config {path}: base_model must be an id, not {config['base_model']!r}")
    if not valid_skipped(config.get("skipped_layers", []), config["n_modules"]):
        raise ValueError(
            f"Corrupt surrogate config {path}: skipped_layers must be distinct layer indices below n_modules "
            f"({config['n_modules']}), not all of them; got {config['skipped_layers']!r}."
        )
    return config


def valid_skipped(skipped, n_modules: int) -> bool:
    """Distinct layer indices in [0, n_modules), fewer than all: a surrogate predicts for at least one layer."""
    return (
        isinstance(skipped, (list, tuple))
        and all(type(i) is int and 0 <= i < n_modules for i in skipped)
        and len(set(skipped)) == len(skipped) < n_modules
    )


class Surrogate(nn.Module):
    """`n_modules` independent per-layer regressors, linear (hidden_dim None) or D -> hidden -> GELU -> H; the
    modules of `skipped_layers` (a hybrid's sliding-window layers) are zero, and `scored` lists the others."""

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        n_modules: int,
        hidden_dim: int | None = None,
        skipped_layers: list[int] | tuple[int, ...] = (),
    ):
        super().__init__()
        if not valid_skipped(list(skipped_layers), n_modules):
            raise ValueError(
                f"skipped_layers {list(skipped_layers)} must be distinct layer indices below n_modules ({n_modules}), "
                "not all of them."
            )
        self.input_dim, self.output_dim, self.n_modules, self.hidden_dim = input_dim, output_dim, n_modules, hidden_dim
        self.skipped_layers = sorted(skipped_layers)
        self.scored = [i for i in range(n_modules) if i not in self.skipped_layers]
        self.base_model: str | None = None  # the model it was trained for (Hub id), when known
        if hidden_dim is None:
            self.layers = nn.ModuleList(nn.Linear(input_dim, output_dim) for _ in range(n_modules))
        else:
            self.layers = nn.ModuleList(
                nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, output_dim))
                for _ in range(n_modules)
            )
        for i in self.skipped_layers:
            for weight in self.layers[i].parameters():
                nn.init.zeros_(weight)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h: (N, len(scored), input_dim) -> (N, len(scored), output_dim), one row per scored layer as the oracle data
        holds them (for a model without skipped layers, every layer: kvpress's KVzapModel.forward)."""
        return torch.stack([self.layers[i](h[:, row]) for row, i in enumerate(self.scored)], dim=1)

    def score_layer(self, layer_idx: int, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states: (B, T, D) attention input of one layer -> (B, H, T) predicted log scores, computed in
        float32 on their device (SCORE_DTYPE; a moved copy of the layer if needed: the surrogate is never changed)."""
        return apply_layer(self.layer_like(layer_idx, hidden_states), hidden_states)

    def layer_like(self, layer_idx: int, like: torch.Tensor, in_place: bool = False) -> nn.Module:
        """Layer `layer_idx` on `like`'s device, in SCORE_DTYPE: itself if it already is; otherwise a copy, or, with
        `in_place` (for a surrogate the caller owns), the layer moved in place."""
        layer = self.layers[layer_idx]
        if placed_like(layer, like):
            return layer
        return (layer if in_place else copy.deepcopy(layer)).to(like.device, SCORE_DTYPE)

    def config_dict(self) -> dict:
        return {
            "model_type": "kvzap",
            "architectures": ["KVzapModel"],
            "input_dim": self.input_dim,
            "output_dim": self.output_dim,
            "hidden_dim": self.hidden_dim,
            "n_modules": self.n_modules,
            **({"skipped_layers": self.skipped_layers} if self.skipped_layers else {}),
            **({"base_model": self.base_model} if self.base_model else {}),
        }

    def save_pretrained(self, folder: Path | str, extra_config: dict | None = None) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in self.state_dict().items()}
        with atomic_path(folder / WEIGHTS_NAME) as tmp:
            save_file(state, str(tmp), metadata={"format": "pt"})
        atomic_write_json(folder / CONFIG_NAME, {**self.config_dict(), **(extra_config or {})})

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, revision: str | None = None) -> Surrogate:
        """Load from a local folder or a Hub model repository (org/name); see `resolve_folder` for which is which."""
        if not isinstance(name_or_path, (str, Path)) or not str(name_or_path):
            raise TypeError(f"Surrogate.from_pretrained takes a folder or a Hub id (org/name), got {name_or_path!r}")
        folder = resolve_folder(name_or_path)
        if folder is None:
            from huggingface_hub import snapshot_download

            folder = Path(
                snapshot_download(str(name_or_path), revision=revision, allow_patterns=[CONFIG_NAME, WEIGHTS_NAME])
            )
            for name in (CONFIG_NAME, WEIGHTS_NAME):
                if not (folder / name).is_file():
                    raise FileNotFoundError(f"Hub repository {name_or_path} has no {name}: is it a KVzap surrogate?")
        config = read_config(folder / CONFIG_NAME)
        model = cls(
            config["input_dim"],
            config["output_dim"],
            config["n_modules"],
            config.get("hidden_dim"),
            config.get("skipped_layers", []),
        )
        try:
            state = load_file(str(folder / WEIGHTS_NAME))
        except (SafetensorError, OSError) as err:
            raise ValueError(f"Corrupt or truncated surrogate weights {folder / WEIGHTS_NAME}: {err}") from err
        try:
            model.load_state_dict(state)
        except RuntimeError as err:
            reason = " ".join(str(err).split())  # torch lists the keys on several lines
            raise ValueError(f"Surrogate weights {folder / WEIGHTS_NAME} do not match its config: {reason}") from err
        bad = sorted(name for name, tensor in state.items() if not bool(tensor.isfinite().all()))
        if bad:
            raise ValueError(f"Surrogate weights {folder / WEIGHTS_NAME} hold NaN or inf in {bad}: retrain it.")
        kvpress_name = KVPRESS_NAME.fullmatch(Path(str(name_or_path)).name)
        model.base_model = config.get("base_model") or (kvpress_name.group(1) if kvpress_name else None)
        return model.eval().requires_grad_(False)

    def check_matches(self, model_config, check_base_model: bool = True) -> None:
        """Fail early, naming both sides, when a surrogate was trained for another model.

        Shapes and skipped (sliding-window) layers always; then, with `check_base_model`, the surrogate's base
        model against the model's identity (see `model_identity`), skipped where either is unknown.
        """
        expected = (model_config.num_hidden_layers, model_config.hidden_size, model_config.num_key_value_heads)
        got = (self.n_modules, self.input_dim, self.output_dim)
        if got != expected:
            raise ValueError(
                f"Surrogate (layers, input_dim, kv_heads) = {got} does not match the model's {expected}: "
                "load the surrogate trained for this model."
            )
        sliding = layer_types.skipped_layers(model_config)
        if self.skipped_layers != sliding:
            raise ValueError(
                f"Surrogate skips layers {self.skipped_layers}, but the model's sliding-window layers (which KVzap "
                f"leaves alone) are {sliding}: load the surrogate trained for this model."
            )
        identity = model_identity(model_config)
        if check_base_model and self.base_model and identity and not same_model(self.base_model, identity):
            loaded_from = str(getattr(model_config, "name_or_path", "") or "")
            where = "" if loaded_from in ("", identity) else f" (loaded from {loaded_from})"
            raise ValueError(
                f"Surrogate was trained for {self.base_model}, but the model is {identity}{where}: load the surrogate "
                "trained for this model, or pass check_base_model=False to the press if it is the same model "
                "(or set model.config.kvzap_model_id to its Hub id)."
            )


def placed_like(layer: nn.Module, like: torch.Tensor) -> bool:
    """Whether a surrogate layer's weights are on `like`'s device in SCORE_DTYPE (its first weight: this runs per
    token)."""
    weight = (layer if isinstance(layer, nn.Linear) else layer[0]).weight
    return weight.device == like.device and weight.dtype == SCORE_DTYPE


def apply_layer(layer: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """(B, T, D) -> (B, H, T) predicted log scores of one surrogate layer, in the layer's dtype."""
    weight = (layer if isinstance(layer, nn.Linear) else layer[0]).weight
    return layer(hidden_states.to(weight.dtype)).transpose(1, 2)


def model_identity(model_config) -> str | None:
    """The model's id: `kvzap_model_id` (set by kvzap.prepare.models.load), else its `name_or_path`: a Hub id,
    a Hub-cache snapshot folder (models--org--name/snapshots/<rev>: org/name), or a local folder, named by its
    last part (compared with a base model's name, as kvpress names its checkpoints).

    None (unknown) for a model built in code (empty name_or_path).
    """
    explicit = getattr(model_config, "kvzap_model_id", None)
    if explicit:
        return str(explicit)
    name = str(getattr(model_config, "name_or_path", "") or "")
    if not name or is_hub_id(name):
        return name or None
    folder = Path(name).expanduser()
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent.name.removeprefix("models--").replace("--", "/", 1)
    return folder.resolve().name or None


def same_model(a: str, b: str) -> bool:
    """Hub ids compare whole; a bare name (from a kvpress checkpoint's repo name) compares with the basename.

    Case-insensitive, like Hub repository names.
    """
    if "/" not in a or "/" not in b:
        a, b = a.rsplit("/", 1)[-1], b.rsplit("/", 1)[-1]
    return a.casefold() == b.casefold()
