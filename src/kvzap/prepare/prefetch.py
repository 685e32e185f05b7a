"""Everything a run reads from the Hugging Face Hub, downloaded into the caches before any job, so that a cluster
without network runs the config with HF_HUB_OFFLINE=1 (`snakemake prefetch`, `make prefetch`).

What to fetch is the plan's to say (kvzap.plan.hub_assets reads it from the config: models, benchmark datasets, the
oracle corpus, the Hub assets of the methods); this module fetches a list of `Fetch` items, each with the very call
the run makes, at the revision the config pins, and prints what it got. It also says why the Hub refused a
repository (`refusal`: gated, missing, no such revision), for prepare, the plan's checks and itself.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from urllib.parse import quote

import httpx
from huggingface_hub import constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from tabulate import tabulate

from kvzap.atomic import atomic_path
from kvzap.prepare.hub_files import dataset_files, snapshot_commit
from kvzap.refusal import entry_point

# The files of a Hub model that prepare pins and prefetch downloads: config, weights, tokenizer, chat template.
MODEL_FILES = ("*.json", "*.safetensors", "*.model", "*.txt", "*.jinja")
KINDS = ("snapshot", "dataset", "file", "datasets-cache", "mirror")
TRUE = ("1", "ON", "YES", "TRUE")


class FetchError(RuntimeError):
    """A download that failed for a reason the user can fix; the message names what and the fix."""


class HubRefusal(FetchError):
    """The Hub refused a repository for a reason the user must fix; the message names it and the fix."""


def hub_page(repo_id: str, repo_type: str = "model") -> str:
    return f"https://huggingface.co/{'datasets/' if repo_type == 'dataset' else ''}{repo_id}"


def refusal(
    repo_id: str, error: BaseException, repo_type: str = "model", revision: str | None = None
) -> tuple[str, str] | None:
    """(problem, fix) when `error` is the Hub refusing `repo_id`: gated (or a 401/403 for it), no such repository,
    no such revision, a rejected token. None otherwise (unreachable, server errors): not the config's fault."""
    if not isinstance(error, HfHubHTTPError):
        return None
    status = getattr(error.response, "status_code", None)
    page = hub_page(repo_id, repo_type)
    login = "`hf auth login`, or export HF_TOKEN=<a read token>"
    if "Invalid credentials" in str(error.server_message or ""):
        return f"the Hub rejected this machine's token (HTTP {status})", f"log in again ({login})"
    if isinstance(error, GatedRepoError) or (
        status in (401, 403) and not isinstance(error, (RepositoryNotFoundError, RevisionNotFoundError))
    ):
        who = "the token in use has not been granted access" if status == 403 else "this machine sent no token"
        return (
            f"a gated {repo_type} on the Hugging Face Hub: its files need an accepted licence and a token, and {who} "
            f"(HTTP {status})",
            f"while logged in at {page}, accept its licence; then give this machine a read token ({login}); or run "
            "`snakemake prefetch` (`make prefetch`) where such a token exists, into the Hub cache this machine "
            "reads (HF_HUB_CACHE), and run here with HF_HUB_OFFLINE=1",
        )
    if isinstance(error, RevisionNotFoundError):
        return (
            f"the Hub has no revision {revision!r} of {repo_id}",
            f"pin a branch, tag or commit of {page} (its history: {page}/commits/main), or drop the revision to "
            "read the main branch",
        )
    if isinstance(error, RepositoryNotFoundError):
        return (
            f"the Hub has no {repo_type} repository {repo_id}, or it is private and this machine may not read it",
            f"check the id at {page}; for a private repository, give this machine a token that may read it ({login})",
        )
    return None


def refused(repo_id: str, error: BaseException, repo_type: str = "model", revision: str | None = None):
    """A HubRefusal naming `repo_id`, the problem and the fix; None when `error` is not a refusal."""
    reason = refusal(repo_id, error, repo_type, revision)
    return None if reason is None else HubRefusal(f"{repo_id}: {reason[0]}. Fix: {reason[1]}")


@dataclass(frozen=True)
class Fetch:
    """One download, made with the call the run makes:
    snapshot        snapshot_download(repo, allow_patterns=patterns or every file): a model, Q-Filters
    dataset         kvzap.prepare.hub_files.dataset_files(repo, pattern) per pattern: RULER, AIME25, Nemotron
    file            hf_hub_download(repo, name) per name in patterns: LongBench's data.zip
    datasets-cache  datasets.load_dataset(repo, split=split): prepares HF_DATASETS_CACHE, all that third-party code
                    calling it reads offline (kvpress's DuoAttention on the fly: kmfoda/booksum)
    mirror          GET <source>/<repo>/<name> per name into a local folder: files that are not on the Hub
                    (DuoAttention's head patterns, read through KVZAP_DUO_PATTERNS)
    """

    kind: str
    repo: str
    repo_type: str = "model"
    revision: str | None = None
    patterns: tuple[str, ...] = ()
    split: str | None = None
    source: str | None = None
    needed_by: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Unknown fetch kind {self.kind!r}: use one of {KINDS}")

    def to_json(self) -> dict:
        """The fields that differ from their defaults (the whole list travels on a command line)."""
        defaults = Fetch(self.kind, self.repo)
        return {k: v for k, v in asdict(self).items() if k in ("kind", "repo") or v != getattr(defaults, k)}

    @classmethod
    def from_json(cls, data: dict) -> Fetch:
        tuples = {k: tuple(data[k]) for k in ("patterns", "needed_by") if k in data}
        return cls(**{**data, **tuples})


def offline_switches() -> list[str]:
    """The environment variables that forbid downloads, as huggingface_hub and datasets read them."""
    return [name for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if os.environ.get(name, "").upper() in TRUE]


def _count(folder: Path, patterns: tuple[str, ...]) -> int:
    files = (p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    return sum(1 for f in files if not patterns or any(fnmatch(f, p) for p in patterns))


def _snapshot(item: Fetch) -> tuple[str, int]:
    folder = Path(
        snapshot_download(
            item.repo, repo_type=item.repo_type, revision=item.revision, allow_patterns=list(item.patterns) or None
        )
    )
    return folder.name, _count(folder, item.patterns)


def _dataset(item: Fetch) -> tuple[str, int]:
    files = [f for pattern in item.patterns for f in dataset_files(item.repo, pattern, item.revision)]
    return snapshot_commit(files[0]), len(set(files))


def _file(item: Fetch) -> tuple[str, int]:
    paths = [hf_hub_download(item.repo, n, repo_type=item.repo_type, revision=item.revision) for n in item.patterns]
    return snapshot_commit(Path(paths[0])), len(paths)


def _datasets_cache(item: Fetch) -> tuple[str, int]:
    from datasets import load_dataset

    data = load_dataset(item.repo, split=item.split, revision=item.revision)
    files = [Path(f["filename"]) for f in data.cache_files]
    return (files[0].parent.name if files else "?"), len(files)


def _mirror(item: Fetch, mirror: Path) -> tuple[str, int]:
    """Each file of folder `repo` at `source` (a base URL), into `mirror`; a local `source` is checked, not copied."""
    if not item.source.startswith(("http://", "https://")):
        missing = [n for n in item.patterns if not (Path(item.source) / item.repo / n).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{Path(item.source) / item.repo} lacks {missing}: the local mirror that KVZAP_DUO_PATTERNS names "
                "is incomplete. Fix: unset KVZAP_DUO_PATTERNS and prefetch again (it downloads them)."
            )
        return "local", len(item.patterns)
    for name in item.patterns:
        url = f"{item.source.rstrip('/')}/{quote(item.repo)}/{name}"
        response = httpx.get(url, timeout=60, follow_redirects=True)
        if response.status_code != 200:
            raise FetchError(
                f"Could not download {url} (HTTP {response.status_code}). Fix: check the network, or point "
                "KVZAP_DUO_PATTERNS at a folder laid out like duo-attention's attn_patterns/."
            )
        with atomic_path(mirror / item.repo / name) as tmp:
            tmp.write_bytes(response.content)
    return "-", len(item.patterns)


def fetch(item: Fetch, mirror: Path) -> dict:
    """Download one item; returns its row of the table. A refusal by the Hub becomes a HubRefusal."""
    run = {"snapshot": _snapshot, "dataset": _dataset, "file": _file, "datasets-cache": _datasets_cache}
    try:
        commit, n_files = _mirror(item, mirror) if item.kind == "mirror" else run[item.kind](item)
    except HfHubHTTPError as error:
        if (refusal := refused(item.repo, error, item.repo_type, item.revision)) is None:
            raise
        raise refusal from error
    except LocalEntryNotFoundError as error:  # the Hub unreachable, and the files not cached
        reason = " ".join(str(error).split())
        raise FetchError(
            f"{item.repo}: the Hub at {constants.ENDPOINT} could not be reached ({reason}). Fix: run prefetch "
            "where it is reachable (HF_ENDPOINT names a mirror, if you use one)"
        ) from error
    return {
        "repo": item.repo,
        "type": {"mirror": "mirror (not Hub)", "datasets-cache": "datasets cache"}.get(item.kind, item.repo_type),
        "revision asked": item.revision or ("main" if item.kind != "mirror" else "-"),
        "commit got": commit,
        "files": n_files,
        "needed by": ", ".join(item.needed_by),
    }


def prefetch(items: list[Fetch], mirror: Path) -> list[dict]:
    """Fetch every item, in order; refuses offline mode, in which nothing can be downloaded."""
    switches = offline_switches()
    if switches and items:
        raise HubRefusal(
            f"prefetch downloads, and {' and '.join(f'{s}=1' for s in switches)} forbids it. Fix: run prefetch "
            "where the Hub is reachable, with those variables unset; the offline run sets them afterwards"
        )
    return [fetch(item, mirror) for item in items]


def default_mirror() -> Path:
    """Where files from outside the Hub go: beside the Hub cache's repositories, so one folder travels."""
    return Path(constants.HF_HUB_CACHE) / "duo-attention-patterns"


@entry_point
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fetches", required=True, help="a JSON list of fetches (kvzap.plan.hub_assets.manifest)")
    parser.add_argument("--mirror", type=Path, default=None, help="folder for non-Hub files (default: in HF_HUB_CACHE)")
    args = parser.parse_args(argv)
    items = [Fetch.from_json(d) for d in json.loads(args.fetches)]
    mirror = args.mirror or default_mirror()
    try:
        rows = prefetch(items, mirror)
    except (FetchError, FileNotFoundError) as err:
        raise SystemExit(str(err)) from None
    if not rows:
        print("Nothing to fetch: this config reads nothing from the Hub")
        return
    print(tabulate(rows, headers="keys", tablefmt="github"))
    print(f"Hub cache: {constants.HF_HUB_CACHE}")
    if any(item.kind == "datasets-cache" for item in items):
        from datasets import config as datasets_config

        print(f"datasets cache: {datasets_config.HF_DATASETS_CACHE}")
    if any(item.kind == "mirror" and item.source.startswith(("http://", "https://")) for item in items):
        print(f"Run offline with KVZAP_DUO_PATTERNS={mirror} (the DuoAttention head patterns are not on the Hub).")
    print("Offline run: HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1, with the same HF_HUB_CACHE / HF_DATASETS_CACHE.")


if __name__ == "__main__":
    main()
