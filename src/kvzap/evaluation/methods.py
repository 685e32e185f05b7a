"""What every compression method is, by name, without importing torch: the one list the config checks, the sweep,
the tables and the figure legends read. `kvzap.evaluation.presses` turns a name into a press.

Adding a method is one entry here plus its press factory in `kvzap.evaluation.presses.PRESSES` (a test keeps
the two equal).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvzap.window import WINDOW


@dataclass(frozen=True)
class MethodInfo:
    parameter: str  # what the sweep varies: "none", "threshold" (per model) or "ratio" (evaluation.ratios)
    label: str  # legend name, as the paper and the kvpress leaderboard write it
    surrogate: str | None = None  # which trained surrogate ("linear" / "mlp") the method needs
    needs_hub: bool = False  # loads extra Hub/GitHub assets at run time (unavailable to offline models)
    window: int | None = None  # KVzap's protected window of recent tokens, when not the default (kvzap.window)
    attn_implementation: str | None = None  # forced attention implementation (None: the model's default)
    prefill_chunk: int | None = None  # KVzap prefilling the prompt this many tokens at a time, pruning between chunks
    own_prefill: bool = False  # changes the prefill itself (a repeat pass, attention weights): cannot share one
    masks: bool = False  # kvpress masks entries through its patched attention functions (AdaKV, Duo, KVzip): no eager

    @property
    def kvzap_attention(self) -> bool:
        """Runs under kvzap.pruning.attention: our presses' pruned layers, or forced (PyramidKV's uneven layers)."""
        return self.surrogate is not None or self.attn_implementation == "kvzap"

    @property
    def protected_window(self) -> int:
        """The recent tokens the method's press always keeps."""
        return WINDOW if self.window is None else self.window

    @property
    def kvzap(self) -> bool:
        """Thresholded KVzap at the paper's window and prefill: the methods Table 2 is about."""
        return self.parameter == "threshold" and self.window is None and self.prefill_chunk is None

    @property
    def shares_prefill(self) -> bool:
        """Prunes after attention, from what a plain prefill leaves: one prefill serves all such cells of a sample
        (kvzap.evaluation.shared_prefill)."""
        return not self.own_prefill and self.prefill_chunk is None


METHODS: dict[str, MethodInfo] = {
    "full": MethodInfo("none", "Full cache"),
    "kvzap_linear": MethodInfo("threshold", "KVzap-Linear", "linear"),
    "kvzap_mlp": MethodInfo("threshold", "KVzap-MLP", "mlp"),
    # the paper's window ablation (§3.8, LongBench LCC): the same surrogate and τ with w = 0 and w = 512
    "kvzap_mlp_w0": MethodInfo("threshold", "KVzap-MLP (window 0)", "mlp", window=0),
    "kvzap_mlp_w512": MethodInfo("threshold", "KVzap-MLP (window 512)", "mlp", window=512),
    # beyond the paper (which prunes after a whole-prompt prefill): prefill in 2k-token chunks, pruning between them
    "kvzap_mlp_chunked": MethodInfo("threshold", "KVzap-MLP (chunked prefill)", "mlp", prefill_chunk=2048),
    # the paper's Fig. 5 ablation: fixed top-k instead of a threshold
    # (kvpress's kvzap_mlp_head / kvzap_mlp_layer protect no window)
    "kvzap_mlp_head": MethodInfo("ratio", "KVzap-MLP top-k per head", "mlp", window=0),
    "kvzap_mlp_layer": MethodInfo("ratio", "KVzap-MLP top-k per layer", "mlp", window=0),
    "kvzip": MethodInfo("ratio", "KVzip", own_prefill=True, masks=True),  # scores from a repeat pass over the context
    "kvzip_plus": MethodInfo("ratio", "KVzip+", own_prefill=True, masks=True),
    "random": MethodInfo("ratio", "Random"),
    "knorm": MethodInfo("ratio", "Knorm"),
    "snapkv": MethodInfo("ratio", "SnapKV"),
    "expected_attention": MethodInfo("ratio", "Expected Attention", masks=True),
    "streaming_llm": MethodInfo("ratio", "StreamingLLM"),
    "tova": MethodInfo("ratio", "TOVA"),
    "observed_attention": MethodInfo("ratio", "Observed Attention", attn_implementation="eager", own_prefill=True),
    "qfilter": MethodInfo("ratio", "Q-Filters", needs_hub=True),
    # its layers keep different lengths, which one sdpa mask cannot serve; kvzap's attention cuts it per layer
    "pyramidkv": MethodInfo("ratio", "PyramidKV", attn_implementation="kvzap"),
    "lagkv": MethodInfo("ratio", "LagKV"),
    "keydiff": MethodInfo("ratio", "KeyDiff"),
    "adakv_compactor": MethodInfo("ratio", "AdaKV-Compactor", masks=True),
    "cur": MethodInfo("ratio", "CUR"),
    "duo_attention": MethodInfo("ratio", "DuoAttention", needs_hub=True, masks=True),
    "duo_attention_on_the_fly": MethodInfo("ratio", "DuoAttention (on the fly)", needs_hub=True, masks=True),
}

KVZAP_METHODS = tuple(name for name, info in METHODS.items() if info.kvzap)
# The paper's Fig. 5 (right): the full cache, KVzap-MLP thresholded, and the same surrogate's fixed top-k variants.
THRESHOLD_VS_TOPK = ("full", "kvzap_mlp", "kvzap_mlp_head", "kvzap_mlp_layer")


def info(name: str) -> MethodInfo:
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"Unknown method {name!r}; known methods: {', '.join(sorted(METHODS))}.") from None


def label(name: str) -> str:
    return METHODS[name].label if name in METHODS else name
