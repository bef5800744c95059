"""CUDA graphs of the stacked executor's client groups (``fedlib.executors.graphs``), what can be checked without a
GPU: the switch, which calls are recorded, and that everything a recording bakes in is in its key. That replays
equal the eager loop bit for bit is ``tests/test_cuda.py``'s (GPU only)."""

import dataclasses

import pytest
import torch
from helpers import small_synthetic

from fedlib.data.federated import BatchPlan, ShrinkingPlan, sample_steps
from fedlib.executors import CrossEntropy, LocalSGD, StackedExecutor
from fedlib.executors.chain import chain_cross_entropy, chain_mean_mixup
from fedlib.executors.graphs import GroupGraphs, graphs_from_env
from fedlib.executors.kernels import Group
from fedlib.executors.sgd import RunsSGD
from fedlib.models.registry import build_model


@pytest.mark.parametrize("value, on", [(None, False), ("", False), ("0", False), ("off", False), ("1", True),
                                       ("TRUE", True), (" yes ", True), ("on", True)])  # fmt: skip
def test_the_switch_reads_the_environment(value, on, monkeypatch):
    if value is None:
        monkeypatch.delenv("FEDLIB_CUDA_GRAPHS", raising=False)
    else:
        monkeypatch.setenv("FEDLIB_CUDA_GRAPHS", value)
    assert graphs_from_env() is on
    assert (StackedExecutor().graphs is not None) is on
    assert StackedExecutor(graphs=True).graphs is not None and StackedExecutor(graphs=False).graphs is None


def _group():
    data = small_synthetic(n_clients=4, rows=60, dtype=torch.float32)
    model = build_model("dnn", (60,), 10, hidden=(8,), seed=0, dtype=torch.float32)
    p = {n: t.unsqueeze(0).repeat(4, *[1] * t.dim()) for n, t in model.state_dict().items()}
    plan = sample_steps(data.train, torch.arange(4), 3, 5, torch.Generator().manual_seed(0))
    return data, model, p, plan


def test_only_the_cross_entropy_chain_path_on_a_gpu_with_one_localsgd_is_recorded():
    data, model, p, plan = _group()
    ce, opt = CrossEntropy(), LocalSGD(lr=0.1)
    assert not GroupGraphs.eligible(chain_cross_entropy, plan, opt, ce, p)  # CPU tensors
    meta_p = {n: t.to("meta") for n, t in p.items()}  # a device that is not the CPU, without a GPU
    assert not GroupGraphs.eligible(chain_cross_entropy, plan, opt, ce, meta_p)  # meta is not cuda either
    fake = {n: _OnCuda(t) for n, t in p.items()}
    assert GroupGraphs.eligible(chain_cross_entropy, plan, opt, ce, fake)
    assert not GroupGraphs.eligible(chain_mean_mixup, plan, opt, ce, fake)  # another path
    assert not GroupGraphs.eligible(chain_cross_entropy, plan, RunsSGD.of([2, 2], [opt, LocalSGD(0.2)]), ce, fake)
    masked = BatchPlan(plan.index, torch.ones(plan.index.shape), torch.ones(plan.index.shape[:2], dtype=bool))
    assert not GroupGraphs.eligible(chain_cross_entropy, masked, opt, ce, fake)  # a masked (lock-step) plan


class _OnCuda:
    """A stand-in tensor whose device says cuda (``eligible`` reads the device only)."""

    def __init__(self, t):
        self.device = torch.device("cuda")


def test_everything_a_recording_bakes_in_changes_its_key():
    """A replay reuses what the recording fixed: the lr, the plan's shapes, the live clients of a shrinking plan,
    the anchor's presence, the data tensor. A key that missed one would replay another computation."""
    data, model, p, plan = _group()
    opt = LocalSGD(lr=0.1)

    def key(**kw):
        args = dict(model=model, p=p, plan=plan, data=data.train, opt=opt, anchor=None, drift=None,
                    objective=CrossEntropy(), clients=None) | kw  # fmt: skip
        return GroupGraphs._key(args.pop("path", chain_cross_entropy), Group(**args))

    base = key()
    assert key() == base  # the same call: the same key
    # new rows of the same shape are copied in before a replay: the same key
    assert key(plan=BatchPlan(plan.index.flip(0))) == base
    assert key(p={n: t + 1 for n, t in p.items()}) == base
    changed = {
        "lr": key(opt=dataclasses.replace(opt, lr=0.05)),
        "momentum": key(opt=dataclasses.replace(opt, momentum=0.5)),
        "steps": key(plan=BatchPlan(plan.index[:2])),
        "clients": key(plan=BatchPlan(plan.index[:, :3]), p={n: t[:3] for n, t in p.items()}),
        "padding": key(plan=BatchPlan(plan.index, torch.ones(plan.index.shape))),
        "live": key(plan=ShrinkingPlan(plan.index, live=(4, 4, 3))),
        "live'": key(plan=ShrinkingPlan(plan.index, live=(4, 3, 3))),
        "anchor": key(anchor=p),
        "drift": key(drift=p),
        "data": key(data=small_synthetic(n_clients=4, rows=60, dtype=torch.float32).train),
        "dtype": key(p={n: t.double() for n, t in p.items()}),
        "model": key(model=build_model("dnn", (60,), 10, hidden=(8,), seed=0)),
        "path": key(path=chain_mean_mixup),
    }
    assert len({base, *changed.values()}) == len(changed) + 1, [k for k, v in changed.items() if v == base]


def test_graphs_on_the_cpu_change_nothing():
    """The switch on, on a CPU: every group runs eagerly, the same numbers as without it."""
    data, model, p, plan = _group()
    on, off = StackedExecutor(graphs=True), StackedExecutor(graphs=False)
    a = on.train(model, p, plan, data.train, LocalSGD(lr=0.1))
    b = off.train(model, p, plan, data.train, LocalSGD(lr=0.1))
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert (on.graphs.hits, on.graphs.recorded, on.graphs.eager) == (0, 0, 0)


def test_keys_seen_once_are_remembered_up_to_a_bound():
    """A key is recorded at its second sighting, so keys are remembered; a decaying lr makes a new key every round,
    so an unbounded set would grow every round: the ``SEEN`` most recent are kept. A first
    sighting runs eagerly, which needs no GPU."""
    data, model, p, plan = _group()
    graphs = GroupGraphs()
    graphs.SEEN = 3
    for lr in (0.1, 0.2, 0.3, 0.4, 0.5):
        q = {n: t.clone() for n, t in p.items()}
        graphs.run(
            chain_cross_entropy, Group(model, q, plan, data.train, LocalSGD(lr=lr), None, None, CrossEntropy(), None)
        )
    assert graphs.eager == 5 and graphs.recorded == 0
    assert [k[6].lr for k in graphs.seen] == [0.3, 0.4, 0.5]
