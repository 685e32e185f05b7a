"""Fixtures more than one test module asks for. None is autouse: a module opts in by name or with
`pytestmark = pytest.mark.usefixtures(...)`, so no other test runs under their settings."""

from __future__ import annotations

import pytest
import torch

from tiny_pruning import tiny_surrogate


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one intra-op thread is faster, and immune to a starved second thread's spin-waits on a
    shared machine (which slowed some families 20x)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def surrogate():
    return tiny_surrogate()
