"""Run inside the vLLM environment (.venv-vllm) against a running `vllm serve` with the KVzap plugin, as a user's
client talks to it (the `openai` package); writes what it saw as JSON for tests/test_vllm_serve.py to check:
completions by token ids at the engine's threshold and at a request's own (`vllm_xargs`), the same requests
concurrently, a chat completion streamed and not, a stream abandoned mid-way, refused arguments, and /metrics."""

import argparse
import asyncio
import json
import time
import urllib.request
from pathlib import Path

import openai


def metrics(base: str) -> dict[str, float]:
    """The server's Prometheus metrics, name (with labels) -> value."""
    text = urllib.request.urlopen(f"{base}/metrics").read().decode()
    return {
        name: float(value)
        for name, value in (line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    }


def gauge(values: dict[str, float], name: str) -> float:
    return sum(v for k, v in values.items() if k == name or k.startswith(name + "{"))


def settle(base: str, seconds: float = 30) -> dict[str, float]:
    """/metrics once no request runs (an abandoned stream is aborted when the server notices the closed connection)."""
    deadline = time.monotonic() + seconds
    while True:
        values = metrics(base)
        if gauge(values, "vllm:num_requests_running") == 0 and values.get("kvzap:held_blocks", 0) == 0:
            return values
        if time.monotonic() > deadline:
            return values
        time.sleep(0.2)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True, help="the server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="the served model's name")
    parser.add_argument("--prompts", type=Path, required=True, help="JSON list of token-id lists")
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--own-threshold", type=float, required=True, help="a request's own kvzap_threshold")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    client = openai.AsyncOpenAI(base_url=f"{args.base}/v1", api_key="unused", max_retries=0)
    prompts = json.loads(args.prompts.read_text())
    greedy = {"model": args.model, "temperature": 0, "max_tokens": args.max_tokens}

    async def tokens(prompt: list[int], xargs: dict | None = None) -> list[int]:
        extra = {"return_token_ids": True, "ignore_eos": True} | ({"vllm_xargs": xargs} if xargs else {})
        answer = await client.completions.create(prompt=prompt, extra_body=extra, **greedy)
        return answer.choices[0].token_ids

    record = {"one_by_one": [await tokens(p) for p in prompts]}
    record["concurrent"] = await asyncio.gather(*(tokens(p) for p in prompts))
    record["own_threshold"] = await tokens(prompts[0], {"kvzap_threshold": args.own_threshold})
    record["after_completions"] = settle(args.base)

    messages = [{"role": "user", "content": "Write three sentences about essays."}]
    chat = await client.chat.completions.create(messages=messages, **greedy)
    stream = await client.chat.completions.create(messages=messages, stream=True, **greedy)
    chunks = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
    record["chat"] = {"text": chat.choices[0].message.content, "streamed": "".join(chunks), "chunks": len(chunks)}

    long = {**greedy, "max_tokens": 1000}
    stream = await client.completions.create(prompt=prompts[0], stream=True, extra_body={"ignore_eos": True}, **long)
    seen = 0
    async for _ in stream:
        seen += 1
        if seen == 5:
            record["mid_stream"] = metrics(args.base)  # the request runs, its prompt judged
            break
    await stream.close()  # the client goes away mid-stream: the server aborts the request
    record["abandoned_after_chunks"] = seen
    record["after_abort"] = settle(args.base)

    record["refused"] = []
    for xargs in ({"kvzap_threshold": "high"}, {"kvzap_treshold": 0.0}):
        try:
            await tokens(prompts[1], xargs)
            record["refused"].append({"xargs": xargs, "status": 200})
        except openai.APIStatusError as err:
            record["refused"].append({"xargs": xargs, "status": err.status_code, "message": str(err)})
    record["after_refusals"] = await tokens(prompts[1])
    args.out.write_text(json.dumps(record))


if __name__ == "__main__":
    asyncio.run(main())
