"""Run in the vLLM environment with PROMETHEUS_MULTIPROC_DIR set. `publish` (the engine core's side): the plugin
publishes two footprints of a fake scheduler, 3 then 7 blocks freed. `collect` (the server's side): prints what
vLLM's multiprocess registry would serve for it."""

import sys
from types import SimpleNamespace

if sys.argv[1] == "publish":
    from kvzap_vllm.metrics import publish

    def scheduler(free: int, computed: list[int]):
        group = SimpleNamespace(kv_cache_spec=SimpleNamespace(block_size=32))
        config = SimpleNamespace(num_blocks=21, kv_cache_groups=[group] * 30)  # one group per layer
        pool = SimpleNamespace(get_num_free_blocks=lambda: free)
        running = [SimpleNamespace(num_computed_tokens=n) for n in computed]
        manager = SimpleNamespace(block_pool=pool)
        return SimpleNamespace(kv_cache_config=config, kv_cache_manager=manager, running=running)

    publish(scheduler(10, [300]), 30, 3)  # 10 blocks in use: 10 per-layer blocks held, 10 * 30 dense
    publish(scheduler(15, [320, 64]), 30, 7)  # 5 held, (10 + 2) * 30 dense
else:
    from prometheus_client import generate_latest
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    print(generate_latest(get_prometheus_registry()).decode())
