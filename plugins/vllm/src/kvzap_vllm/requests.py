"""Per-request KVzap settings: a request's extra arguments (`SamplingParams(extra_args=...)`, the OpenAI server's
`vllm_xargs`) may set its own threshold, `kvzap_threshold`. They are checked where the request enters the engine (the
server's process), so a bad value is an HTTP 400 naming it, never an error inside the engine core."""

from __future__ import annotations

import math

from kvzap_vllm.settings import prunes

KEY = "kvzap_threshold"


def request_threshold(extra_args: dict | None, default: float) -> float:
    """The threshold a request is judged at: its own, else the engine's."""
    return float((extra_args or {}).get(KEY, default))


def check_request(extra_args: dict | None, vllm_config) -> None:
    """Refuse, by name, a request's KVzap arguments that the engine would not honour."""
    ours = {key: value for key, value in (extra_args or {}).items() if key.startswith("kvzap_")}
    unknown = sorted(set(ours) - {KEY})
    if unknown:
        raise ValueError(f"unknown KVzap request arguments {unknown}: the per-request setting is {KEY!r}.")
    if KEY not in ours:
        return
    value = ours[KEY]
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(f"{KEY} must be a number (a log score; keep an entry iff its score >= it), got {value!r}.")
    if not prunes(vllm_config):
        raise ValueError(
            f"{KEY} was sent, but this engine does not prune: start it with a finite threshold in "
            '--additional-config \'{"kvzap": {"surrogate": ..., "threshold": ...}}\'.'
        )


def install() -> None:
    """Check every request's KVzap arguments with vLLM's own parameter checks, as the validation error the server
    answers with an HTTP 400 (a bare ValueError there is an internal error, a 500)."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor

    validate = InputProcessor._validate_params

    def validate_with_kvzap(self, params, *args, **kwargs):
        if isinstance(params, SamplingParams):
            try:
                check_request(params.extra_args, self.vllm_config)
            except ValueError as err:
                raise VLLMValidationError(str(err), parameter="vllm_xargs") from None
        return validate(self, params, *args, **kwargs)

    InputProcessor._validate_params = validate_with_kvzap
