"""Run inside the vLLM environment (.venv-vllm), one engine per process: greedy generation of the prompts, with the
KVzap plugin (--kvzap SETTINGS_JSON) or without, written as JSON; with record_scores, the scores the plugin computed
for the generation (not the engine's start-up dummy runs) are saved beside it with torch.save. The record also
lists the KV cache groups (their attention layer names), the pruning scheduler's block cuts, the entries removed per
group, the preemptions, and each request's tokens scheduled per step (its prefill chunks, then one per decoding
step)."""

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: apply_model reaches it


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", type=Path, required=True, help="JSON list of token-id lists")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--kvzap", default=None, help='JSON of additional_config["kvzap"]')
    parser.add_argument("--engine", default="{}", help="JSON of more LLM(...) arguments")
    parser.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-tokens tokens")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    shrinks, posts = record_pruning() if args.kvzap else ([], {})
    preemptions = record_preemptions()
    schedule = record_schedule()

    from vllm import LLM, SamplingParams, TokensPrompt

    engine = {"dtype": "float32", "enforce_eager": True, "enable_prefix_caching": False, "max_model_len": 2048}
    engine |= {"kv_cache_memory_bytes": 256 * 2**20, "max_num_seqs": 8, **json.loads(args.engine)}
    if args.kvzap:
        engine["additional_config"] = {"kvzap": json.loads(args.kvzap)}
    try:
        llm = LLM(model=args.model, **engine)
    except Exception as err:  # the engine's refusal, for the test to read
        args.out.write_text(json.dumps({"error": f"{type(err).__name__}: {err}"}))
        return
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in json.loads(args.prompts.read_text())]
    has_scorer = llm.apply_model(lambda model: getattr(model, "kvzap", None) is not None)[0]
    model_class = llm.apply_model(lambda model: type(model).__name__)[0]
    if has_scorer:
        llm.apply_model(lambda model: model.kvzap.clear())
    sampling = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=args.ignore_eos)
    outputs = llm.generate(prompts, sampling, use_tqdm=False)
    record = {"tokens": [list(o.outputs[0].token_ids) for o in outputs], "has_scorer": has_scorer}
    record["model_class"] = model_class  # the plugin's override serves the architecture, kvzap section or not
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    pool = scheduler.kv_cache_manager.block_pool
    record["blocks"] = {"total": scheduler.kv_cache_config.num_blocks, "free_after": pool.get_num_free_blocks()}
    record["block_size"] = scheduler.kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
    record["groups"] = [group.layer_names for group in scheduler.kv_cache_config.kv_cache_groups]
    request = {o.request_id: i for i, o in enumerate(outputs)}

    def row(request_id: str) -> int:  # the engine suffixes its own ids: "<id>-<random>"
        return request.get(request_id, request.get(request_id.rsplit("-", 1)[0]))

    record["shrinks"] = [(row(r), *rest) for r, *rest in shrinks]
    record["removed"] = {row(r): removed for r, removed in posts.items()}  # per group, after the last forward
    record["preemptions"] = [(row(r), tokens) for r, tokens in preemptions]
    record["scheduled"] = {row(r): counts for r, counts in schedule.items()}
    if has_scorer:
        import torch

        scores = llm.apply_model(lambda model: model.kvzap.scores)[0]
        torch.save(scores, args.out.with_suffix(".scores.pt"))
    args.out.write_text(json.dumps(record))


def record_pruning() -> tuple[list, dict]:
    """Every block cut the pruning scheduler makes, (request, group, removed, tokens seen, blocks held after), and
    each request's entries removed per layer as the worker last posted them (after its last forward)."""
    from kvzap_vllm.ledger import LEDGER
    from kvzap_vllm.manager import KVzapManager

    calls, shrink, posts, post = [], KVzapManager.shrink, {}, LEDGER.post

    def posting(request_id, removed):
        posts[request_id] = removed.tolist()
        post(request_id, removed)

    def recording(self, request_id, removed, num_tokens):
        freed = shrink(self, request_id, removed, num_tokens)
        held = len(self.req_to_blocks.get(request_id, ()))
        calls.append((request_id, self.kv_cache_group_id, removed, num_tokens, held))
        return freed

    KVzapManager.shrink, LEDGER.post = recording, posting
    return calls, posts


def record_preemptions() -> list:
    """Every preemption, (request, tokens it had generated): vLLM recomputes a preempted request from scratch."""
    from vllm.v1.core.sched.scheduler import Scheduler

    calls, preempt = [], Scheduler._preempt_request

    def recording(self, request, *args, **kwargs):
        calls.append((request.request_id, request.num_output_tokens))
        return preempt(self, request, *args, **kwargs)

    Scheduler._preempt_request = recording
    return calls


def record_schedule() -> dict:
    """request -> the tokens scheduled for it at each step, in order."""
    from vllm.v1.core.sched.scheduler import Scheduler

    counts, schedule = {}, Scheduler.schedule

    def recording(self, *args, **kwargs):
        output = schedule(self, *args, **kwargs)
        for request_id, count in output.num_scheduled_tokens.items():
            counts.setdefault(request_id, []).append(count)
        return output

    Scheduler.schedule = recording
    return counts


if __name__ == "__main__":
    main()
