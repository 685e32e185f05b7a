"""benchmarks/oracle_ceiling.py places the oracle's scores at the context's own tokens in the pipeline's prompt."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from oracle_ceiling import context_offset  # noqa: E402


def test_the_context_is_found_after_the_template():
    prompt = torch.tensor([1, 2, 7, 8, 9, 7, 8, 3])
    assert context_offset(prompt, torch.tensor([7, 8, 3])) == 5  # not the earlier partial match at 2
    assert context_offset(prompt, torch.tensor([1, 2])) == 0


def test_a_context_merged_with_the_template_is_refused():
    with pytest.raises(ValueError, match="do not appear as one run"):
        context_offset(torch.tensor([1, 2, 7, 8]), torch.tensor([7, 9]))
