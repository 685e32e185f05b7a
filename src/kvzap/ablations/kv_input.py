"""The paper's appendix ablation: a surrogate reading a token's cached (k, v) pair instead of its attention input h.

Per (layer, KV head): ridge regression from [k_h; v_h] (2*head_dim inputs, the keys RoPE'd as cached) to that
head's log KVzip+ score. Against it, KVzap-Linear exactly as kvzap.training.fit fits it (per layer, h -> every head),
on the same train shards with the same alpha. Both are scored by squared Pearson per (layer, head) on the test
split (the paper's Table 1 metric); the paper reports strictly lower R^2 for (k, v) [App. A].
Needs oracle shards collected with `python -m kvzap.training.collect ... --store-kv`.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import torch
from tqdm import tqdm

from kvzap.atomic import atomic_write_json
from kvzap.provenance import stamp
from kvzap.refusal import entry_point
from kvzap.training import fit
from kvzap.training.shards import read_shard

ROW_CHUNK = 2048  # rows per float64 batch: bounds memory at ROW_CHUNK * L * H * 2d * 8 bytes


def _kv_batches(folder: Path, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(kv (L, H, n, 2d), y (L, H, n, 1)) float64 batches of every shard of `folder`, in shard order."""
    for path in tqdm(fit.shards(folder), desc=f"kv: {folder.name}"):
        shard = read_shard(path)
        if "kv" not in shard:
            raise ValueError(
                f"{path} holds no keys/values (tensor 'kv'): collect the oracle data with "
                "`python -m kvzap.training.collect ... --store-kv` to run the (k, v) ablation."
            )
        for start in range(0, len(shard["y"]), ROW_CHUNK):
            rows = slice(start, start + ROW_CHUNK)
            kv = shard["kv"][rows].to(device, torch.float64).permute(1, 2, 0, 3)
            y = shard["y"][rows].to(device, torch.float64).permute(1, 2, 0)[..., None]
            yield kv, y


def fit_kv_ridge(
    folder: Path, alpha: float = 1.0, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One ridge per (layer, KV head) from [k; v] to its log score: weight (L, H, 2d), bias (L, H), float64."""
    weight, bias = fit.ridge_solve(_kv_batches(folder, device or fit.device_default()), alpha, folder)
    return weight[..., 0], bias[..., 0]


@torch.no_grad()
def predict_kv(weight: torch.Tensor, bias: torch.Tensor, folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(y_true, y_pred), both (N, L, H), over the shards of `folder` in order (as fit.predict)."""
    trues, preds = [], []
    for kv, y in _kv_batches(folder, weight.device):
        preds.append(((kv @ weight[..., None])[..., 0] + bias[..., None]).permute(2, 0, 1).cpu())
        trues.append(y[..., 0].permute(2, 0, 1).cpu())
    return torch.cat(trues), torch.cat(preds)


def _row(name: str, y_true: torch.Tensor, y_pred: torch.Tensor, prompts: torch.Tensor) -> dict:
    r2 = fit.squared_pearson(y_true, y_pred)
    return {
        "input": name,
        "r2_mean": float(r2.mean()),
        "r2_mean_ci": list(fit.r2_interval(y_true, y_pred, prompts)),
        "r2": r2.tolist(),
    }


def run(data: Path, alpha: float = 1.0, device: torch.device | None = None) -> dict:
    """Fit both surrogates on data/train, score them on data/test: the rows of kv_ablation.json."""
    device = device or fit.device_default()
    linear = fit.fit_ridge(data / "train", alpha, device)
    h_true, h_pred, prompts = fit.predict(linear, data / "test")
    weight, bias = fit_kv_ridge(data / "train", alpha, device)
    kv_true, kv_pred = predict_kv(weight, bias, data / "test")  # the same pairs, in the same order
    train_manifest = fit.load_manifest(data / "train")
    return {
        **stamp(
            {"alpha": alpha, "data": train_manifest["params_hash"]},
            {"model_id": train_manifest["model_id"], "revision": train_manifest["model_revision"]},
        ),
        "rows": [_row("h", h_true, h_pred, prompts), _row("kv", kv_true, kv_pred, prompts)],
        "layers": fit.data_layers(train_manifest),  # the decoder layer of each r2 row (a hybrid's scored ones)
        "n_train_pairs": train_manifest["n_pairs"],
        "n_test_pairs": len(h_true),
    }


@entry_point
def main() -> None:
    parser = argparse.ArgumentParser(description="R^2 of ridge surrogates from (k, v) vs from h (paper App. A).")
    parser.add_argument(
        "--data", type=Path, required=True, help="oracle folder with train/ and test/, collected with --store-kv"
    )
    parser.add_argument("--alpha", type=float, default=1.0, help="ridge penalty of both surrogates")
    parser.add_argument("--out", type=Path, required=True, help="folder receiving kv_ablation.json")
    args = parser.parse_args()
    result = run(args.data, args.alpha)
    atomic_write_json(args.out / "kv_ablation.json", result)
    for row in result["rows"]:
        print(
            f"input {row['input']}: mean R^2 over {len(row['r2'])} x {len(row['r2'][0])} (layer, head) "
            f"= {row['r2_mean']:.3f}"
        )


if __name__ == "__main__":
    main()
