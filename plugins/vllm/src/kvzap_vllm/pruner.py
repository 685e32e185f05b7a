"""The worker side of the pruning, on vLLM's CPU attention backend. Each layer is its own KV cache group (one block
table per layer, kvzap_vllm.groups), or with the per-head layout each (layer, KV head) (kvzap_vllm.heads), and each
group's entries are packed at the front of its blocks:

- after a forward, the tokens that left the window are judged with the fill policy (kvzap.fill.layer_fill: every
  head of a group keeps as many as its most-keeping head; a per-head group has one head, so this is KVzap's own
  verdict, score >= threshold), the kept entries are moved in place to the front slots, the group's block table is
  cut to the blocks they fill, and the counts go to the scheduler (kvzap_vllm.ledger);
- before a forward, each group's attention gets its own sequence lengths (kept + window + new) and write slots.

A slot holds one entry per KV head, and the heads of a layer may hold different tokens in the same slot: attention
over a (request, head) is a sum over its entries in any order, and the keys are cached already rotated, so the
tokens' positions stay their own. A prompt is judged once its prefill is complete (chunked or not), as the
transformers press judges a one-forward prefill, or, with `judge_chunks`, each chunk of a chunked prefill as it is
computed, as the transformers press judges a forward of several tokens: the tokens leaving the window together are
one judgement (the fill counts over them), and the layer's held entries are packed again. Then one token leaves the
window per decoding step, and a dropped one's slot takes the newest token (one entry moved, not the window)."""

from __future__ import annotations

from copy import copy
from dataclasses import dataclass

import numpy as np
import torch
from vllm.utils.math_utils import cdiv
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from kvzap.fill import layer_fill
from kvzap_vllm.architectures import ARCHITECTURES
from kvzap_vllm.heads import group_source
from kvzap_vllm.layout import entry_offsets
from kvzap_vllm.ledger import LEDGER
from kvzap_vllm.refusals import attention_refusal, refusal
from kvzap_vllm.requests import request_threshold
from kvzap_vllm.settings import KVzapSettings, prunes


@dataclass
class RequestPruning:
    """One request: per group the entries removed, the scores of its unjudged tokens, and (from its first judgement
    on) the slot of each unjudged position, in position order."""

    removed: np.ndarray  # (G,) int64
    pending: torch.Tensor  # (G, H, seen - judged) scores; H = 1 in the per-head layout
    threshold: float  # the request's own (kvzap_vllm.requests), else the engine's
    judged: int = 0  # positions below are settled
    slots: np.ndarray | None = None  # (G, seen - judged); None while every layer holds position p at slot p


class Pruner:
    def __init__(self, runner: GPUModelRunner):
        reason = attention_refusal(runner.attn_groups)
        if reason:
            raise ValueError(f"KVzap cannot prune in this engine: {reason}.")
        self.runner, self.scorer = runner, runner.model.kvzap
        settings = self.scorer.settings
        self.threshold, self.window, self.judge_chunks = settings.threshold, settings.window, settings.judge_chunks
        groups = runner.kv_cache_config.kv_cache_groups
        self._read_groups([group_source(group.layer_names) for group in groups])
        context = runner.compilation_config.static_forward_context
        caches = [context[group.layer_names[0]].kv_cache for group in groups]
        self.block_size = groups[0].kv_cache_spec.block_size
        self.heads = caches[0].shape[1]
        # each head's block as flat memory, and where a token slot's entry lies in it (the kernel's own layout)
        self.caches = [cache.view(cache.shape[0], self.heads, -1) for cache in caches]
        self.offsets = entry_offsets(context[groups[0].layer_names[0]], caches[0][:1])  # (block_size, 2 * head_dim)
        self.states: dict[str, RequestPruning] = {}
        self._rows: torch.Tensor | None = None  # (G, requests) removed per group, in this step's batch order
        table = runner.input_batch.block_table
        self._slot_mapping_of = table.compute_slot_mapping
        table.compute_slot_mapping = self._slot_mapping
        for gid, attention_groups in enumerate(runner.attn_groups):
            for attention_group in attention_groups:
                builder = attention_group.get_metadata_builder(0)
                builder.build = self._lengths(gid, builder.build)
        self._execute_model = runner.execute_model
        runner.execute_model = self._execute

    def _read_groups(self, sources: list[tuple[int, int | None]]) -> None:
        """Which scores each KV cache group judges: sources[g] = (layer, None) judges every head of the layer's
        scores (the per-layer layout), (layer, head) that head's column only (the per-head layout)."""
        self.layers = [layer for layer, _ in sources]
        heads = [head for _, head in sources]
        if len({head is None for head in heads}) > 1:
            raise ValueError(f"KVzap: the KV cache groups mix per-layer and per-head layers: {sources}.")
        self.scored = sorted(set(self.layers))  # the layers whose scores are stacked, in this order
        rows = torch.tensor([self.scored.index(layer) for layer in self.layers])
        self.columns = None if heads[0] is None else (rows, torch.tensor(heads))

    # before the forward -------------------------------------------------------------------------------------------
    def _slot_mapping(self, num_reqs: int, query_start_loc: torch.Tensor, positions: torch.Tensor) -> None:
        """Each group writes its new tokens after its own held entries: slot index = position - removed."""
        rows = np.zeros((len(self.layers), num_reqs), np.int64)
        for row, request_id in enumerate(self.runner.input_batch.req_ids[:num_reqs]):
            state = self.states.get(request_id)
            if state is not None:
                rows[:, row] = state.removed
        if not rows.any():
            self._rows = None
            return self._slot_mapping_of(num_reqs, query_start_loc, positions)
        self._rows = torch.from_numpy(rows)
        counts = (query_start_loc[1 : num_reqs + 1] - query_start_loc[:num_reqs]).long()
        per_token = self._rows.repeat_interleave(counts.cpu(), dim=1)  # (G, tokens)
        for gid, table in enumerate(self.runner.input_batch.block_table.block_tables):
            table.compute_slot_mapping(num_reqs, query_start_loc, positions - per_token[gid].to(positions))
        return None

    def _lengths(self, gid: int, build):
        """The group's attention reads held entries only: seq_lens minus what the layer removed."""

        def build_with_lengths(common_prefix_len, common_attn_metadata, *args, **kwargs):
            if self._rows is not None and self._rows[gid].any():
                common_attn_metadata = copy(common_attn_metadata)
                seq_lens = common_attn_metadata.seq_lens.clone()
                removed = self._rows[gid].to(seq_lens)
                seq_lens[: removed.shape[0]] -= removed
                common_attn_metadata.seq_lens = seq_lens
                common_attn_metadata.max_seq_len = int(seq_lens.max())
            return build(common_prefix_len, common_attn_metadata, *args, **kwargs)

        return build_with_lengths

    # the step ---------------------------------------------------------------------------------------------------
    def _execute(self, scheduler_output, *args, **kwargs):
        gone = set(scheduler_output.finished_req_ids) | set(scheduler_output.preempted_req_ids or ())
        gone |= set(scheduler_output.scheduled_cached_reqs.resumed_req_ids)  # recomputed from scratch
        for request_id in gone:
            self.states.pop(request_id, None)
        try:
            output = self._execute_model(scheduler_output, *args, **kwargs)
            self._judge(scheduler_output.num_scheduled_tokens)
        finally:
            self._rows = None
        return output

    # after the forward ------------------------------------------------------------------------------------------
    def _judge(self, scheduled: dict[str, int]) -> None:
        batch = self.runner.input_batch
        if self.columns is None:
            scores = torch.stack([self.scorer.latest[layer] for layer in self.layers]).float()  # (G, tokens, H)
        else:  # each group one head's column: (G, tokens, 1)
            rows, heads = self.columns
            scored = torch.stack([self.scorer.latest[layer] for layer in self.scored])  # (layers, tokens, H)
            scores = scored[rows, :, heads].unsqueeze(-1).float()
        moves: list[tuple[int, int, int, int, int]] = []  # (group, source block, offset, target block, offset)
        offset = 0
        for request_id in batch.req_ids:
            count = scheduled.get(request_id, 0)
            request = self.runner.requests[request_id]
            new = scores[:, offset : offset + count].transpose(1, 2)  # (G, H, count)
            offset += count
            state = self.states.get(request_id)
            if state is None:
                # a copy: a view would keep the whole batch's scores of this step alive
                tau = request_threshold(request.sampling_params.extra_args, self.threshold)
                state = self.states[request_id] = RequestPruning(np.zeros(len(self.layers), np.int64), new.clone(), tau)
            else:
                state.pending = torch.cat([state.pending, new], -1)
            seen = request.num_computed_tokens + count
            if state.slots is not None:  # the new tokens' slots: after each layer's held entries
                new_slots = np.arange(seen - count, seen)[None] - state.removed[:, None]
                state.slots = np.concatenate([state.slots, new_slots], 1)
            leaving = seen - state.judged - self.window
            if leaving <= 0 or (seen < request.num_tokens and not self.judge_chunks):  # nothing out, or prefilling
                continue
            if leaving == 1 and state.slots is not None:
                moves += self._judge_one(state, request.block_ids, seen)
            else:
                self._judge_together(state, request.block_ids, leaving, seen)
            self._cut_block_tables(request_id, request.block_ids, state, seen)
            LEDGER.post(request_id, state.removed)
        self._move(moves)

    def _judge_together(self, state: RequestPruning, block_ids, leaving: int, seen: int) -> None:
        """The `leaving` oldest unjudged tokens as one judgement; each layer's held entries are then packed again:
        those judged before, each head's kept ones of this judgement (in position order), then the unjudged rest,
        which every head of the layer keeps in the same slots. Before the first judgement every layer holds
        position p at slot p."""
        keep = layer_fill(state.pending[:, :, :leaving], state.threshold)  # (G, H, leaving)
        kept = keep[:, 0].sum(-1).numpy()  # the same count for every head of a group
        unjudged = np.arange(seen)[None].repeat(len(self.layers), 0) if state.slots is None else state.slots
        settled = state.judged - state.removed  # (G,) entries kept by earlier judgements
        heads = torch.arange(self.heads)[:, None, None]
        for gid, count in enumerate(kept.tolist()):
            slots = torch.from_numpy(unjudged[gid][:leaving])
            before = np.setdiff1d(np.arange(settled[gid] + len(slots)), unjudged[gid])  # (settled,) held slots
            # each head's kept positions in order: a stable sort of dropped-after-kept
            chosen = torch.argsort((~keep[gid]).to(torch.int8), dim=-1, stable=True)[:, :count]
            earlier, rest = (torch.from_numpy(x).expand(self.heads, -1) for x in (before, unjudged[gid][leaving:]))
            source = torch.cat([earlier, slots[chosen], rest], -1)  # (H, held after)
            target = torch.arange(source.shape[1]).expand(self.heads, -1)
            moved = (source != target).any(0)
            source, target = source[:, moved], target[:, moved]
            blocks = torch.tensor(block_ids[gid])
            cache = self.caches[gid]
            entries = cache[blocks[source // self.block_size, None], heads, self.offsets[source % self.block_size]]
            cache[blocks[target // self.block_size, None], heads, self.offsets[target % self.block_size]] = entries
        state.removed += leaving - kept
        state.pending = state.pending[:, :, leaving:]
        state.judged += leaving
        state.slots = (state.judged - state.removed)[:, None] + np.arange(seen - state.judged)[None]

    def _judge_one(self, state: RequestPruning, block_ids, seen: int) -> list[tuple[int, int, int, int, int]]:
        """The oldest unjudged token leaves the window: a layer keeps it for every head iff a head scores it >=
        threshold; a layer that drops it moves the entry in its last held slot (the newest token, when one token
        leaves per step) into the freed slot."""
        keep = layer_fill(state.pending[:, :, :1], state.threshold)[:, 0, 0].numpy()  # (G,)
        moves = []
        for gid in np.flatnonzero(~keep).tolist():
            freed, last = int(state.slots[gid, 0]), seen - 1 - int(state.removed[gid])
            if freed != last:
                source, target = block_ids[gid][last // self.block_size], block_ids[gid][freed // self.block_size]
                moves.append((gid, source, last % self.block_size, target, freed % self.block_size))
                state.slots[gid, np.flatnonzero(state.slots[gid] == last)] = freed
        state.removed += ~keep
        state.pending = state.pending[:, :, 1:]
        state.slots = state.slots[:, 1:]
        state.judged += 1
        return moves

    def _move(self, moves: list[tuple[int, int, int, int, int]]) -> None:
        """One indexed copy per group of every (request's) moved entry, all heads at once."""
        if not moves:
            return
        table = torch.tensor(moves)
        for gid in table[:, 0].unique().tolist():
            rows = table[table[:, 0] == gid]
            cache = self.caches[gid]
            cache[rows[:, 3, None], :, self.offsets[rows[:, 4]]] = cache[rows[:, 1, None], :, self.offsets[rows[:, 2]]]

    def _cut_block_tables(self, request_id: str, block_ids, state: RequestPruning, seen: int) -> None:
        """The worker's copy of the cut the scheduler makes (KVzapManager.shrink): blocks past the held entries."""
        row = self.runner.input_batch.req_id_to_index[request_id]
        tables = self.runner.input_batch.block_table.block_tables
        for gid, removed in enumerate(state.removed.tolist()):
            keep = cdiv(seen - removed, self.block_size)
            del block_ids[gid][keep:]
            tables[gid].num_blocks_per_row[row] = keep


_ORIGINAL = GPUModelRunner.initialize_kv_cache
SUPPORTED = tuple(ARCHITECTURES)


def initialize_kv_cache(self, kv_cache_config, is_profiling: bool = False, *args, **kwargs):
    """Every engine's worker, once its model is built: a `kvzap` section that no override read (an architecture the
    plugin does not serve, whose own vLLM class ran) is refused by name, never dropped; a pruning engine gets its
    compaction."""
    settings = KVzapSettings.read(self.vllm_config.additional_config)
    scorer = getattr(self.model, "kvzap", None)
    if settings is not None and scorer is None:
        architecture = (self.vllm_config.model_config.architectures or ["?"])[0]
        reason = refusal(self.vllm_config, architecture, SUPPORTED) or "its model was built without the KVzap scorer"
        raise ValueError(f"KVzap cannot serve this engine: {reason}.")
    _ORIGINAL(self, kv_cache_config, is_profiling, *args, **kwargs)
    if scorer is not None and prunes(self.vllm_config) and not is_profiling:
        self.kvzap_pruner = Pruner(self)


def install() -> None:
    GPUModelRunner.initialize_kv_cache = initialize_kv_cache
