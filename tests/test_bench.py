"""The benchmark's FLOP count, which turns its timings into a rate against the machine's matmul rate."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from fedlib.bench import ceiling, chain_flops, main
from fedlib.models import build_model


def test_chain_flops_golden():
    # 2-3-4 chain, batch 5: layer 1 forward + weight grad 2 * (2*5*2*3) = 120; layer 2 adds the input
    # grad: 3 * (2*5*3*4) = 360; 480 a step, times 2 clients and 3 steps
    assert chain_flops([2, 3, 4], clients=2, batch=5, steps=3) == 2880


@pytest.mark.parametrize("name, hidden", [("mlr", None), ("dnn", (7,)), ("mlp", (7, 5))])
def test_chain_flops_matches_torch_flop_counter(name, hidden):
    """One client, one step of the loop executor's module: torch counts the same matmul FLOPs."""
    model = build_model(name, (12,), 4, hidden, seed=0)
    x, y = torch.randn(6, 12), torch.randint(0, 4, (6,))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    dims = [12, *(hidden or ()), 4]
    assert counter.get_total_flops() == chain_flops(dims, clients=1, batch=6, steps=1)


def test_ceiling_golden():
    # a loop of 0.1 s against 2e9 FLOPs at 1e11 FLOP/s (0.02 s at best): no stacked round beats 5x
    assert ceiling(0.1, 2_000_000_000, 1e11) == pytest.approx(5.0)
    # twice the loop time or twice the rate doubles it; twice the FLOPs halves it
    assert ceiling(0.2, 2_000_000_000, 1e11) == pytest.approx(10.0)
    assert ceiling(0.1, 2_000_000_000, 2e11) == pytest.approx(10.0)
    assert ceiling(0.1, 4_000_000_000, 1e11) == pytest.approx(2.5)


def test_bench_rejects_unknown_case(capsys):
    with pytest.raises(SystemExit):
        main(["--only", "d"])
    assert "allowed: a, b, c, f" in capsys.readouterr().err


def test_fedmix_case_times_the_three_paths():
    from fedlib.bench import bench_fedmix

    r = bench_fedmix(repeats=1, clients=2, steps=2)
    assert {"loop", "vmap", "chain"} <= set(r) and all(r[k] > 0 for k in ("loop", "vmap", "chain"))
