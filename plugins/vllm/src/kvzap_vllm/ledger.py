"""What the worker's compaction tells the scheduler: per request, how many entries each KV cache group (one per
layer, or per (layer, KV head)) has removed. vLLM runs the scheduler and a single worker in one process (the engine
core with its in-process executor; the refusals keep it so), so one object here carries the counts from a step's
forward to the next schedule."""

from __future__ import annotations

import numpy as np


class Ledger:
    def __init__(self):
        self._posted: dict[str, np.ndarray] = {}

    def post(self, request_id: str, removed: np.ndarray) -> None:
        self._posted[request_id] = removed.copy()

    def drain(self) -> dict[str, np.ndarray]:
        posted, self._posted = self._posted, {}
        return posted


LEDGER = Ledger()
