"""What the report stage writes, by name, torch- and matplotlib-free: the planner lists these outputs as targets
and checks figure entries against them before any job; aggregate and figures draw them."""

from dataclasses import dataclass

# Tables kvzap.report.aggregate writes (CSV, in this order in results.md), with their titles.
TABLES = {
    "results": "one row per cell",
    "best": "Table 2: fixed configuration per model (tables.best)",
    "best_auto": "Table 2, automatic: best configuration within {tolerance:g} points",  # tables.tolerance
    "aime_rollouts": "Table 4: AIME25 correct answers per rollout",
    "window_ablation": "Sliding-window ablation: KVzap-MLP on LongBench LCC",
    "surrogates": "Table 1: surrogate fit (mean R^2)",
    "overhead": "Table 3: surrogate FLOPs relative to a decoder layer",
    "kv_ablation": "Surrogate input ablation: R^2 from h vs from (k, v)",
    "training_pairs": "Training data ablation: R^2 and accuracy at matched compression vs training pairs",
    "missing": "Missing cells",
}
# Tables built from the evaluation cells: marked partial when some cells are missing.
CELL_TABLES = ("results", "best", "best_auto", "aime_rollouts", "window_ablation")


@dataclass(frozen=True)
class FigureKind:
    """A figure kind: the config keys it needs and what it shows (the report's caption)."""

    needs: tuple[str, ...]
    caption: str


FIGURES = {
    "tradeoff": FigureKind(("benchmark",), "Score vs compression ratio, one panel per model, 95 % intervals."),
    "per_task": FigureKind(("benchmark",), "Score vs compression ratio, one panel per task of a benchmark."),
    "threshold_vs_topk": FigureKind(("benchmark",), "Thresholding vs fixed top-k per head and per layer."),
    "ratio_distribution": FigureKind(("method", "value"), "Per-prompt compression ratios of one KVzap setting."),
    "surrogate_fit": FigureKind((), "Held-out KVzip+ scores, per-head R^2 of both surrogates, layer shares."),
    "training_pairs": FigureKind((), "R^2 and accuracy at matched compression vs training pairs and sources."),
}
METRICS = ("average", "average_without_trec", "pass@1", "pass@4")  # what a figure's `metric` may name
