"""PyTorch's `varlen_attn` (a CUDA-only flash kernel) as its documentation describes it, in plain torch, so that
code calling it can be checked on CPU."""

from __future__ import annotations

import math

import torch


def varlen_reference(
    query,
    key,
    value,
    cu_seq_q,
    cu_seq_k,
    max_q,
    max_k,
    *,
    return_aux=None,
    scale=None,
    window_size=(-1, -1),
    enable_gqa=False,
    seqused_k=None,
    causal_as_full=False,
):
    """PyTorch's `varlen_attn` (CUDA only) as documented, so its use can be checked on CPU: sequence i has
    queries cu_seq_q[i]:cu_seq_q[i+1] and keys cu_seq_k[i]: + seqused_k[i]; window_size (-1, 0) is causal,
    bottom-right aligned; lse (Hq, total_q). An empty key set gets the flash kernel's worst report: lse +inf,
    output NaN. causal_as_full: a wrong kernel that ignores window_size, for tests of the checks."""
    assert enable_gqa and return_aux is not None and return_aux.lse and window_size in ((-1, -1), (-1, 0))
    assert all(t.dtype == torch.int32 for t in (cu_seq_q, cu_seq_k, seqused_k) if t is not None)
    out, lse = torch.empty_like(query), torch.empty(query.shape[1], query.shape[0])
    group = query.shape[1] // key.shape[1]
    for i in range(cu_seq_q.shape[0] - 1):
        q0, q1, k0 = int(cu_seq_q[i]), int(cu_seq_q[i + 1]), int(cu_seq_k[i])
        k1 = k0 + int(seqused_k[i]) if seqused_k is not None else int(cu_seq_k[i + 1])
        assert q1 - q0 <= max_q and k1 - k0 <= max_k and k1 <= int(cu_seq_k[i + 1])
        q = query[q0:q1].transpose(0, 1)  # (Hq, m, D)
        k, v = (t[k0:k1].transpose(0, 1).repeat_interleave(group, 0) for t in (key, value))
        scores = q @ k.transpose(1, 2) * scale
        if window_size == (-1, 0) and not causal_as_full:
            m, n = q.shape[1], k.shape[1]
            scores.masked_fill_(~torch.ones(m, n, dtype=torch.bool).tril(n - m), -math.inf)
        if k.shape[1] == 0:
            out[q0:q1], lse[:, q0:q1] = math.nan, math.inf
            continue
        out[q0:q1] = (torch.softmax(scores, -1) @ v).transpose(0, 1)
        lse[:, q0:q1] = torch.logsumexp(scores, -1)
    return out, lse
