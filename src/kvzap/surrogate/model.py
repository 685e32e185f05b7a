"""The KVzap surrogate: per layer, attention input h_t -> one predicted log-KVzip+ score per KV head.

Checkpoints use the `nvidia/KVzap-*` layout on the Hub (config.json with input_dim, output_dim, hidden_dim,
n_modules; model.safetensors with `layers.{i}.weight` for linear, `layers.{i}.{0,2}.weight` for MLP), so
kvpress's `KVzapModel.from_pretrained` loads ours and we load theirs. Safetensors only: nothing unpickles.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from kvzap.atomic import atomic_path, atomic_write_json

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
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


class Surrogate(nn.Module):
    """`n_modules` independent per-layer regressors, linear (hidden_dim None) or D -> hidden -> GELU -> H."""

    def __init__(self, input_dim: int, output_dim: int, n_modules: int, hidden_dim: int | None = None):
        super().__init__()
        self.input_dim, self.output_dim, self.n_modules, self.hidden_dim = input_dim, output_dim, n_modules, hidden_dim
        self.base_model: str | None = None  # the model it was trained for (Hub id), when known
        if hidden_dim is None:
            self.layers = nn.ModuleList(nn.Linear(input_dim, output_dim) for _ in range(n_modules))
        else:
            self.layers = nn.ModuleList(
                nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, output_dim))
                for _ in range(n_modules)
            )

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h: (N, n_modules, input_dim) -> (N, n_modules, output_dim)."""
        return torch.stack([layer(h[:, i]) for i, layer in enumerate(self.layers)], dim=1)

    def score_layer(self, layer_idx: int, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states: (B, T, D) attention input of one layer -> (B, H, T) predicted log scores."""
        layer = self.layers[layer_idx]
        weight = (layer if self.hidden_dim is None else layer[0]).weight  # (not parameters(): this runs per token)
        if weight.device != hidden_states.device or weight.dtype != hidden_states.dtype:
            layer.to(hidden_states.device, hidden_states.dtype)
        return layer(hidden_states).transpose(1, 2)

    def config_dict(self) -> dict:
        return {
            "model_type": "kvzap",
            "architectures": ["KVzapModel"],
            "input_dim": self.input_dim,
            "output_dim": self.output_dim,
            "hidden_dim": self.hidden_dim,
            "n_modules": self.n_modules,
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
        folder = resolve_folder(name_or_path)
        if folder is None:
            from huggingface_hub import snapshot_download

            folder = Path(
                snapshot_download(str(name_or_path), revision=revision, allow_patterns=[CONFIG_NAME, WEIGHTS_NAME])
            )
            for name in (CONFIG_NAME, WEIGHTS_NAME):
                if not (folder / name).is_file():
                    raise FileNotFoundError(f"Hub repository {name_or_path} has no {name}: is it a KVzap surrogate?")
        try:
            config = json.loads((folder / CONFIG_NAME).read_text())
            model = cls(config["input_dim"], config["output_dim"], config["n_modules"], config.get("hidden_dim"))
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"Corrupt surrogate config {folder / CONFIG_NAME}: {err}") from err
        try:
            state = load_file(str(folder / WEIGHTS_NAME))
        except (SafetensorError, OSError) as err:
            raise ValueError(f"Corrupt or truncated surrogate weights {folder / WEIGHTS_NAME}: {err}") from err
        try:
            model.load_state_dict(state)
        except RuntimeError as err:
            raise ValueError(f"Surrogate weights {folder / WEIGHTS_NAME} do not match its config: {err}") from err
        kvpress_name = KVPRESS_NAME.fullmatch(Path(str(name_or_path)).name)
        model.base_model = config.get("base_model") or (kvpress_name.group(1) if kvpress_name else None)
        return model.eval().requires_grad_(False)

    def check_matches(self, model_config, check_base_model: bool = True) -> None:
        """Fail early, naming both sides, when a surrogate was trained for another model.

        Shapes always; then, with `check_base_model`, the surrogate's base model against the model's
        identity (see `model_identity`), skipped where either is unknown.
        """
        expected = (model_config.num_hidden_layers, model_config.hidden_size, model_config.num_key_value_heads)
        got = (self.n_modules, self.input_dim, self.output_dim)
        if got != expected:
            raise ValueError(
                f"Surrogate (layers, input_dim, kv_heads) = {got} does not match the model's {expected}: "
                "load the surrogate trained for this model."
            )
        identity = model_identity(model_config)
        if check_base_model and self.base_model and identity and not same_model(self.base_model, identity):
            raise ValueError(
                f"Surrogate was trained for {self.base_model}, but the model is {identity}: load the surrogate "
                "trained for this model, or pass check_base_model=False to the press if it is the same model."
            )


def model_identity(model_config) -> str | None:
    """The model's Hub id: `kvzap_model_id` (set by kvzap.prepare.models.load), else a Hub-id `name_or_path`.

    None (unknown) for an empty name or a local folder, which says nothing about which model it holds.
    """
    explicit = getattr(model_config, "kvzap_model_id", None)
    if explicit:
        return str(explicit)
    name = str(getattr(model_config, "name_or_path", "") or "")
    return name if is_hub_id(name) else None


def same_model(a: str, b: str) -> bool:
    """Hub ids compare whole; a bare name (from a kvpress checkpoint's repo name) compares with the basename.

    Case-insensitive, like Hub repository names.
    """
    if "/" not in a or "/" not in b:
        a, b = a.rsplit("/", 1)[-1], b.rsplit("/", 1)[-1]
    return a.casefold() == b.casefold()
