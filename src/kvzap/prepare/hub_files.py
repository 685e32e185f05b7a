"""Files of a Hub dataset repository, fetched with huggingface_hub and read locally by the callers.

`datasets.load_dataset(<repo id>)` does not resolve a repository from the Hub cache when HF_HUB_OFFLINE=1 (it
only reuses its own prepared Arrow cache and otherwise raises "Couldn't reach ... on the Hub"), whereas
`snapshot_download` does. Fetching the files this way runs the same code online, offline from a warm cache and in
the rehearsal's fake Hub cache, lets a config pin a revision, and tells which commit was read (`snapshot_commit`),
which every output records.
"""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path


def dataset_files(repo_id: str, pattern: str, revision: str | None = None) -> list[Path]:
    """The files of dataset `repo_id` whose path in the repository matches `pattern` (huggingface_hub's
    allow_patterns syntax: fnmatch, where `*` also crosses folders), sorted by that path."""
    from huggingface_hub import snapshot_download

    folder = Path(snapshot_download(repo_id, repo_type="dataset", allow_patterns=[pattern], revision=revision))
    files = sorted(
        (p for p in folder.rglob("*") if p.is_file() and fnmatch(p.relative_to(folder).as_posix(), pattern)),
        key=lambda p: p.relative_to(folder).as_posix(),
    )
    if not files:
        raise FileNotFoundError(
            f"No file matching {pattern!r} in the Hub dataset {repo_id} (revision {revision or 'main'}, "
            f"snapshot {folder}): check the repository layout, or download it once with network access "
            f"(HF_HUB_OFFLINE unset, or `snakemake prefetch`) into the cache that HF_HUB_CACHE names."
        )
    return files


def snapshot_commit(path: Path) -> str | None:
    """The commit of the Hub snapshot a downloaded file lies in (`.../snapshots/<commit>/...`), None elsewhere."""
    for parent in Path(path).parents:
        if parent.parent.name == "snapshots":
            return parent.name
    return None


def dataset_revision(repo_id: str, files: list[Path]) -> str:
    """What a run read, for its provenance: `<repo id>@<commit>`."""
    return f"{repo_id}@{snapshot_commit(files[0]) if files else None}"
