"""Oracle data collection: (attention input h, log KVzip+ score) pairs, streamed to sharded files.

Layout of `out_dir` (one folder per split):
    settings.json                  everything that determines the shards (model revision and dtype, the
                                   prompts' sha256, sampling, seed...); a mismatch restarts from scratch
    shard-00000.safetensors        h (N, L, D) in the model's dtype, y (N, L, H) float32 (L: the scored layers),
    ...                            prompt (N,) int64 = prompt index in the split; with --store-kv also
                                   kv (N, L, H, 2*head_dim) = [key; value] as cached, in the model's dtype;
                                   format and checksum: kvzap.training.shards
    manifest.json                  written last: settings, dims, each prompt's source subset, per-shard counts
                                   and sha256; its presence = complete
RAM holds at most one shard; a killed run resumes after the last complete shard (shards are written
atomically). Token sampling is seeded per prompt, so reruns and resumes sample the same tokens.
Non-finite hidden states or scores stop the collection, naming the prompt; its pairs are never written.

Hybrid models: the shards hold the full-attention layers only (the oracle skips the sliding-window layers, whose
bounded cache KVzap leaves alone; kvzap.oracle.scores). The manifest's n_layers stays the decoder's total and
"layers" lists the scored layers' indices; both it and the settings' "skipped_layers" appear only when some layer
is skipped, so models without skipped layers keep the manifests, settings and params_hash they always had.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import torch
from tqdm import tqdm

from kvzap import dtypes
from kvzap.atomic import atomic_write_json
from kvzap.layer_types import pruned_layers, skipped_layers
from kvzap.oracle.scores import build_repeat_prompt, oracle_scores
from kvzap.prepare import models
from kvzap.provenance import stamp
from kvzap.refusal import entry_point
from kvzap.training import corpus
from kvzap.training.shards import shard_record, write_shard

SHARD_GLOB = "shard-*.safetensors"


def sample_positions(n_context: int, n_tokens: int | None, seed: int, prompt_index: int) -> torch.Tensor:
    """n_tokens positions drawn at random (seeded per prompt); None: every position."""
    if n_tokens is None:
        return torch.arange(n_context)
    generator = torch.Generator().manual_seed(seed * 1_000_003 + prompt_index)
    return torch.randperm(n_context, generator=generator)[:n_tokens].sort().values


def parse_token_count(value: str) -> int | None:
    """--tokens-per-prompt: a count, or "all" (None)."""
    return None if value == "all" else int(value)


def _resume_point(out_dir: Path, settings: dict) -> tuple[int, list[dict]]:
    """Prompts already covered by complete shards; stale shards from other settings are removed."""
    settings_file = out_dir / "settings.json"
    if settings_file.exists() and json.loads(settings_file.read_text()) == settings:
        records = [shard_record(path) for path in sorted(out_dir.glob(SHARD_GLOB))]
        return (records[-1]["last_prompt"] + 1 if records else 0), records
    for path in out_dir.glob(SHARD_GLOB):
        path.unlink()
    (out_dir / "manifest.json").unlink(missing_ok=True)
    atomic_write_json(settings_file, settings)
    return 0, []


def _shard_settings(
    settings: dict,
    model,
    model_record: dict,
    prompts: list[corpus.Prompt],
    tokens_per_prompt: int | None,
    shard_tokens: int,
    seed: int,
    store_kv: bool,
) -> dict:
    """The caller's settings plus everything else the shards depend on: resuming requires all of it unchanged.
    `store_kv` and the skipped layers are recorded only when on / not empty, so other collections keep the settings
    (and params_hash) they always had, and a change either way (e.g. shards of every layer, collected before
    sliding layers were skipped) restarts the collection."""
    texts = hashlib.sha256("\0".join(prompt.text for prompt in prompts).encode()).hexdigest()
    skipped = skipped_layers(model.config)
    return {
        **settings,
        "model_id": model_record["model_id"],
        "model_revision": model_record["revision"],
        "model_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "prompts_sha256": texts,
        "n_prompts": len(prompts),
        "tokens_per_prompt": tokens_per_prompt,
        "shard_tokens": shard_tokens,
        "seed": seed,
        **({"store_kv": True} if store_kv else {}),
        **({"skipped_layers": skipped} if skipped else {}),
    }


PAIR_NAMES = {"h": "hidden states", "y": "log KVzip+ scores", "kv": "keys/values"}


def _finite_pair(tensors: dict[str, torch.Tensor], prompt: corpus.Prompt, index: int) -> None:
    for key, tensor in tensors.items():
        if not torch.isfinite(tensor).all():
            raise ValueError(
                f"Prompt {index} of the split ({prompt.subset} #{prompt.index}) gave non-finite {PAIR_NAMES[key]}; "
                "nothing was written for it. Check the model's dtype (try --dtype float32 or bfloat16) "
                "or drop this prompt."
            )


def collect_split(
    model,
    tokenizer,
    prompts: list[corpus.Prompt],
    out_dir: Path,
    settings: dict,
    tokens_per_prompt: int | None,
    shard_tokens: int,
    seed: int,
    model_record: dict,
    store_kv: bool = False,
) -> dict:
    """Collect one split's pairs into `out_dir`; `store_kv` also keeps each sampled token's cached keys and
    values (tensor `kv`), the inputs of the (k, v) surrogate ablation (kvzap.ablations.kv_input)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = _shard_settings(settings, model, model_record, prompts, tokens_per_prompt, shard_tokens, seed, store_kv)
    start, shards = _resume_point(out_dir, settings)
    buffer: dict[str, list[torch.Tensor]] = {"h": [], "y": [], "prompt": [], **({"kv": []} if store_kv else {})}

    def flush():
        if not buffer["y"]:
            return
        tensors = {k: torch.cat(v) for k, v in buffer.items()}
        shards.append(write_shard(out_dir / f"shard-{len(shards):05d}.safetensors", tensors))
        for v in buffer.values():
            v.clear()

    for index in tqdm(range(start, len(prompts)), desc=f"oracle {out_dir.name}", initial=start, total=len(prompts)):
        prompt = build_repeat_prompt(tokenizer, prompts[index].text)
        n_context = prompt.context.stop - prompt.context.start
        positions = sample_positions(n_context, tokens_per_prompt, seed, index)
        scores = oracle_scores(model, prompt, keep_positions=positions, keep_kv=store_kv)
        pair = {
            "h": scores.hidden.transpose(0, 1),  # (n, L, D)
            "y": scores.kvzip_plus_log[:, :, positions].permute(2, 0, 1).float(),  # (n, L, H)
            **({"kv": scores.kv.permute(2, 0, 1, 3)} if store_kv else {}),  # (n, L, H, 2d)
        }
        _finite_pair(pair, prompts[index], index)
        for key, tensor in pair.items():
            buffer[key].append(tensor)
        buffer["prompt"].append(torch.full((len(positions),), index, dtype=torch.int64))
        if sum(len(part) for part in buffer["y"]) >= shard_tokens:
            flush()
    flush()

    config = model.config
    manifest = {
        **stamp(settings, model_record, seed),
        "n_layers": config.num_hidden_layers,
        **({"layers": pruned_layers(config)} if skipped_layers(config) else {}),  # scored, when some are skipped
        "hidden_size": config.hidden_size,
        "n_kv_heads": config.num_key_value_heads,
        "dtype": settings["model_dtype"],
        "n_prompts": len(prompts),
        "prompt_subsets": [prompt.subset for prompt in prompts],  # which source each prompt index came from
        "n_pairs": sum(s["n"] for s in shards),
        "shards": shards,
    }
    atomic_write_json(out_dir / "manifest.json", manifest)
    return manifest


def build_parser() -> argparse.ArgumentParser:
    """Every setting is required: its one default lives in kvzap/plan/config.schema.json (the rules pass them all)."""
    parser = argparse.ArgumentParser(description="Collect oracle (h, log KVzip+) pairs for surrogate training.")
    parser.add_argument("--model", type=Path, required=True, help="model.json written by kvzap.prepare.models")
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--corpus-revision", default=None, help="the Hub corpus's revision (default: main)")
    parser.add_argument("--min-tokens", type=int, required=True)
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--n-test", type=int, required=True, help="held-out prompts per subset")
    parser.add_argument("--n-train", type=int, required=True, help="training prompts per subset")
    parser.add_argument("--tokens-per-prompt", type=parse_token_count, required=True, help='a count, or "all"')
    parser.add_argument("--shard-tokens", type=int, required=True)
    parser.add_argument("--dtype", choices=dtypes.CHOICES, required=True, help="auto: the fastest exact one here")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument(
        "--store-kv",
        action="store_true",
        help="also store each sampled token's cached keys and values (for kvzap.ablations.kv_input)",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder receiving train/ and test/")
    return parser


@entry_point
def main() -> None:
    args = build_parser().parse_args()
    args.dtype = dtypes.resolve(args.dtype)  # provenance records the dtype the job runs in

    torch.manual_seed(args.seed)
    model, tokenizer = models.load(args.model, dtype=args.dtype)
    record = models.read_record(args.model)
    prompts = corpus.select(
        args.corpus, tokenizer, args.min_tokens, args.max_tokens, args.n_test, args.n_train, args.corpus_revision
    )
    # the Hub commit read, recorded (an offline corpus is pinned by its package versions)
    read = (
        {"corpus_revision": corpus.read_revision(args.corpus, args.corpus_revision)}
        if corpus.on_hub(args.corpus)
        else {}
    )
    for split in ("test", "train"):
        settings = {
            "corpus": args.corpus,
            **read,
            "split": split,
            "token_length": [args.min_tokens, args.max_tokens],
            "n_test": args.n_test,
            "n_train": args.n_train,
            "dtype": args.dtype,
        }
        manifest = collect_split(
            model,
            tokenizer,
            prompts[split],
            args.out / split,
            settings,
            args.tokens_per_prompt,
            args.shard_tokens,
            args.seed,
            record,
            args.store_kv,
        )
        print(
            f"{split}: {manifest['n_prompts']} prompts, {manifest['n_pairs']} pairs in {len(manifest['shards'])} shards"
        )


if __name__ == "__main__":
    main()
