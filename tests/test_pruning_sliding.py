"""SlidingBuffer (a cache layer's window) against torch.cat/slicing on a random schedule."""

from __future__ import annotations

import random

import torch

from kvzap.pruning.sliding import SlidingBuffer


def test_sliding_buffer_follows_cat_and_slices():
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    reference = torch.randn(2, 3, 40, 4, generator=gen)
    buffer = SlidingBuffer(reference.clone(), -2)
    for _ in range(300):
        action, n = rng.choice(["append", "append", "front", "back"]), rng.randint(0, 9)
        if action == "append":
            new = torch.randn(2, 3, n, 4, generator=gen)
            buffer.append(new)
            reference = torch.cat([reference, new], -2)
        elif action == "front":
            n = min(n, reference.shape[-2])
            buffer.drop_front(n)
            reference = reference[..., n:, :]
        else:
            n = min(n, reference.shape[-2])
            buffer.drop_back(n)
            reference = reference[..., : reference.shape[-2] - n, :]
        assert torch.equal(buffer.data, reference)
        assert buffer.buffer.shape[-2] <= 2 * reference.shape[-2] + 2 * 9 + 40  # room stays bounded by the live size
