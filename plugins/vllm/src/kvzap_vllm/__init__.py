"""KVzap inside vLLM, as a general plugin: vLLM calls `register` in every process it starts (the entry point in
pyproject.toml), which puts the model overrides (scoring, and with a finite threshold pruning) in vLLM's model
registry, a check in the worker that refuses a `kvzap` section no override read, the check of each request's own
KVzap arguments (kvzap_vllm.requests) and the compression on the server's /metrics (kvzap_vllm.metrics). An engine
started without a `kvzap` section in `additional_config` runs the architectures' own classes: the override steps
aside."""

from kvzap_vllm.architectures import ARCHITECTURES


def register() -> None:
    """The overrides, and the worker's check that an engine asking for KVzap got one (kvzap_vllm.pruner)."""
    from vllm import ModelRegistry

    for architecture, target in ARCHITECTURES.items():
        ModelRegistry.register_model(architecture, target)
    from kvzap_vllm import metrics, pruner, requests

    pruner.install()
    requests.install()
    metrics.install()
