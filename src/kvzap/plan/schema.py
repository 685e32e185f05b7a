"""The config's JSON schema (shipped in the package, so `python -m kvzap.plan` works from any install) and its
verdict as one ConfigError naming the key, the value and what the key accepts."""

from __future__ import annotations

import json
from pathlib import Path

from kvzap.plan.errors import fail

SCHEMA = Path(__file__).with_name("config.schema.json")


def validate(config: dict, schema_path: Path | str = SCHEMA) -> None:
    import jsonschema

    schema = json.loads(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if error is None:
        return
    key = ".".join(str(p) for p in error.absolute_path) or "(top level)"
    hint = error.schema.get("description") if isinstance(error.schema, dict) else None
    if error.validator == "additionalProperties":
        hint = f"allowed keys: {sorted(error.schema.get('properties', {}))}"
    fail(key, error.instance, error.message, hint or "see config/README.md for what this key accepts")
