"""The surrogate's compute relative to one decoder layer, in FLOPs per token (paper Table 3, App. B).

Linear projections only, so quadratic attention and nonlinearities are left out (a conservative upper bound):
  C        = 4*D_h*(H_Q*D + H*D) + 6*D_h*D_int   (q, k, v, o projections and the SwiGLU FFN)
  C_MLP    = 2*D_h*(D_h/8) + 2*(D_h/8)*H         (Linear(D_h, D_h/8) -> GELU -> Linear(D_h/8, H))
  C_Linear = 2*D_h*H
with D_h the hidden size, H_Q / H the query / KV heads, D the head dimension, D_int the FFN width.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd


@dataclass(frozen=True)
class LayerShape:
    """The dimensions of one decoder layer that its FLOPs depend on (names as in the paper's Table 3)."""

    H_Q: int
    H: int
    D: int
    D_h: int
    D_int: int

    @classmethod
    def from_hf_config(cls, config: dict) -> LayerShape:
        """From a Hugging Face config.json; Llama's has no head_dim (it is hidden_size / num_attention_heads)."""
        needed = ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size")
        absent = [key for key in needed if key not in config]
        if absent:
            raise ValueError(
                f"config.json lacks {absent}: Table 3 needs a decoder-only transformer config "
                "(Llama / Qwen3 style) with these keys."
            )
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        return cls(
            H_Q=config["num_attention_heads"],
            H=config["num_key_value_heads"],
            D=head_dim,
            D_h=config["hidden_size"],
            D_int=config["intermediate_size"],
        )


def layer_flops(shape: LayerShape) -> int:
    return 4 * shape.D_h * (shape.H_Q * shape.D + shape.H * shape.D) + 6 * shape.D_h * shape.D_int


def mlp_hidden(shape: LayerShape) -> int:
    """KVzap-MLP's hidden width: D_h / 8 (512 for D_h = 4096, 640 for 5120)."""
    return shape.D_h // 8


def surrogate_flops(shape: LayerShape, kind: str) -> int:
    if kind == "linear":
        return 2 * shape.D_h * shape.H
    if kind == "mlp":
        return 2 * shape.D_h * mlp_hidden(shape) + 2 * mlp_hidden(shape) * shape.H
    raise ValueError(f"Unknown surrogate kind {kind!r}: use 'linear' or 'mlp'.")


def share(shape: LayerShape, kind: str) -> float:
    """C_kind / C, as a fraction (the paper prints it in percent)."""
    return surrogate_flops(shape, kind) / layer_flops(shape)


def overhead_row(model: str, shape: LayerShape) -> dict:
    return {"model": model, **asdict(shape), "mlp_share": share(shape, "mlp"), "linear_share": share(shape, "linear")}


def model_config(model_record: Path) -> dict:
    """results/<model>/model.json (written by kvzap.prepare.models) -> the prepared model folder's config.json."""
    folder = Path(json.loads(model_record.read_text())["path"])
    config = folder / "config.json"
    if not config.exists():
        raise FileNotFoundError(
            f"{config} is missing: {model_record} points at a folder without config.json; "
            "prepare the model again (kvzap.prepare.models)."
        )
    return json.loads(config.read_text())


def overhead_table(model_records: list[Path]) -> pd.DataFrame:
    """Table 3, one row per model; the model's name is its results/<model>/ folder."""
    return pd.DataFrame(
        [overhead_row(record.parent.name, LayerShape.from_hf_config(model_config(record))) for record in model_records],
        columns=["model", "H_Q", "H", "D", "D_h", "D_int", "mlp_share", "linear_share"],
    )
