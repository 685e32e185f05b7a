"""Run inside the vLLM environment (.venv-vllm), one engine per process: greedy generation of the prompts, with the
KVzap plugin (--kvzap SETTINGS_JSON) or without, written as JSON; with record_scores, the scores the plugin computed
for the generation (not the engine's start-up dummy runs) are saved beside it with torch.save."""

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
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

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
    if has_scorer:
        llm.apply_model(lambda model: model.kvzap.clear())
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=args.max_tokens), use_tqdm=False)
    record = {"tokens": [list(o.outputs[0].token_ids) for o in outputs], "has_scorer": has_scorer}
    if has_scorer:
        import torch

        scores = llm.apply_model(lambda model: model.kvzap.scores)[0]
        torch.save(scores, args.out.with_suffix(".scores.pt"))
    args.out.write_text(json.dumps(record))


if __name__ == "__main__":
    main()
