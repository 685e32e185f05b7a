"""One vLLM engine of the serving benchmark (vllm_serving.py runs it in .venv-vllm): greedy generation of every prompt
at once under a fixed KV memory, and, at every scheduler step, the sequences running, the preemptions and the KV
blocks held against those the dense cache would hold for the same sequences."""

import argparse
import json
import os
import time
from pathlib import Path

from records import output_file, positive_int

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process: its scheduler is read


def watch(scheduler, layers: int, steps: list, scheduled: dict, start: list[float]) -> None:
    """Record each schedule's outcome; blocks count per-layer blocks (dense: one block spans every layer), as the
    plugin's /metrics counts them. Each step also records when it was scheduled (seconds since `start[0]`) and how
    many tokens each running request had output by then, from which a request's first-token and per-token times
    follow (one step's resolution); `scheduled` gets each request's tokens per step (its prefill chunks)."""
    from kvzap_vllm.metrics import footprint

    schedule = scheduler.schedule

    def watched(*args, **kwargs):
        output = schedule(*args, **kwargs)
        held, dense = footprint(scheduler, layers)
        steps.append(
            {
                "seconds": time.perf_counter() - start[0],
                "running": len(scheduler.running),
                "preempted": len(output.preempted_req_ids or ()),
                "held_layer_blocks": held,
                "dense_layer_blocks": dense,
                "outputs": {r.request_id: r.num_output_tokens for r in scheduler.running},
            }
        )
        for request_id, count in output.num_scheduled_tokens.items():
            scheduled.setdefault(request_id, []).append(count)
        return output

    scheduler.schedule = watched


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", type=Path, required=True, help="JSON list of token-id lists")
    parser.add_argument("--max-tokens", type=positive_int, required=True)
    parser.add_argument("--engine", required=True, help="JSON of LLM(...) arguments")
    parser.add_argument("--out", type=output_file, required=True)
    args = parser.parse_args()

    from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(model=args.model, **json.loads(args.engine))
    core = llm.llm_engine.engine_core.engine_core
    steps, scheduled = [], {}
    start = [time.perf_counter()]
    watch(core.scheduler, llm.llm_engine.vllm_config.model_config.hf_config.num_hidden_layers, steps, scheduled, start)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in json.loads(args.prompts.read_text())]
    sampling = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    start[0] = time.perf_counter()
    outputs = llm.generate(prompts, sampling, use_tqdm=False)
    seconds = time.perf_counter() - start[0]
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    blocks = core.scheduler.kv_cache_config.num_blocks
    record = {"tokens": tokens, "seconds": seconds, "steps": steps, "scheduled": scheduled, "blocks": blocks}
    # every block back in the pool once all requests have finished, but vLLM's null block
    record["blocks_leaked"] = blocks - 1 - core.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    args.out.write_text(json.dumps(record))


if __name__ == "__main__":
    main()
