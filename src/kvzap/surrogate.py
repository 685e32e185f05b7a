"""The KVzap surrogate: per layer, attention input h_t -> one predicted log-KVzip+ score per KV head.

Checkpoints use the `nvidia/KVzap-*` layout on the Hub (config.json with input_dim, output_dim, hidden_dim,
n_modules; model.safetensors with `layers.{i}.weight` for linear, `layers.{i}.{0,2}.weight` for MLP), so
kvpress's `KVzapModel.from_pretrained` loads ours and we load theirs. Safetensors only: nothing unpickles.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from kvzap.io import atomic_path, atomic_write_json

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


class Surrogate(nn.Module):
    """`n_modules` independent per-layer regressors, linear (hidden_dim None) or D -> hidden -> GELU -> H."""

    def __init__(self, input_dim: int, output_dim: int, n_modules: int, hidden_dim: int | None = None):
        super().__init__()
        self.input_dim, self.output_dim, self.n_modules, self.hidden_dim = input_dim, output_dim, n_modules, hidden_dim
        if hidden_dim is None:
            self.layers = nn.ModuleList(nn.Linear(input_dim, output_dim) for _ in range(n_modules))
        else:
            self.layers = nn.ModuleList(
                nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, output_dim))
                for _ in range(n_modules)
            )

    @property
    def kind(self) -> str:
        return "linear" if self.hidden_dim is None else "mlp"

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h: (N, n_modules, input_dim) -> (N, n_modules, output_dim)."""
        return torch.stack([layer(h[:, i]) for i, layer in enumerate(self.layers)], dim=1)

    def score_layer(self, layer_idx: int, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states: (B, T, D) attention input of one layer -> (B, H, T) predicted log scores."""
        layer = self.layers[layer_idx]
        weight = next(layer.parameters())
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
        }

    def save_pretrained(self, folder: Path | str, extra_config: dict | None = None) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in self.state_dict().items()}
        with atomic_path(folder / WEIGHTS_NAME) as tmp:
            save_file(state, str(tmp), metadata={"format": "pt"})
        atomic_write_json(folder / CONFIG_NAME, {**self.config_dict(), **(extra_config or {})})

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, revision: str | None = None) -> "Surrogate":
        """Load from a local folder or, if no such folder exists, from a Hub model repository."""
        folder = Path(name_or_path)
        if not folder.is_dir():
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(str(name_or_path), revision=revision, allow_patterns=[CONFIG_NAME, WEIGHTS_NAME]))
        for name in (CONFIG_NAME, WEIGHTS_NAME):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"Surrogate checkpoint {folder} has no {name}: train it first or check the path.")
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
        return model.eval().requires_grad_(False)

    def check_matches(self, model_config) -> None:
        """Fail early, with both shapes named, when a surrogate was trained for another model."""
        expected = (model_config.num_hidden_layers, model_config.hidden_size, model_config.num_key_value_heads)
        got = (self.n_modules, self.input_dim, self.output_dim)
        if got != expected:
            raise ValueError(
                f"Surrogate (layers, input_dim, kv_heads) = {got} does not match the model's {expected}: "
                "load the surrogate trained for this model."
            )
