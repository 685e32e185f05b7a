"""The one way the planner refuses a config: the key, the value, the problem and the fix, on one line."""

from kvzap.refusal import Refusal


class ConfigError(Refusal):
    """A config value the pipeline refuses; the message names the key, the value and the fix."""


def fail(key: str, value, problem: str, fix: str):
    raise ConfigError(f"Invalid configuration: {key} = {value!r}: {problem}. Fix: {fix}")
