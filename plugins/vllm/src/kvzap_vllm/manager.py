"""The scheduler's block accounting for one layer's group (one KV head's, in the per-head layout): a request holds
blocks for the entries the group keeps, not for every token it has seen. Allocation counts `num_tokens - removed`;
after a step's compaction, the blocks past the kept entries go back to the pool (the worker shortens its block table
by the same count)."""

from __future__ import annotations

from vllm.utils.math_utils import cdiv
from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager


class KVzapManager(FullAttentionManager):
    removed: dict[str, int]  # request -> entries this layer removed

    @classmethod
    def adopt(cls, manager: FullAttentionManager) -> KVzapManager:
        """The coordinator builds its managers from a registry keyed by spec type, which a plugin cannot rebind for
        one engine: take over the built manager (its pool, bookkeeping and block size stay)."""
        if type(manager) is not FullAttentionManager:
            raise ValueError(f"KVzap prunes full-attention groups only, not a {type(manager).__name__} group.")
        manager.__class__ = cls
        manager.removed = {}
        return manager

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int, *args, **kwargs) -> int:
        held = num_tokens - self.removed.get(request_id, 0)
        return super().get_num_blocks_to_allocate(request_id, held, *args, **kwargs)

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int):
        removed = self.removed.get(request_id, 0)
        return super().allocate_new_blocks(request_id, num_tokens - removed, num_tokens_main_model - removed)

    def shrink(self, request_id: str, removed: int, num_tokens: int) -> int:
        """The layer now holds num_tokens - removed entries: free the blocks past them; returns how many."""
        self.removed[request_id] = removed
        blocks = self.req_to_blocks.get(request_id)
        if blocks is None:
            return 0
        keep = cdiv(num_tokens - removed, self.block_size)
        freed = blocks[keep:]
        del blocks[keep:]
        self.block_pool.free_blocks(reversed(freed))
        return len(freed)

    def free(self, request_id: str) -> None:
        self.removed.pop(request_id, None)
        super().free(request_id)
