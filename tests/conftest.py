"""Fixtures more than one test module asks for. None is autouse: a module opts in by name or with
`pytestmark = pytest.mark.usefixtures(...)`, so no other test runs under their settings."""

from __future__ import annotations

import os

import pytest
import torch

# Tests never reach the Hugging Face Hub: what they check must not depend on the machine's network or its Hub access
# (planning config/paper.yaml online without a Llama-3.1 licence is refused, as it should be). Tests of the Hub's
# answers run a fake Hub (tests/fake_hub.py) in a child process with its own environment.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# `make test` runs pytest-xdist workers, one per core: each on one intra-op thread, and so are the commands its tests
# start, or two workers' threads would contend for the cores (a starved thread's spin-waits slowed some tests 20x).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

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
