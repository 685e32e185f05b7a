"""Fit KVzap surrogates on oracle shards and measure them on held-out prompts.

KVzap-Linear: ridge regression (alpha 1, with intercept, as scikit-learn's Ridge()) solved per layer from
normal equations accumulated over the shards in float64, so the data never has to fit in memory.
KVzap-MLP: D -> D/8 -> GELU -> H per layer, all layers in one network, AdamW + cosine schedule +
grad-norm clipping, 5% validation split; streams shard by shard and checkpoints every epoch (resumable).
Fit quality: squared Pearson correlation per (layer, head) on the test prompts (the paper's Table 1).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from kvzap.collect import read_shard
from kvzap.io import atomic_path, atomic_write_json
from kvzap.provenance import stamp
from kvzap.surrogate import Surrogate


def load_manifest(folder: Path) -> dict:
    path = folder / "manifest.json"
    if not path.exists():
        raise SystemExit(f"{path} is missing: the oracle collection for {folder} has not completed.")
    return json.loads(path.read_text())


def shards(folder: Path) -> list[Path]:
    return [folder / s["file"] for s in load_manifest(folder)["shards"]]


def device_default() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ---------------------------------------------------------------- ridge


def fit_ridge(folder: Path, alpha: float = 1.0, device: torch.device | None = None) -> Surrogate:
    device = device or device_default()
    sxx = sx = sxy = sy = n = 0
    for path in tqdm(shards(folder), desc="ridge: accumulate"):
        shard = read_shard(path)
        x = shard["h"].to(device, torch.float64).transpose(0, 1)  # (L, N, D)
        y = shard["y"].to(device, torch.float64).transpose(0, 1)  # (L, N, H)
        sxx = sxx + x.transpose(1, 2) @ x  # (L, D, D)
        sxy = sxy + x.transpose(1, 2) @ y  # (L, D, H)
        sx = sx + x.sum(dim=1)  # (L, D)
        sy = sy + y.sum(dim=1)  # (L, H)
        n += x.shape[1]
    mean_x, mean_y = sx / n, sy / n
    # Centre the sums: X_c^T X_c = Sxx - n mx mx^T, X_c^T y_c = Sxy - n mx my^T (the intercept is not penalised).
    xtx = sxx - n * mean_x[:, :, None] * mean_x[:, None, :]
    xty = sxy - n * mean_x[:, :, None] * mean_y[:, None, :]
    eye = torch.eye(xtx.shape[-1], dtype=torch.float64, device=device)
    weight = torch.linalg.solve(xtx + alpha * eye, xty)  # (L, D, H)
    bias = mean_y - (mean_x[:, None, :] @ weight)[:, 0]  # (L, H)
    n_layers, dim, heads = weight.shape
    model = Surrogate(dim, heads, n_layers)
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            layer.weight.copy_(weight[i].T.float())
            layer.bias.copy_(bias[i].float())
    return model.eval().requires_grad_(False)


# ---------------------------------------------------------------- MLP


def _validation_masks(folder: Path, fraction: float, seed: int) -> list[torch.Tensor]:
    """A seeded random `fraction` of all pairs, as one boolean mask per shard."""
    sizes = [s["n"] for s in load_manifest(folder)["shards"]]
    total = sum(sizes)
    chosen = torch.zeros(total, dtype=torch.bool)
    chosen[torch.randperm(total, generator=torch.Generator().manual_seed(seed))[: int(round(fraction * total))]] = True
    return list(chosen.split(sizes))


def _target_mean(folder: Path) -> torch.Tensor:
    total, count = 0.0, 0
    for path in shards(folder):
        y = read_shard(path)["y"].double()
        total, count = total + y.sum(0), count + len(y)
    return (total / count).float()  # (L, H)


def _checkpoint_paths(out: Path) -> tuple[Path, Path]:
    return out / "checkpoint.safetensors", out / "checkpoint.json"


def _save_checkpoint(out: Path, model, optimizer, scheduler, epoch: int) -> None:
    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    for i, state in optimizer.state_dict()["state"].items():
        for name, value in state.items():
            tensors[f"optim.{i}.{name}"] = torch.as_tensor(value).detach().cpu().contiguous()
    weights, meta = _checkpoint_paths(out)
    with atomic_path(weights) as tmp:
        save_file(tensors, str(tmp))
    atomic_write_json(meta, {"epoch": epoch, "scheduler": scheduler.state_dict()})


def _load_checkpoint(out: Path, model, optimizer, scheduler) -> int:
    """Restore the last finished epoch; returns the epoch to start from (0 without a checkpoint)."""
    weights, meta = _checkpoint_paths(out)
    if not (weights.exists() and meta.exists()):
        return 0
    try:
        tensors = load_file(str(weights))
    except Exception as err:  # safetensors raises several types for a truncated file
        raise ValueError(f"Corrupt training checkpoint {weights}: {err}. Delete it to restart training.") from err
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    state = optimizer.state_dict()
    for i in range(len(state["param_groups"][0]["params"])):
        state["state"][i] = {name: tensors[f"optim.{i}.{name}"] for name in ("step", "exp_avg", "exp_avg_sq")}
    optimizer.load_state_dict(state)
    info = json.loads(meta.read_text())
    scheduler.load_state_dict(info["scheduler"])
    for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
        group["lr"] = lr
    return info["epoch"] + 1


def fit_mlp(folder: Path, out: Path, epochs: int = 15, lr: float = 5e-3, batch_size: int = 512,
            hidden_dim: int | None = None, valid_fraction: float = 0.05, seed: int = 42,
            device: torch.device | None = None) -> tuple[Surrogate, list[dict]]:
    device = device or device_default()
    manifest = load_manifest(folder)
    dim, heads, n_layers = manifest["hidden_size"], manifest["n_kv_heads"], manifest["n_layers"]
    torch.manual_seed(seed)
    model = Surrogate(dim, heads, n_layers, hidden_dim or dim // 8)
    with torch.no_grad():  # start at the mean log-score (about -8) rather than spend epochs learning the offset
        for layer, mean in zip(model.layers, _target_mean(folder)):
            layer[2].bias.copy_(mean)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    start = _load_checkpoint(out, model, optimizer, scheduler)
    masks = _validation_masks(folder, valid_fraction, seed)
    paths = shards(folder)
    history_file = out / "history.json"
    history = json.loads(history_file.read_text()) if start and history_file.exists() else []
    generator = torch.Generator().manual_seed(seed)

    def epoch_plan():
        """Shard order and per-shard shuffles of one epoch, drawn up front so a resume can replay them."""
        order = torch.randperm(len(paths), generator=generator).tolist()
        return [(s, torch.randperm(int((~masks[s]).sum()), generator=generator)) for s in order]

    for _ in range(start):  # a resumed run draws the same shuffles as an unbroken one
        epoch_plan()

    for epoch in range(start, epochs):
        model.train()
        train_loss, seen = 0.0, 0
        bar = tqdm(epoch_plan(), desc=f"mlp epoch {epoch + 1}/{epochs}")
        for s, perm in bar:
            shard = read_shard(paths[s])
            x, y = shard["h"][~masks[s]], shard["y"][~masks[s]]
            for b in range(0, len(y), batch_size):
                idx = perm[b:b + batch_size]
                xb, yb = x[idx].to(device, torch.float32), y[idx].to(device, torch.float32)
                loss = torch.nn.functional.mse_loss(model(xb), yb)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                train_loss += loss.item() * len(idx)
                seen += len(idx)
            bar.set_postfix(loss=f"{train_loss / max(seen, 1):.4f}")
        scheduler.step()
        valid_loss = _validation_loss(model, paths, masks, batch_size, device)
        history.append({"epoch": epoch + 1, "train_loss": train_loss / max(seen, 1), "valid_loss": valid_loss})
        print(f"epoch {epoch + 1}: train {history[-1]['train_loss']:.4f} valid {valid_loss:.4f}")
        atomic_write_json(history_file, history)
        _save_checkpoint(out, model, optimizer, scheduler, epoch)
    return model.cpu().eval().requires_grad_(False), history


@torch.no_grad()
def _validation_loss(model, paths, masks, batch_size, device) -> float:
    model.eval()
    total, count = 0.0, 0
    for path, mask in zip(paths, masks):
        shard = read_shard(path)
        x, y = shard["h"][mask], shard["y"][mask]
        for b in range(0, len(y), batch_size):
            pred = model(x[b:b + batch_size].to(device, torch.float32))
            total += torch.nn.functional.mse_loss(pred, y[b:b + batch_size].to(device), reduction="sum").item()
            count += y[b:b + batch_size].numel()
    return total / max(count, 1)


# ---------------------------------------------------------------- evaluation


def squared_pearson(y_true: torch.Tensor, y_pred: torch.Tensor) -> torch.Tensor:
    """(N, L, H) pairs -> (L, H) squared Pearson correlation over N."""
    t = y_true.double() - y_true.double().mean(0)
    p = y_pred.double() - y_pred.double().mean(0)
    return ((t * p).sum(0) ** 2 / ((t * t).sum(0) * (p * p).sum(0))).float()


@torch.no_grad()
def predict(model: Surrogate, folder: Path, batch_size: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    trues, preds = [], []
    for path in shards(folder):
        shard = read_shard(path)
        for b in range(0, len(shard["y"]), batch_size):
            preds.append(model(shard["h"][b:b + batch_size].float()))
            trues.append(shard["y"][b:b + batch_size])
    return torch.cat(trues), torch.cat(preds)


def main() -> None:
    parser = argparse.ArgumentParser(description="Train a KVzap surrogate (linear or MLP) on oracle shards.")
    parser.add_argument("--kind", choices=["linear", "mlp"], required=True)
    parser.add_argument("--data", type=Path, required=True, help="oracle folder with train/ and test/")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--hidden-dim", type=int, default=None, help="default: input_dim / 8")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    train_manifest = load_manifest(args.data / "train")
    if args.kind == "linear":
        model, history = fit_ridge(args.data / "train", args.alpha), []
        params = {"kind": "linear", "alpha": args.alpha}
    else:
        model, history = fit_mlp(args.data / "train", args.out, args.epochs, args.lr, args.batch_size,
                                 args.hidden_dim, seed=args.seed)
        params = {"kind": "mlp", "epochs": args.epochs, "lr": args.lr, "batch_size": args.batch_size,
                  "hidden_dim": model.hidden_dim, "valid_fraction": 0.05}
    y_true, y_pred = predict(model, args.data / "test")
    r2 = squared_pearson(y_true, y_pred)
    with atomic_path(args.out / "test_predictions.safetensors") as tmp:
        save_file({"y_true": y_true.contiguous(), "y_pred": y_pred.contiguous()}, str(tmp))
    model.save_pretrained(args.out, extra_config={"base_model": train_manifest["model_id"]})
    metrics = {
        **stamp({**params, "data": train_manifest["params_hash"]}, {"model_id": train_manifest["model_id"],
                "revision": train_manifest["model_revision"]}, args.seed),
        "kind": args.kind,
        "r2_mean": float(r2.mean()),
        "r2": r2.tolist(),
        "n_train_pairs": train_manifest["n_pairs"],
        "n_test_pairs": len(y_true),
        "history": history,
    }
    atomic_write_json(args.out / "metrics.json", metrics)
    for path in _checkpoint_paths(args.out):
        path.unlink(missing_ok=True)
    print(f"{args.kind}: mean R^2 over {r2.numel()} (layer, head) pairs = {metrics['r2_mean']:.3f}")


if __name__ == "__main__":
    main()
