"""Each model's config as the planner sees it, torch-free: known facts for the offline models, the Hub's config.json
for the others (the local Hub cache first, else one download). None when there is none to read now (the Hub offline
or unreachable, or the repository without a config.json): the plan-time family checks are then skipped, and the jobs
refuse what cannot run with the same reasons (kvzap.families). A repository the Hub refuses (gated without an
accepted licence, missing, no such revision) is refused here, before any job is queued, with the fix
(kvzap.prepare.prefetch.refusal): the run's first job would fail on it anyway.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import httpx
from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url, try_to_load_from_cache
from huggingface_hub.errors import HfHubHTTPError, RevisionNotFoundError

from kvzap.plan.errors import fail
from kvzap.prepare.prefetch import refusal

CONFIG = "config.json"
# The config.json keys kvzap.families reads, as each offline model's GGUF loads (offline-assets.md §1).
OFFLINE_CONFIGS = {
    "offline/SmolLM2-135M-Instruct": {"model_type": "llama", "num_hidden_layers": 30},
    "offline/gemma-3-270m": {
        "model_type": "gemma3_text",
        "num_hidden_layers": 18,
        "sliding_window": 512,
        "layer_types": ["full_attention" if i in (5, 11, 17) else "sliding_attention" for i in range(18)],
    },
}


@functools.cache
def model_config(model_id: str, revision: str | None = None) -> dict | None:
    """The config of a model entry's id (offline/<name> or a Hub id), or None when it cannot be read now; raises
    ConfigError when the Hub refuses the repository."""
    if model_id.startswith("offline/"):
        return OFFLINE_CONFIGS.get(model_id)
    path = try_to_load_from_cache(model_id, CONFIG, revision=revision)
    if not isinstance(path, str):
        path = _download(model_id, revision)
    return None if path is None else json.loads(Path(path).read_text())


def _download(model_id: str, revision: str | None) -> str | None:
    """One attempt: huggingface_hub retries an unreachable Hub for about 25 s per file, on every plan."""
    if constants.HF_HUB_OFFLINE:
        return None
    try:
        get_hf_file_metadata(hf_hub_url(model_id, CONFIG, revision=revision))
        return hf_hub_download(model_id, CONFIG, revision=revision)
    except HfHubHTTPError as error:
        reason = refusal(model_id, error, revision=revision)
        if reason is None:  # a server error, or no config.json in the repository
            return None
        # The entry's name is not known here: `*` stands for it, the value names the repository.
        if isinstance(error, RevisionNotFoundError):
            fail("models.*.revision", revision, *reason)
        fail("models.*.id", model_id, *reason)
    except (OSError, httpx.HTTPError):  # unreachable: the plan-time family checks are skipped
        return None
