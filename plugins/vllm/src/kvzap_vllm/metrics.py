"""The compression on the server's Prometheus `/metrics`: the engine core's scheduler publishes its KV footprint (the
per-layer blocks its requests hold against those the dense cache would hold) to a small file after every change,
and a collector in the server's process reads it at each scrape. vLLM's own metrics reach the server inside its
scheduler stats, a fixed type a plugin cannot extend, hence the file; the server names it in the environment
(`KVZAP_METRICS_FILE`) before it starts the engine core, which inherits it. Under Prometheus's multiprocess mode
(`PROMETHEUS_MULTIPROC_DIR` set: several API servers, or by hand) the server collects the value files of that folder
instead of its own registry, so the engine core writes its footprint there, as prometheus_client's multiprocess
gauges and counter, and the server's collector finds them with vLLM's own.

    kvzap:held_blocks            per-layer KV blocks the running requests hold
    kvzap:dense_blocks           per-layer KV blocks the dense cache would hold for them
    kvzap:compression            dense_blocks / held_blocks (1 with nothing held)
    kvzap:freed_blocks_total     blocks the compaction has returned to the pool"""

from __future__ import annotations

import atexit
import json
import os
import tempfile
from functools import cache
from pathlib import Path

from kvzap.atomic import atomic_write_text

ENV = "KVZAP_METRICS_FILE"
MULTIPROCESS = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's; vLLM serves that folder's values when it is set
HELP = {  # what either way of publishing exposes (the counter gets prometheus_client's _total suffix)
    "held_blocks": "Per-layer KV blocks the running requests hold.",
    "dense_blocks": "Per-layer KV blocks the dense cache would hold.",
    "compression": "Dense blocks over held blocks, for the running requests.",
    "freed_blocks": "KV blocks KVzap's compaction returned to the pool.",
}


def footprint(scheduler, layers: int) -> tuple[float, int]:
    """(per-layer blocks held, per-layer blocks the dense cache would hold) for the scheduler's running requests. A
    pool block spans layers / groups layers: every layer with one KV cache group, one layer with a group per layer, a
    1/H of a layer with a group per (layer, KV head) (kvzap_vllm.heads), where the held count may be fractional."""
    config = scheduler.kv_cache_config
    size = config.kv_cache_groups[0].kv_cache_spec.block_size
    pool = scheduler.kv_cache_manager.block_pool
    used, groups = config.num_blocks - 1 - pool.get_num_free_blocks(), len(config.kv_cache_groups)
    held = used * layers // groups if used * layers % groups == 0 else used * layers / groups
    dense = sum(-(-r.num_computed_tokens // size) for r in scheduler.running) * layers
    return held, dense


def compression(held: float, dense: int) -> float:
    return dense / held if held else 1


class SharedValues:
    """The footprint as prometheus_client's multiprocess values, in the engine core's own value files: the gauges
    keep the most recent value written, the counter grows by what was freed since the last publication."""

    def __init__(self):
        from prometheus_client import Counter, Gauge

        self.gauges = {
            key: Gauge(f"kvzap:{key}", HELP[key], registry=None, multiprocess_mode="mostrecent")
            for key in ("held_blocks", "dense_blocks", "compression")
        }
        self.freed = Counter("kvzap:freed_blocks", HELP["freed_blocks"], registry=None)
        self.freed_so_far = 0

    def write(self, held: float, dense: int, freed: int) -> None:
        values = {"held_blocks": held, "dense_blocks": dense, "compression": compression(held, dense)}
        for key, value in values.items():
            self.gauges[key].set(value)
        self.freed.inc(freed - self.freed_so_far)
        self.freed_so_far = freed


@cache
def shared_values() -> SharedValues:
    """One set per process: prometheus_client keeps one value file per metric and process."""
    return SharedValues()


def publish(scheduler, layers: int, freed: int) -> None:
    """Put the scheduler's footprint where the server collects it: the multiprocess value files when Prometheus runs
    in that mode, else the file the server's collector reads (atomically: a scrape never reads half)."""
    path = os.environ.get(ENV)
    if path is None and MULTIPROCESS not in os.environ:
        return
    held, dense = footprint(scheduler, layers)
    if MULTIPROCESS in os.environ:
        shared_values().write(held, dense, freed)
    else:
        atomic_write_text(path, json.dumps({"held_blocks": held, "dense_blocks": dense, "freed_blocks": freed}))


class Collector:
    """The server's side: the engine core's last published footprint, as Prometheus metrics."""

    def __init__(self, path: str):
        self.path = Path(path)

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:  # no pruning engine has scheduled yet
            return
        data["compression"] = compression(data["held_blocks"], data["dense_blocks"])
        for key in ("held_blocks", "dense_blocks", "compression"):
            yield GaugeMetricFamily(f"kvzap:{key}", HELP[key], data[key])
        yield CounterMetricFamily("kvzap:freed_blocks", HELP["freed_blocks"], data["freed_blocks"])


_registered = False


def install() -> None:
    """In the first process that loads the plugin (the server's, or an offline LLM's): name the file and collect it;
    the engine core started from there inherits the name and publishes to it."""
    global _registered
    if _registered or ENV in os.environ:
        return
    path = os.path.join(tempfile.gettempdir(), f"kvzap-metrics-{os.getpid()}.json")
    os.environ[ENV] = path
    from prometheus_client import REGISTRY

    REGISTRY.register(Collector(path))
    atexit.register(lambda: Path(path).unlink(missing_ok=True))
    _registered = True
