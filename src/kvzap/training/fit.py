"""Fit KVzap surrogates on oracle shards and measure them on held-out prompts.

KVzap-Linear: ridge regression (alpha 1, with intercept, as scikit-learn's Ridge()) solved per layer from
normal equations accumulated over the shards in float64, so the data never has to fit in memory (`ridge_solve`,
shared with the (k, v) ablation in kvzap.ablations.kv_input).
KVzap-MLP: D -> D/8 -> GELU -> H per layer, all layers in one network, AdamW + cosine schedule +
grad-norm clipping, a seeded 5% held out for validation: of the pairs, keeping the last epoch's weights (the
paper's recipe, `--valid-split pairs --keep last`), or of the prompts whole, keeping the best validation epoch's
(early stopping, the demo's). Each epoch shuffles all pairs globally; minibatches are
gathered from memory-mapped shards, so memory stays bounded. It checkpoints every epoch; a resume
continues only a run with identical settings and training data (else it restarts from epoch 0), and
equals an unbroken run. A non-finite loss, weight or ridge solution stops training with an error.
Shard checksums are verified before fitting (kvzap.training.shards).
Fit quality: squared Pearson correlation per (layer, head) on the test prompts (the paper's Table 1), its mean
with a 95 % bootstrap interval over test prompts.
Hybrid models: the oracle data holds the full-attention layers only (its manifest's "layers"); both surrogates fit
those, their R^2 and predictions are over those, and the sliding-window layers (which KVzap leaves alone) keep
zero modules, recorded as the surrogate's skipped layers (kvzap.surrogate.model). metrics.json's "layers" names
the decoder layer of each R^2 row.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from kvzap.atomic import atomic_path, atomic_write_json
from kvzap.intervals import bootstrap
from kvzap.provenance import stamp
from kvzap.refusal import Refusal, entry_point
from kvzap.surrogate.model import Surrogate
from kvzap.surrogate.settings import KINDS, TRAINING_KEYS
from kvzap.training.shards import ShardRows, read_shard


def load_manifest(folder: Path) -> dict:
    path = folder / "manifest.json"
    if not path.exists():
        raise Refusal(f"{path} is missing: the oracle collection for {folder} has not completed.")
    return json.loads(path.read_text())


def shards(folder: Path) -> list[Path]:
    return [folder / s["file"] for s in load_manifest(folder)["shards"]]


def data_layers(manifest: dict) -> list[int]:
    """The decoder layers the shards hold, in order: the scored ones of a hybrid model, else every layer."""
    return manifest.get("layers", list(range(manifest["n_layers"])))


def new_surrogate(manifest: dict, hidden_dim: int | None = None) -> Surrogate:
    """An untrained surrogate for the model the oracle data comes from; layers the data lacks are skipped."""
    layers = data_layers(manifest)
    skipped = [i for i in range(manifest["n_layers"]) if i not in layers]
    return Surrogate(manifest["hidden_size"], manifest["n_kv_heads"], manifest["n_layers"], hidden_dim, skipped)


def _check_shapes(model: Surrogate, held: tuple[int, int, int], folder: Path) -> None:
    """The shards hold (layers, hidden size, kv heads) as the manifest says, so rows map to the right modules."""
    expected = (len(model.scored), model.input_dim, model.output_dim)
    if tuple(held) != expected:
        raise ValueError(
            f"The shards of {folder} hold (layers, hidden size, kv heads) = {tuple(held)}, but its manifest says "
            f"{expected}: rerun the oracle stage (kvzap.training.collect)."
        )


def device_default() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ---------------------------------------------------------------- ridge


def ridge_solve(
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]], alpha: float, source: Path
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ridge regression with an unpenalised intercept (scikit-learn's Ridge), from float64 normal equations
    accumulated batch by batch, so the data never has to fit in memory. Each batch is x (..., n, D) and
    y (..., n, K); the leading dims index independent problems (a layer, a (layer, head)...).
    Returns weight (..., D, K) and bias (..., K). `source` names the data in errors."""
    sxx = sx = sxy = sy = n = 0
    for x, y in batches:
        x, y = x.double(), y.double()
        sxx = sxx + x.transpose(-1, -2) @ x  # (..., D, D)
        sxy = sxy + x.transpose(-1, -2) @ y  # (..., D, K)
        sx = sx + x.sum(dim=-2)  # (..., D)
        sy = sy + y.sum(dim=-2)  # (..., K)
        n += x.shape[-2]
    if n == 0:
        raise ValueError(
            f"{source} holds no oracle pairs to fit a ridge on: rerun the oracle stage (kvzap.training.collect)."
        )
    mean_x, mean_y = sx / n, sy / n
    # Centre the sums: X_c^T X_c = Sxx - n mx mx^T, X_c^T y_c = Sxy - n mx my^T (the intercept is not penalised).
    xtx = sxx - n * mean_x[..., :, None] * mean_x[..., None, :]
    xty = sxy - n * mean_x[..., :, None] * mean_y[..., None, :]
    eye = torch.eye(xtx.shape[-1], dtype=torch.float64, device=xtx.device)
    # X^T X + alpha I is symmetric positive definite: Cholesky. (torch 2.13's batched LU solve also fails on CPU once
    # torch.set_num_threads has been called: "Pivots given to lu_solve must all be greater or equal to 1".)
    weight = torch.cholesky_solve(xty, torch.linalg.cholesky(xtx + alpha * eye))  # (..., D, K)
    bias = mean_y - (mean_x[..., None, :] @ weight)[..., 0, :]  # (..., K)
    if not (torch.isfinite(weight).all() and torch.isfinite(bias).all()):
        raise FloatingPointError(
            f"The ridge solution for {source} is not finite: the oracle pairs hold NaN/inf or "
            "overflow float64. Rerun the oracle stage (kvzap.training.collect) for this model."
        )
    return weight, bias


def fit_ridge(
    folder: Path, alpha: float = 1.0, device: torch.device | None = None, pairs: np.ndarray | None = None
) -> Surrogate:
    """KVzap-Linear: one ridge per layer from h (D inputs) to the log scores of all its KV heads; `pairs` (global
    row indices) restricts the fit to those rows (a training-size ablation), else every row is used."""
    device = device or device_default()
    model = new_surrogate(load_manifest(folder))
    paths = shards(folder)
    starts = ShardRows(paths).starts  # each shard's first global row

    def rows(shard: dict, first: int) -> dict:
        if pairs is None:
            return shard
        local = torch.from_numpy(pairs[(pairs >= first) & (pairs < first + len(shard["y"]))] - first)
        return {"h": shard["h"][local], "y": shard["y"][local]}

    batches = (
        (
            shard["h"].to(device, torch.float64).transpose(0, 1),  # (L, N, D)
            shard["y"].to(device, torch.float64).transpose(0, 1),
        )  # (L, N, H)
        for shard in (
            rows(read_shard(path), first) for path, first in zip(tqdm(paths, desc="ridge: accumulate"), starts)
        )
    )
    weight, bias = ridge_solve(batches, alpha, folder)  # (L, D, H), (L, H) over the data's layers
    _check_shapes(model, weight.shape, folder)
    with torch.no_grad():
        for row, i in enumerate(model.scored):
            model.layers[i].weight.copy_(weight[row].T.float())
            model.layers[i].bias.copy_(bias[row].float())
    return model.eval().requires_grad_(False)


# ---------------------------------------------------------------- MLP


VALID_SPLITS = ("pairs", "prompts")  # the paper's (skorch's ValidSplit over pairs), the demo's
KEEP = ("last", "best")  # the paper's (the last epoch's weights), the demo's (the lowest validation loss)


def _split(prompts: np.ndarray, fraction: float, seed: int, by: str = "prompts") -> tuple[np.ndarray, np.ndarray]:
    """(training, validation) positions into `prompts` (each pair's prompt index), ascending: a seeded random
    `fraction` of the prompts held out whole, or (`by="pairs"`, the paper's) of the pairs. A prompt's pairs are
    correlated, so with a pair-level split the validation loss falls while the MLP memorises its training prompts,
    and choosing the best epoch by it chooses little."""
    if by == "pairs":
        held = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(seed))
        chosen = np.zeros(len(prompts), dtype=bool)
        chosen[held[: max(1, round(fraction * len(prompts)))].numpy()] = True
        return np.flatnonzero(~chosen), np.flatnonzero(chosen)
    ids = np.unique(prompts)
    held = torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed))[: max(1, round(fraction * len(ids)))]
    chosen = np.isin(prompts, ids[held.numpy()])
    return np.flatnonzero(~chosen), np.flatnonzero(chosen)


def _epoch_batches(train_index: np.ndarray, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    """One epoch's minibatches: a permutation of all training pairs across every shard, seeded per epoch
    so a resumed run draws exactly what an unbroken one would."""
    order = np.random.default_rng([seed, epoch]).permutation(train_index)
    return [order[b : b + batch_size] for b in range(0, len(order), batch_size)]


def _target_mean(rows: ShardRows, chunk: int = 4096) -> torch.Tensor:
    total = 0.0
    for b in range(0, len(rows), chunk):
        total = total + rows.gather("y", np.arange(b, min(b + chunk, len(rows)))).double().sum(0)
    return (total / len(rows)).float()  # (L, H)


class Minibatches:
    """(h, y) minibatches in float32 on the training device, gathered into buffers reused from batch to batch:
    fresh ones cost a CPU step about a quarter of its time in page faults (benchmarks/training_floor.py). A batch
    stays valid until the next one is read."""

    def __init__(self, rows: ShardRows, batch_size: int, device: torch.device):
        self.rows = rows
        self.raw = {name: rows.buffer(name, batch_size) for name in ("h", "y")}
        self.out = {name: torch.empty(raw.shape, dtype=torch.float32, device=device) for name, raw in self.raw.items()}

    def __call__(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(self.out[n][: len(idx)].copy_(self.rows.gather(n, idx, self.raw[n])) for n in ("h", "y"))


CHECKPOINT = "checkpoint.safetensors"


def _save_checkpoint(
    out: Path, run: dict, model, optimizer, scheduler, epoch: int, history: list[dict], best: dict
) -> None:
    """Weights, best weights so far, optimizer and the run's state in ONE file, so they never disagree after a kill."""
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    tensors.update({f"best.{k}": v.contiguous() for k, v in best.items()})
    for i, state in optimizer.state_dict()["state"].items():
        for name, value in state.items():
            tensors[f"optim.{i}.{name}"] = torch.as_tensor(value).detach().cpu().contiguous()
    state = {"run": run, "epoch": epoch, "scheduler": scheduler.state_dict(), "history": history}
    with atomic_path(out / CHECKPOINT) as tmp:
        save_file(tensors, str(tmp), metadata={"state": json.dumps(state)})


def _load_checkpoint(out: Path, run: dict, model, optimizer, scheduler) -> tuple[int, list[dict], dict | None]:
    """Restore the last finished epoch of this same run: (epoch to start from, history so far, best weights).
    A checkpoint made with other settings or data is discarded, so training restarts from epoch 0."""
    path = out / CHECKPOINT
    if not path.exists():
        return 0, [], None
    try:
        with safe_open(str(path), framework="pt") as f:
            state = json.loads((f.metadata() or {}).get("state", "{}"))
        tensors = load_file(str(path))
    except Exception as err:  # safetensors raises several types for a truncated file
        raise ValueError(f"Corrupt training checkpoint {path}: {err!r}. Delete it to restart training.") from err
    made_with = state.get("run")
    if made_with != run:
        changed = (
            ", ".join(sorted(k for k in run.keys() | made_with.keys() if run.get(k) != made_with.get(k)))
            if made_with
            else "kvzap version (it records no settings)"
        )
        print(f"Discarding {path}: it was made with different {changed}; training restarts from epoch 0.")
        path.unlink()
        return 0, [], None
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    optim_state = optimizer.state_dict()
    for i in range(len(optim_state["param_groups"][0]["params"])):
        optim_state["state"][i] = {name: tensors[f"optim.{i}.{name}"] for name in ("step", "exp_avg", "exp_avg_sq")}
    optimizer.load_state_dict(optim_state)
    scheduler.load_state_dict(state["scheduler"])
    for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
        group["lr"] = lr
    best = {k[5:]: v for k, v in tensors.items() if k.startswith("best.")}
    return state["epoch"] + 1, state["history"], best


def _diverged(what: str, epoch: int, folder: Path) -> FloatingPointError:
    return FloatingPointError(
        f"MLP training diverged in epoch {epoch + 1}: {what}. Lower --lr, or check the oracle "
        f"data in {folder} (rerun the oracle stage if it is suspect)."
    )


def fit_mlp(
    folder: Path,
    out: Path,
    epochs: int = 15,
    lr: float = 5e-3,
    batch_size: int = 512,
    hidden_dim: int | None = None,
    valid_fraction: float = 0.05,
    seed: int = 42,
    device: torch.device | None = None,
    pairs: np.ndarray | None = None,
    valid_split: str = "prompts",
    keep: str = "best",
) -> tuple[Surrogate, list[dict]]:
    """KVzap-MLP; the returned weights are those of the epoch with the lowest validation loss (`keep="best"`: early
    stopping, since with few pairs the MLP overfits in later epochs) or of the last epoch (the paper's).
    `pairs` (global row indices) restricts the data."""
    if valid_split not in VALID_SPLITS or keep not in KEEP:
        raise ValueError(
            f"valid_split must be one of {VALID_SPLITS} and keep one of {KEEP}, not {valid_split!r}, {keep!r}"
        )
    device = device or device_default()
    manifest = load_manifest(folder)
    rows = ShardRows(shards(folder))
    rows.verify()
    hidden_dim = hidden_dim or manifest["hidden_size"] // 8
    run = {
        "kind": "mlp",
        "epochs": epochs,
        "lr": lr,
        "batch_size": batch_size,
        "hidden_dim": hidden_dim,
        "valid_fraction": valid_fraction,
        "valid_split": valid_split,
        "keep": keep,
        "seed": seed,
        "data": {
            "params_hash": manifest["params_hash"],
            "shards": [r["sha256"] for r in rows.records],
            **({"pairs": hashlib.sha256(pairs.tobytes()).hexdigest()} if pairs is not None else {}),
        },
    }
    torch.manual_seed(seed)
    model = new_surrogate(manifest, hidden_dim)
    _check_shapes(model, (*rows.row_shape("h"), rows.row_shape("y")[-1]), folder)
    with torch.no_grad():  # start at the mean log-score (about -8) rather than spend epochs learning the offset
        for i, mean in zip(model.scored, _target_mean(rows)):
            model.layers[i][2].bias.copy_(mean)
    model.to(device)
    trained = [weight for i in model.scored for weight in model.layers[i].parameters()]  # skipped modules stay zero
    optimizer = torch.optim.AdamW(trained, lr=lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    start, history, best = _load_checkpoint(out, run, model, optimizer, scheduler)
    pairs = np.arange(len(rows)) if pairs is None else pairs
    train_index, valid_index = _split(rows.gather("prompt", pairs).numpy(), valid_fraction, seed, valid_split)
    train_index, valid_index = pairs[train_index], pairs[valid_index]
    minibatch = Minibatches(rows, batch_size, device)

    for epoch in range(start, epochs):
        model.train()
        train_loss, seen = 0.0, 0
        bar = tqdm(_epoch_batches(train_index, batch_size, seed, epoch), desc=f"mlp epoch {epoch + 1}/{epochs}")
        for idx in bar:
            xb, yb = minibatch(idx)
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            if not math.isfinite(loss.item()):
                raise _diverged(f"the minibatch loss is {loss.item()}", epoch, folder)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            train_loss += loss.item() * len(idx)
            seen += len(idx)
            bar.set_postfix(loss=f"{train_loss / max(seen, 1):.4f}")
        if not all(torch.isfinite(p).all() for p in model.parameters()):
            raise _diverged("the weights are no longer finite", epoch, folder)
        scheduler.step()
        valid_loss = _validation_loss(model, minibatch, valid_index, batch_size)
        history.append({"epoch": epoch + 1, "train_loss": train_loss / max(seen, 1), "valid_loss": valid_loss})
        print(f"epoch {epoch + 1}: train {history[-1]['train_loss']:.4f} valid {valid_loss:.4f}")
        if keep == "last" or best is None or valid_loss < min(h["valid_loss"] for h in history[:-1]):
            best = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        _save_checkpoint(out, run, model, optimizer, scheduler, epoch, history, best)
        atomic_write_json(out / "history.json", {"run": run, "history": history})  # progress, for people watching
    model.load_state_dict(best)
    return model.cpu().eval().requires_grad_(False), history


@torch.no_grad()
def _validation_loss(model, minibatch: Minibatches, valid_index: np.ndarray, batch_size: int) -> float:
    model.eval()
    total, count = 0.0, 0
    for b in range(0, len(valid_index), batch_size):
        x, y = minibatch(valid_index[b : b + batch_size])
        pred = model(x)
        total += torch.nn.functional.mse_loss(pred, y, reduction="sum").item()
        count += y.numel()
    return total / max(count, 1)


# ---------------------------------------------------------------- evaluation


def squared_pearson(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    """(N, L, H) pairs -> (L, H) squared Pearson correlation over N."""
    t = y_true.double() - y_true.double().mean(0)
    p = y_pred.double() - y_pred.double().mean(0)
    return ((t * p).sum(0) ** 2 / ((t * t).sum(0) * (p * p).sum(0))).float()


def r2_interval(y_true: torch.Tensor, y_pred: torch.Tensor, prompts: torch.Tensor) -> tuple[float, float]:
    """95 % bootstrap interval of the mean squared Pearson correlation, resampling test prompts (a prompt's pairs
    are correlated, so prompts are the independent units). Resamples add up per-prompt sums, so each is cheap."""
    t, p = y_true.double(), y_pred.double()
    ids, prompt_of = torch.unique(prompts, return_inverse=True)
    stats = torch.zeros(len(ids), 6, *t.shape[1:], dtype=torch.float64)  # n, St, Sp, Stt, Spp, Stp per (L, H)
    for k, values in enumerate((torch.ones_like(t), t, p, t * t, p * p, t * p)):
        stats[:, k].index_add_(0, prompt_of, values)
    stats = stats.numpy()

    def mean_r2(idx: np.ndarray) -> float:
        n, st, sp, stt, spp, stp = stats[idx].sum(0)
        cov, var_t, var_p = stp - st * sp / n, stt - st * st / n, spp - sp * sp / n
        return float((cov * cov / (var_t * var_p)).mean())

    return bootstrap(mean_r2, len(ids))


@torch.no_grad()
def predict(model: Surrogate, folder: Path, batch_size: int = 4096) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Held-out (y_true, y_pred, prompt index of each pair)."""
    trues, preds, prompts = [], [], []
    for path in shards(folder):
        shard = read_shard(path)
        for b in range(0, len(shard["y"]), batch_size):
            preds.append(model(shard["h"][b : b + batch_size].float()))
            trues.append(shard["y"][b : b + batch_size])
        prompts.append(shard["prompt"])
    return torch.cat(trues), torch.cat(preds), torch.cat(prompts)


def build_parser() -> argparse.ArgumentParser:
    """No defaults for the settings: their one default is in kvzap/plan/config.schema.json; each kind needs its own."""
    parser = argparse.ArgumentParser(description="Train a KVzap surrogate (linear or MLP) on oracle shards.")
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--data", type=Path, required=True, help="oracle folder with train/ and test/")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--alpha", type=float, help="ridge penalty (linear)")
    parser.add_argument("--epochs", type=int, help="MLP epochs")
    parser.add_argument("--lr", type=float, help="MLP learning rate")
    parser.add_argument("--batch-size", type=int, help="MLP batch size")
    parser.add_argument("--valid-split", choices=VALID_SPLITS, help="MLP: hold out 5%% of the pairs or of the prompts")
    parser.add_argument("--keep", choices=KEEP, help="MLP: the last epoch's weights or the best validation epoch's")
    parser.add_argument("--hidden-dim", type=int, default=None, help="default: input_dim / 8")
    parser.add_argument("--seed", type=int, required=True)
    return parser


@entry_point
def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    missing = [f"--{k.replace('_', '-')}" for k in TRAINING_KEYS[args.kind] if getattr(args, k) is None]
    if missing:
        parser.error(f"--kind {args.kind} needs {' '.join(missing)}")

    train_manifest = load_manifest(args.data / "train")  # refused before the output folder exists
    args.out.mkdir(parents=True, exist_ok=True)
    if args.kind == "linear":
        model, history = fit_ridge(args.data / "train", args.alpha), []
        params = {"kind": "linear", "alpha": args.alpha}
    else:
        model, history = fit_mlp(
            args.data / "train",
            args.out,
            args.epochs,
            args.lr,
            args.batch_size,
            args.hidden_dim,
            seed=args.seed,
            valid_split=args.valid_split,
            keep=args.keep,
        )
        params = {
            "kind": "mlp",
            "epochs": args.epochs,
            "lr": args.lr,
            "batch_size": args.batch_size,
            "hidden_dim": model.hidden_dim,
            "valid_fraction": 0.05,
            "valid_split": args.valid_split,
            "keep": args.keep,
        }
    y_true, y_pred, prompts = predict(model, args.data / "test")
    r2 = squared_pearson(y_true, y_pred)
    with atomic_path(args.out / "test_predictions.safetensors") as tmp:
        save_file(
            {"y_true": y_true.contiguous(), "y_pred": y_pred.contiguous(), "prompt": prompts.contiguous()}, str(tmp)
        )
    model.save_pretrained(args.out, extra_config={"base_model": train_manifest["model_id"]})
    metrics = {
        **stamp(
            {**params, "data": train_manifest["params_hash"]},
            {"model_id": train_manifest["model_id"], "revision": train_manifest["model_revision"]},
            args.seed,
        ),
        "kind": args.kind,
        "r2_mean": float(r2.mean()),
        "r2_mean_ci": list(r2_interval(y_true, y_pred, prompts)),
        "r2": r2.tolist(),  # one row per scored layer
        "layers": model.scored,  # the decoder layer of each row
        "n_train_pairs": train_manifest["n_pairs"],
        "n_test_pairs": len(y_true),
        "history": history,
    }
    atomic_write_json(args.out / "metrics.json", metrics)
    (args.out / CHECKPOINT).unlink(missing_ok=True)
    print(f"{args.kind}: mean R^2 over {r2.numel()} (layer, head) pairs = {metrics['r2_mean']:.3f}")


if __name__ == "__main__":
    main()
