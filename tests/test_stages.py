"""Server maths and selection with hand-checkable numbers on 2-3 clients."""

import numpy as np
import pytest
import torch

from fedlib.core.stages import Algorithm, Mixing, UniformSelection, WeightedMean, mix, shared_except, weighted_mean


def test_weighted_mean_golden():
    # clients with 1, 3 samples: w = (0.25, 0.75); params 0 and 4 -> 3; (2, 6) -> 5
    up = {"w": torch.tensor([[0.0, 2.0], [4.0, 6.0]]), "b": torch.tensor([1.0, 5.0])}
    out = weighted_mean(up, torch.tensor([1.0, 3.0]))
    assert torch.equal(out["w"], torch.tensor([3.0, 5.0]))
    assert torch.equal(out["b"], torch.tensor(4.0))


def test_weighted_mean_stage_weights():
    m = WeightedMean("samples")({}, torch.tensor([100.0, 300.0, 600.0]), np.arange(3))
    assert torch.allclose(m.to_global, torch.tensor([0.1, 0.3, 0.6], dtype=torch.float64))
    u = WeightedMean("uniform")({}, torch.tensor([100.0, 300.0, 600.0]), np.arange(3))
    assert torch.allclose(u.to_global, torch.full((3,), 1 / 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="by='size' is not one of: samples, uniform"):
        WeightedMean("size")({}, torch.ones(2), np.arange(2))


def test_mix_personal_per_layer():
    """Row i of a (K, K) mixing matrix is client i's personalised model; one matrix per layer."""
    up = {"a": torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]]), "b": torch.tensor([3.0, 6.0, 9.0])}
    A = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.25, 0.75]])
    out = mix({"a": A, "b": torch.eye(3)}, up)
    assert torch.equal(out["a"], torch.tensor([[1.0, 0.0], [0.5, 0.5], [1.5, 1.75]]))
    assert torch.equal(out["b"], torch.tensor([3.0, 6.0, 9.0]))


def test_uniform_selection_counts_and_frequencies():
    rng = np.random.default_rng(0)
    s = UniformSelection(clients_per_round=3)
    picks = np.zeros(10)
    for t in range(3000):
        sel = s.select(t, 10, rng)
        assert len(sel) == 3 and len(set(sel)) == 3 and np.all(np.diff(sel) > 0)
        picks[sel] += 1
    assert np.allclose(picks / 3000, 0.3, atol=0.03)  # each client with probability S/N
    assert UniformSelection(fraction=0.1).count(100) == 10
    assert UniformSelection(fraction=0.01).count(20) == 1  # at least one client
    assert np.array_equal(UniformSelection().select(0, 5, rng), np.arange(5))


def test_shared_except():
    keep = shared_except("bn", "attn")
    assert keep("conv1.weight") and not keep("bn1.weight") and not keep("layer.attn.fc")


def test_algorithm_validates_stages():
    with pytest.raises(ValueError, match="Algorithm.start='mine' is not one of: global, personal"):
        Algorithm("x", UniformSelection(), None, WeightedMean(), start="mine")
    assert Mixing().to_global is None
