"""The paper's figures, drawn from results/tables/results.csv (and the surrogates' held-out predictions).

Kinds (config `figures:`):
  tradeoff            score vs compression ratio, one panel per model (Figs 1-4, 12; AIME: pass@1 solid, pass@4 dashed)
  per_task            one panel per task of a benchmark, for one model (Figs 9-11, 13-15)
  ratio_distribution  per-prompt compression ratios of one KVzap configuration on each benchmark (Fig 5 left)
  threshold_vs_topk   thresholding vs fixed top-k per head vs per layer (Fig 5 right)
  surrogate_fit       KVzip+ scores, per-head R^2 MLP vs linear, share below the median, R^2 heatmap (Figs 6-8)
  training_pairs      R^2 and accuracy at matched compression vs training pairs and sources (kvzap.ablations)
Every score is drawn with its 95 % interval (kvzap.intervals) as error bars or a band.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import kvzap  # noqa: E402
from kvzap.atomic import atomic_path  # noqa: E402
from kvzap.evaluation import methods  # noqa: E402
from kvzap.intervals import bootstrap, ci_columns, mean_over_cells  # noqa: E402
from kvzap.provenance import git_commit  # noqa: E402
from kvzap.refusal import entry_point

MARKERS = "osD^vP*Xh<>p"
STYLE = {"kvzap_mlp": dict(color="#76b900", lw=2.2), "kvzap_linear": dict(color="#1f6f3f", lw=2.2)}


def _save(fig, out: Path) -> None:
    fig.tight_layout()
    origin = f"kvzap {kvzap.__version__}, commit {git_commit()}"
    # Provenance in the file's metadata; no creation date, so reruns and cluster runs give identical files.
    metadata = {".png": {"Software": origin}, ".pdf": {"Creator": origin, "CreationDate": None}}
    for suffix in (".png", ".pdf"):
        with atomic_path(out.with_suffix(suffix)) as tmp:
            fig.savefig(tmp, format=suffix[1:], dpi=150, metadata=metadata[suffix])
    plt.close(fig)


def _summary(cells: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """Per (method, value): compression ratio and each metric averaged over the cells (subsets), with its 95 %
    interval (kvzap.intervals.mean_over_cells), and for cells run with several surrogate seeds the range of the
    seeds' own averages."""
    rows = []
    for (method, value), group in cells.groupby(["method", "value"], dropna=False, sort=False):
        row = {"method": method, "value": value, "compression_ratio": group["compression_ratio"].mean()}
        for metric in metrics:
            if metric in group and group[metric].notna().any():
                low, high = ci_columns(metric)
                row[metric], row[low], row[high] = mean_over_cells(group, metric)
        seeds = [c for c in group if c.startswith("seed:") and group[c].notna().all()]
        if seeds:  # each seed's average over the subsets, and their range
            row["seed_min"], row["seed_max"] = group[seeds].mean().min(), group[seeds].mean().max()
        rows.append(row)
    return pd.DataFrame(rows)


def _yerr(value, low, high) -> list[np.ndarray]:
    """Error-bar lengths below and above each value. A percentile bootstrap interval need not contain its point
    estimate (few samples, or a statistic like the mean R^2), and matplotlib refuses a negative length: that side
    is drawn as zero."""
    value, low, high = (np.asarray(v, dtype=float) for v in (value, low, high))
    return [np.clip(value - low, 0, None), np.clip(high - value, 0, None)]


def _curves(ax, cells: pd.DataFrame, metric: str, chosen: list[str] | None, linestyle: str = "-", legend=True):
    """One line per method (sorted by compression ratio) with 95 % error bars; the full cache as a dashed
    horizontal line inside its interval's band. When every method sits at about one compression ratio (a
    single-ratio run), methods stand side by side around that ratio, so their error bars do not hide each other."""
    low, high = ci_columns(metric)
    shown = cells[(cells["method"] != "full") & cells["method"].isin(chosen or cells["method"].unique())]
    shown = shown[shown[metric].notna()] if metric in shown else shown.iloc[:0]
    names = list(shown["method"].unique())
    narrow = len(shown) > 0 and shown["compression_ratio"].max() - shown["compression_ratio"].min() < DODGE * len(names)
    centre = shown["compression_ratio"].mean()
    for i, (method, group) in enumerate(cells.groupby("method", sort=False)):
        if chosen and method not in chosen or metric not in group or group[metric].isna().all():
            continue
        if method == "full":
            ax.axhline(
                group[metric].mean(), color="black", ls="--", lw=1, label=methods.label(method) if legend else None
            )
            if low in group and group[low].notna().all():
                ax.axhspan(group[low].mean(), group[high].mean(), color="black", alpha=0.08, lw=0)
            continue
        group = group.sort_values("compression_ratio")
        errors = _yerr(group[metric], group[low], group[high]) if low in group and group[low].notna().all() else None
        x = group["compression_ratio"]
        if narrow:
            x = np.full(len(group), centre + DODGE * (names.index(method) - (len(names) - 1) / 2))
        drawn = ax.errorbar(
            x,
            group[metric],
            yerr=errors,
            marker=MARKERS[i % len(MARKERS)],
            ms=4,
            ls=linestyle,
            capsize=2,
            elinewidth=0.8,
            label=methods.label(method) if legend else None,
            **STYLE.get(method, {}),
        )
        if metric == "average" and "seed_min" in group and group["seed_min"].notna().any():
            # several surrogate seeds: the point is their mean, the wide pale bar the range of their own scores
            color = drawn.lines[0].get_color()
            ax.vlines(x, group["seed_min"], group["seed_max"], colors=color, lw=6, alpha=0.25)
    if narrow:
        ax.set_xlim(centre - DODGE * len(names), centre + DODGE * len(names))
        ax.set_xlabel(
            f"Compression ratio {shown['compression_ratio'].min():.2f}-"
            f"{shown['compression_ratio'].max():.2f} (side by side)"
        )
    else:
        ax.set_xlabel("Compression ratio")
    ax.grid(alpha=0.3)


DODGE = 0.01  # x distance between methods when all sit at about one compression ratio


def tradeoff(results: pd.DataFrame, spec: dict, out: Path) -> None:
    cells = results[results["benchmark"] == spec["benchmark"]]
    models = spec.get("models") or sorted(cells["model"].unique())
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    aime = (cells["benchmark_type"] == "aime25").any()
    for ax, model in zip(axes[0], models):
        data = _summary(cells[cells["model"] == model], ["pass@1", "pass@4", spec.get("metric", "average")])
        if aime:
            _curves(ax, data, "pass@1", spec.get("methods"))
            _curves(ax, data, "pass@4", spec.get("methods"), linestyle="--", legend=False)
            ax.set_ylabel("pass@1 (solid), pass@4 (dashed)")
        else:
            _curves(ax, data, spec.get("metric", "average"), spec.get("methods"))
            ax.set_ylabel(spec.get("metric", "average").replace("_", " "))
        if spec.get("ylim"):
            ax.set_ylim(*spec["ylim"])
        ax.set_title(model)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(spec.get("title", spec["benchmark"]))
    _save(fig, out)


def per_task(results: pd.DataFrame, spec: dict, out: Path) -> None:
    cells = results[results["benchmark"] == spec["benchmark"]]
    model = spec.get("model") or sorted(cells["model"].unique())[0]
    cells = cells[cells["model"] == model]
    tasks = [c for c in cells.columns if c.startswith("task:") and cells[c].notna().any()]
    cols = min(4, len(tasks))
    rows = -(-len(tasks) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
    data = _summary(cells, tasks)
    for ax, task in zip(axes.flat, tasks):
        _curves(ax, data, task, spec.get("methods"), legend=ax is axes.flat[0])
        ax.set_title(task.removeprefix("task:"))
    for ax in list(axes.flat)[len(tasks) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.suptitle(spec.get("title", f"{spec['benchmark']} per task, {model}"))
    _save(fig, out)


def ratio_distribution(results: pd.DataFrame, spec: dict, out: Path, predictions: list[Path]) -> None:
    """Per-prompt compression of one (method, value), per benchmark; each cell names itself in its metrics.json."""
    model = spec.get("model") or sorted(results["model"].unique())[0]
    by_bench: dict[str, list[pd.Series]] = {}
    for path in predictions:
        cell = json.loads((path.parent / "metrics.json").read_text())
        if cell["model"] == model and cell["method"] == spec["method"] and cell["value"] == spec["value"]:
            by_bench.setdefault(cell["bench"], []).append(pd.read_csv(path)["compression_ratio"])
    data, names, means = [], [], []
    for bench in spec.get("benchmarks") or sorted(by_bench):
        ratios = (pd.concat(by_bench[bench]) if bench in by_bench else pd.Series(dtype=float)).to_numpy()
        data.append(ratios)
        if len(ratios):  # the mean with its 95 % bootstrap interval over prompts
            means.append((len(data), ratios.mean(), *bootstrap(lambda idx: ratios[idx].mean(), len(ratios))))
        names.append(f"{bench}\n(mean {ratios.mean():.2f})")
    fig, ax = plt.subplots(figsize=(2.2 * len(data) + 2, 4))
    ax.violinplot(
        [d for d in data if len(d)], positions=[i + 1 for i, d in enumerate(data) if len(d)], showmedians=True
    )
    for position, mean, low, high in means:
        ax.errorbar([position], [mean], yerr=_yerr([mean], [low], [high]), color="black", marker="o", ms=3, capsize=4)
    ax.set_xticks(range(1, len(names) + 1), names)
    ax.set_ylabel("Per-prompt compression ratio")
    ax.set_title(spec.get("title", f"{methods.label(spec['method'])}, tau = {spec['value']:g}, {model}"))
    _save(fig, out)


def threshold_vs_topk(results: pd.DataFrame, spec: dict, out: Path) -> None:
    spec = {**spec, "methods": spec.get("methods") or list(methods.THRESHOLD_VS_TOPK)}
    tradeoff(results, {**spec, "title": spec.get("title", "Thresholding vs fixed top-k")}, out)


def _by_layer(values: torch.Tensor, layers: torch.Tensor) -> torch.Tensor:
    """(scored layers, heads) -> (heads, decoder layers up to the last scored), NaN (blank) at skipped layers."""
    grid = torch.full((values.shape[1], int(layers.max()) + 1), float("nan"))
    grid[:, layers] = values.T.float()
    return grid


def surrogate_fit(spec: dict, out: Path, surrogates: list[tuple[str, Path, Path]]) -> None:
    """Per model (its linear and MLP surrogate folders): held-out scores, per-head R^2 of both, layer shares.
    Layers are labelled by their decoder index; a hybrid's skipped (sliding-window) layers have no R^2 and no
    scores, so they are gaps."""
    fig, axes = plt.subplots(len(surrogates), 4, figsize=(18, 4.4 * len(surrogates)), squeeze=False)
    for row, (model, linear, mlp) in zip(axes, surrogates):
        metrics = {
            kind: json.loads((folder / "metrics.json").read_text())
            for kind, folder in (("linear", linear), ("mlp", mlp))
        }
        r2 = {kind: torch.tensor(m["r2"]) for kind, m in metrics.items()}
        layers = torch.tensor(metrics["mlp"].get("layers", list(range(len(r2["mlp"])))))  # older metrics: all
        (x_low, x_high), (y_low, y_high) = metrics["mlp"]["r2_mean_ci"], metrics["linear"]["r2_mean_ci"]
        y_true = load_file(str(mlp / "test_predictions.safetensors"))["y_true"]  # (N, L, H)
        row[0].hist(y_true.flatten().numpy(), bins=80, color="#76b900")
        row[0].set(title=f"{model}: KVzip+ log-scores\n(held-out prompts)", xlabel="log score")
        row[1].scatter(
            r2["mlp"].flatten(),
            r2["linear"].flatten(),
            s=6,
            c=layers.repeat_interleave(r2["mlp"].shape[1]),
            cmap="viridis",
        )
        row[1].plot([0, 1], [0, 1], "k--", lw=0.8)
        x, y = r2["mlp"].mean().item(), r2["linear"].mean().item()  # the means, with 95 % intervals over test prompts
        row[1].errorbar(
            [x],
            [y],
            xerr=_yerr([x], [x_low], [x_high]),
            yerr=_yerr([y], [y_low], [y_high]),
            color="red",
            marker="+",
            ms=10,
            capsize=3,
        )
        row[1].set(
            title=f"per-head R^2, mean (red): MLP {x:.3f} [{x_low:.3f}, {x_high:.3f}]\n"
            f"linear {y:.3f} [{y_low:.3f}, {y_high:.3f}]",
            xlabel="MLP",
            ylabel="Linear",
        )
        below = (y_true < y_true.flatten().median()).float().mean(dim=(0, 2))
        row[2].bar(layers.numpy(), below.numpy(), color="#1f6f3f")
        row[2].set(title="share of KV pairs\nbelow the median score", xlabel="layer")
        image = row[3].imshow(_by_layer(r2["mlp"], layers).numpy(), aspect="auto", cmap="viridis", vmin=0, vmax=1)
        row[3].set(title="MLP R^2 per head", xlabel="layer", ylabel="KV head")
        for ax in (row[2], row[3]):  # layers and heads are counted: whole-number ticks only
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        row[3].yaxis.set_major_locator(MaxNLocator(integer=True))
        fig.colorbar(image, ax=row[3])
    _save(fig, out)


def training_pairs(spec: dict, out: Path, files: list[Path]) -> None:
    """Per model: R^2 (held-out training text, solid; the benchmark's own contexts, dashed) and accuracy at matched
    compression vs training pairs, one line per (surrogate, sources), 95 % error bars; the full cache's accuracy
    as a dashed line in its band."""
    fig, axes = plt.subplots(len(files), 2, figsize=(11, 4 * len(files)), squeeze=False)
    for (r2_ax, acc_ax), path in zip(axes, files):
        result = json.loads(Path(path).read_text())
        rows = pd.DataFrame(result["rows"])
        for i, ((kind, sources), group) in enumerate(rows.groupby(["kind", "sources"], sort=True)):
            group = group.sort_values("n_pairs")
            style = dict(
                marker=MARKERS[i % len(MARKERS)],
                capsize=3,
                ls="-" if sources == "all" else ":",
                label=f"{methods.label('kvzap_' + kind)}, {sources}",
                **STYLE.get(f"kvzap_{kind}", {}),
            )
            for ax, column in ((r2_ax, "r2_mean"), (r2_ax, "r2_benchmark"), (acc_ax, "average")):
                values, (low, high) = group[column].to_numpy(), np.array(group[f"{column}_ci"].tolist()).T
                ax.errorbar(
                    group["n_pairs"],
                    values,
                    yerr=_yerr(values, low, high),
                    **{**style, **({"ls": "--", "label": None, "alpha": 0.7} if column == "r2_benchmark" else {})},
                )
        full = result["full"]
        acc_ax.axhline(full["average"], color="black", ls="--", lw=1, label="Full cache")
        acc_ax.axhspan(*full["average_ci"], color="black", alpha=0.08, lw=0)
        r2_ax.set(
            xscale="log",
            xlabel="training pairs",
            ylabel="R^2: held-out text (solid), benchmark (dashed)",
            title=f"{result['model_id']}: surrogate fit",
        )
        acc_ax.set(
            xscale="log",
            xlabel="training pairs",
            ylabel=f"accuracy ({result['n_samples']} samples)",
            title=f"accuracy at compression {result['target_ratio']:g} (calibrated)",
        )
        for ax in (r2_ax, acc_ax):
            ax.grid(alpha=0.3)
        acc_ax.legend(fontsize=7)
    _save(fig, out)


@entry_point
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, required=True, help="results.csv")
    parser.add_argument(
        "--predictions",
        type=Path,
        nargs="*",
        default=[],
        help="cells' predictions.csv (ratio_distribution), each beside its metrics.json",
    )
    parser.add_argument(
        "--surrogate",
        nargs=3,
        action="append",
        default=[],
        metavar=("MODEL", "LINEAR", "MLP"),
        help="a model's two surrogate folders (surrogate_fit), once per model",
    )
    parser.add_argument(
        "--training-ablations",
        type=Path,
        nargs="*",
        default=[],
        help="kvzap.ablations.training_data JSON files (training_pairs)",
    )
    parser.add_argument("--spec", required=True, help="the figure's config entry, as JSON")
    parser.add_argument("--out", type=Path, required=True, help="PNG path (a PDF is written beside it)")
    args = parser.parse_args()
    spec = json.loads(args.spec)
    results = pd.read_csv(args.results)
    kind = spec["kind"]
    if kind == "surrogate_fit":
        surrogate_fit(spec, args.out, [(model, Path(linear), Path(mlp)) for model, linear, mlp in args.surrogate])
    elif kind == "training_pairs":
        training_pairs(spec, args.out, args.training_ablations)
    elif kind == "ratio_distribution":
        ratio_distribution(results, spec, args.out, args.predictions)
    else:
        {"tradeoff": tradeoff, "per_task": per_task, "threshold_vs_topk": threshold_vs_topk}[kind](
            results, spec, args.out
        )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
