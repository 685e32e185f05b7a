"""The scheduler of a pruning engine: before each step it returns the blocks the last step's compaction emptied
(kvzap_vllm.ledger), so admission and preemption see every request's pruned footprint; after every change to its
requests it publishes that footprint for the server's /metrics (kvzap_vllm.metrics)."""

from __future__ import annotations

from vllm.logger import init_logger
from vllm.v1.core.sched.scheduler import Scheduler

from kvzap_vllm.ledger import LEDGER
from kvzap_vllm.manager import KVzapManager
from kvzap_vllm.metrics import publish
from kvzap_vllm.settings import KVzapSettings

logger = init_logger(__name__)


class KVzapScheduler(Scheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kvzap_managers = [KVzapManager.adopt(m) for m in self.kv_cache_manager.coordinator.single_type_managers]
        self.kvzap_freed_blocks = 0
        self.kvzap_layers = self.vllm_config.model_config.hf_config.num_hidden_layers
        settings = KVzapSettings.read(self.vllm_config.additional_config)
        if settings.judge_chunks and self.vllm_config.scheduler_config.scheduler_reserve_full_isl:
            logger.warning(
                "KVzap judge_chunks: vLLM admits a request only when its whole dense prompt fits "
                "(scheduler_reserve_full_isl), which judging chunks cannot lower; start the engine with "
                "--no-scheduler-reserve-full-isl to admit requests by their first chunk."
            )

    def schedule(self, *args, **kwargs):
        for request_id, removed in LEDGER.drain().items():
            request = self.requests.get(request_id)
            if request is None or request.is_finished():
                continue
            for manager, count in zip(self.kvzap_managers, removed.tolist()):
                self.kvzap_freed_blocks += manager.shrink(request_id, count, request.num_computed_tokens)
        output = super().schedule(*args, **kwargs)
        self._publish()
        return output

    def update_from_output(self, *args, **kwargs):
        outputs = super().update_from_output(*args, **kwargs)
        self._publish()  # finished requests have returned their blocks
        return outputs

    def finish_requests(self, *args, **kwargs):
        finished = super().finish_requests(*args, **kwargs)
        self._publish()  # an aborted request's blocks are back
        return finished

    def _publish(self) -> None:
        publish(self, self.kvzap_layers, self.kvzap_freed_blocks)
