"""Run inside the vLLM environment: the plugin's compaction (kvzap_vllm.pruner.Pruner) driven step by step without
an engine, over a cache whose every entry holds its own position, so what each (layer, head) holds can be read back.
A prompt is prefilled whole, or `--prompt-chunk` tokens at a time with each chunk judged (`judge_chunks`); then the
decoding tokens arrive `--per-step` at a time. Writes, per KV cache group (a layer, or with `--per-head` a (layer,
head)) and head, the positions held in its front slots and the positions the policy keeps (computed here from the
scores and the judgements' boundaries, independently of the compaction's bookkeeping: per layer the fill policy, per
head KVzap's own score >= tau), with the blocks each group's table keeps."""

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from kvzap_vllm.pruner import Pruner

LAYERS, HEADS, BLOCK, ENTRY = 3, 2, 4, 2  # ENTRY: numbers per slot and head (the kernel's keys and values)
TAU = 0.0


def expected_kept(scores: torch.Tensor, judgements: list[range], seen: int, per_head: bool) -> list[list[set]]:
    """(layer, head) -> the positions the fill policy keeps: of each judgement's tokens, each head its own best up to
    the count of the layer's most-keeping head (scores >= tau), or per head its own count (KVzap: exactly those >=
    tau); the tokens never judged (the window's) all."""
    last = judgements[-1].stop if judgements else 0
    kept = [[set(range(last, seen)) for _ in range(HEADS)] for _ in range(LAYERS)]
    for layer in range(LAYERS):
        for positions in judgements:
            block = scores[layer, :, positions.start : positions.stop]  # (H, tokens)
            counts = (block >= TAU).sum(-1)
            for head in range(HEADS):
                count = int(counts[head] if per_head else counts.max())
                best = block[head].argsort(descending=True, stable=True)[:count]
                kept[layer][head] |= {positions.start + i for i in best.tolist()}
    return kept


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-step", type=int, required=True, help="decoding tokens scheduled per step")
    parser.add_argument("--prompt-chunk", type=int, default=None, help="prefill chunks, each judged (judge_chunks)")
    parser.add_argument("--per-head", action="store_true", help="a KV cache group per (layer, head), as heads.py")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.per_head:  # (layer, head) per KV cache group, as kvzap_vllm.heads.group_source reads them
        sources = [(layer, head) for layer in range(LAYERS) for head in range(HEADS)]
    else:
        sources = [(layer, None) for layer in range(LAYERS)]
    groups, heads = len(sources), 1 if args.per_head else HEADS  # KV cache groups, heads per group
    prompt, decoded, window = 30, 24, 8
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(LAYERS, HEADS, prompt + decoded, generator=generator)  # (layers, H, positions)
    blocks = groups * (-(-(prompt + decoded) // BLOCK) + 1)  # one pool for every group's table, as in vLLM
    caches = [torch.full((blocks, heads, BLOCK * ENTRY), -1.0) for _ in range(groups)]
    offsets = torch.arange(BLOCK * ENTRY).view(BLOCK, ENTRY)
    request = SimpleNamespace(num_computed_tokens=0, num_tokens=prompt, block_ids=tuple([] for _ in range(groups)))
    request.sampling_params = SimpleNamespace(extra_args=None)
    table = SimpleNamespace(block_tables=[SimpleNamespace(num_blocks_per_row=[0]) for _ in range(groups)])
    batch = SimpleNamespace(req_ids=["r"], req_id_to_index={"r": 0}, block_table=table)
    pruner = Pruner.__new__(Pruner)
    pruner.runner = SimpleNamespace(input_batch=batch, requests={"r": request})
    pruner.scorer = SimpleNamespace(latest={})
    pruner.threshold, pruner.window, pruner.states = TAU, window, {}
    pruner._read_groups(sources)
    pruner.judge_chunks = args.prompt_chunk is not None
    judgements: list[range] = []  # the positions each judgement settles, as this engine schedules them
    pruner.caches, pruner.offsets, pruner.block_size, pruner.heads = caches, offsets, BLOCK, heads

    def step(count: int) -> None:
        """The engine's side: blocks for the new tokens, their entries written after each group's held ones (the
        slot mapping), the forward's scores (per layer, every head); then the pruner judges."""
        start = request.num_computed_tokens
        state = pruner.states.get("r")
        removed = state.removed if state is not None else np.zeros(groups, np.int64)
        for group in range(groups):
            ids = request.block_ids[group]
            while len(ids) * BLOCK < start + count - removed[group]:  # the pool's lowest free block (cut ones return)
                ids.append(min(set(range(blocks)) - {b for held in request.block_ids for b in held}))
            for position in range(start, start + count):
                slot = position - int(removed[group])
                caches[group][ids[slot // BLOCK], :, offsets[slot % BLOCK]] = float(position)
        pruner.scorer.latest = {layer: scores[layer, :, start : start + count].T for layer in range(LAYERS)}
        pruner._judge({"r": count})
        request.num_computed_tokens += count
        judged = judgements[-1].stop if judgements else 0
        if request.num_computed_tokens - window > judged and (pruner.judge_chunks or start + count >= prompt):
            judgements.append(range(judged, request.num_computed_tokens - window))

    while request.num_computed_tokens < prompt:
        step(min(args.prompt_chunk or prompt, prompt - request.num_computed_tokens))
    while request.num_computed_tokens < prompt + decoded:
        count = min(args.per_step, prompt + decoded - request.num_computed_tokens)
        request.num_tokens = request.num_computed_tokens + count
        step(count)

    seen, state = request.num_computed_tokens, pruner.states["r"]
    held = []
    for group in range(groups):
        count, ids = seen - int(state.removed[group]), request.block_ids[group]
        slots = torch.arange(count)
        at = (torch.tensor(ids)[slots // BLOCK, None], torch.arange(heads)[None], offsets[slots % BLOCK, 0, None])
        entries = caches[group][at]  # (count, heads): the position each held slot's entry belongs to
        held.append([sorted(entries[:, head].long().tolist()) for head in range(heads)])
    kept = expected_kept(scores, judgements, seen, args.per_head)  # (layer, head)
    kept = [[kept[layer][head]] if head is not None else kept[layer] for layer, head in sources]  # per group
    record = {
        "held": held,
        "kept": [[sorted(head) for head in group] for group in kept],
        "blocks": [len(ids) for ids in request.block_ids],
        "table_blocks": [t.num_blocks_per_row[0] for t in table.block_tables],
        "removed": state.removed.tolist(),
    }
    args.out.write_text(json.dumps(record))


if __name__ == "__main__":
    main()
