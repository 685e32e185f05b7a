"""A model's size as the cost forecast needs it, torch-free: FLOPs per token, KV bytes per token, parameters.

The shipped configs' models are known facts here (their config.json values), so a forecast prices them without the
Hub; any other model is read through kvzap.plan.model_configs (the Hub cache, else one download), and a model with no
readable config is priced as the reference model, which the forecast says.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvzap.plan.model_configs import model_config
from kvzap.report.flops import LayerShape, layer_flops

# config.json values of the shipped configs' models (the keys LayerShape and the layer count read)
KNOWN = {
    "Qwen/Qwen3-8B": (36, 4096, 12288, 32, 8, 128, 151936),
    "meta-llama/Llama-3.1-8B-Instruct": (32, 4096, 14336, 32, 8, 128, 128256),
    "Qwen/Qwen3-32B": (64, 5120, 25600, 64, 8, 128, 151936),
    "offline/SmolLM2-135M-Instruct": (30, 576, 1536, 9, 3, 64, 49152),
    "offline/gemma-3-270m": (18, 640, 2048, 4, 1, 256, 262144),
}
KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
)
# The model the default throughput was measured on (benchmarks/h200/: Qwen3-8B's geometry at full depth)
REFERENCE = "Qwen/Qwen3-8B"
BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "auto": 2}


@dataclass(frozen=True)
class Geometry:
    layers: int
    shape: LayerShape
    vocab: int
    known: bool = True  # False: no config was readable, the reference model's geometry stands in

    @classmethod
    def of(cls, model_id: str, revision: str | None = None) -> Geometry:
        if model_id in KNOWN:
            return cls._from(dict(zip(KEYS, KNOWN[model_id])))
        config = model_config(model_id, revision) or {}
        try:
            return cls._from(config.get("text_config", config))
        except (KeyError, ValueError):
            return cls._from(dict(zip(KEYS, KNOWN[REFERENCE])), known=False)

    @classmethod
    def _from(cls, config: dict, known: bool = True) -> Geometry:
        return cls(config["num_hidden_layers"], LayerShape.from_hf_config(config), config["vocab_size"], known)

    @property
    def flops_per_token(self) -> float:
        """Forward FLOPs of one token through the decoder's linear layers (attention's quadratic part left out)."""
        return self.layers * layer_flops(self.shape)

    @property
    def parameters(self) -> float:
        """Decoder and embedding parameters: what a job loads."""
        return self.flops_per_token / 2 + self.vocab * self.shape.D_h

    def kv_bytes_per_token(self, dtype: str) -> float:
        """Keys and values of one token over all layers: what a decoding step reads per cached token and row."""
        return 2 * self.layers * self.shape.H * self.shape.D * BYTES.get(dtype, 2)
