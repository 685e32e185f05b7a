"""The batched training network computes the per-layer surrogate's function and hands its weights back exactly."""

import pytest
import torch

from kvzap.surrogate.model import Surrogate
from kvzap.surrogate.stacked import StackedMLP


@pytest.mark.parametrize("skipped", [(), (1, 3)])
def test_stacked_forward_equals_the_per_layer_modules(skipped):
    torch.manual_seed(0)
    surrogate = Surrogate(24, 3, 5, hidden_dim=6, skipped_layers=skipped)
    h = torch.randn(40, len(surrogate.scored), 24)
    torch.testing.assert_close(StackedMLP(surrogate)(h), surrogate(h))


def test_trained_weights_written_back_into_the_surrogate():
    torch.manual_seed(0)
    surrogate = Surrogate(16, 2, 4, hidden_dim=4, skipped_layers=(2,))
    stacked = StackedMLP(surrogate)
    with torch.no_grad():
        for p in stacked.parameters():
            p.add_(torch.randn_like(p))
    h = torch.randn(10, 3, 16)
    expected = stacked(h)
    stacked.write_into(surrogate)
    torch.testing.assert_close(surrogate(h), expected)
    assert all(not p.detach().any() for p in surrogate.layers[2].parameters())  # a skipped layer stays zero


def test_a_linear_surrogate_is_refused():
    with pytest.raises(TypeError, match="ridge"):
        StackedMLP(Surrogate(8, 2, 3))
