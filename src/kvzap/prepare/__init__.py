"""Stage 1, prepare: a model and its text as plain local files (Hub snapshots, or assets shipped in PyPI packages)."""
