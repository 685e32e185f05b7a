"""How a prefill group's rows split into decodes, torch-free: the job runs it and the planner's forecast counts it."""


def samples_per_decode(batch_size: int, decode_batch: int, cells: int) -> int:
    """Samples a prefill group decodes together: evaluation.batch_size counts rows (samples x the cells decoded at
    once, at most decode_batch), and a decode holds at least one sample."""
    return max(1, batch_size // min(decode_batch, cells))
