"""FedRoD: Chen, Chao, "On Bridging Generic and Personalized Federated Learning for Image Classification", ICLR 2022.

Federated Robust Decoupling: one model, two predictors. A shared body f(x; theta) and a generic head
g(z; psi), trained on every client with the balanced risk and averaged, give the generic model; each client's
personal head h(z; phi_m) on the same features, kept on the client and trained with its empirical risk on top of
the generic predictor, gives the personal model, whose logits are g(z; psi) + h(z; phi_m). Paper symbols ->
``RunConfig``: theta (the body) -> every parameter outside the model's declared ``head`` group, psi (the generic
head) -> the ``head`` group (``fedlib.models.groups.head``), phi_m (client m's personal head) -> a copy of the head
group per client, kept in the method's state (``PersonalHeads``), never uploaded; E -> ``local_epochs`` (or
``local_steps``), B -> ``batch_size``, eta -> ``lr`` (both heads and the body: one step size).

Client m's loss on a mini-batch, one SGD step for all three parts:

    BSM(g(z) + log n_m, y)  +  CE(sg[g(z)] + h(sg[z]), y),      z = f(x; theta)

with ``log n_m`` the log of the client's training-label counts (its class prior up to a constant, which the
softmax ignores; a class it lacks gets log 0 = -inf, so the generic head is not pushed away from it) and sg the
stop-gradient: the balanced softmax (Ren et al. 2020's loss, the balanced risk of the paper's experiments)
trains the body and the generic head, the cross-entropy of the summed logits trains the personal head alone, on the
body's features detached from the body and the generic logits detached from their head. Server: FedAvg's
sample-weighted mean of the bodies and generic heads.

Choices, where the paper leaves them: the two losses step together on each mini-batch with the run's optimiser, as
the public implementations do (PFLlib's ``clientrod``: two SGD optimisers at one lr, each stepping on the same
batch's forward pass; one step of their summed loss moves each part by its own loss's gradient, the same step). The
personal heads start as copies of the initial head (PFLlib's ``copy.deepcopy(model.head)``), so at the start the
personal prediction is twice the generic logits. The paper's hypernetwork variant of the personal head is not
implemented (its linear head is). The evaluated personal model is the global body and generic head with the
client's personal head added: ``test_acc`` is the personal prediction's, ``gm_test_acc`` the generic model's (the
global model, generic head alone), side by side. The generic model is balanced (the prior is what the balanced
softmax takes out of it): on the clients' own test splits, as label-skewed as their training rows, it may score far
below FedAvg's global model (Synthetic's 20 clients: 0.06 where FedRoD's personal prediction scores 0.80 and the
generic logits plus the client's log prior 0.78); the paper measures it on a balanced test set.

How the two heads run: during training, the run's model is copied once with its head module replaced by
``TwoHeads``, which returns the generic and the personal head's logits side by side (the personal head on the
detached features), so both executors train it as any model (the stacked one by ``vmap`` over ``functional_call``);
this needs the head's output to be the model's output, which every registered model's is (tests/test_split_models)
and which is checked on the model. For evaluation, g(z) + h(z) of two Linear heads is the Linear head with
parameters psi + phi_m, which the run's own model evaluates: so the head must be one ``nn.Linear`` (every registered
model's is), checked at validate. A model whose only layer is its head (MLR) has no body to share the features of:
refused at validate (``fedper.check_split``), as is a user model declaring no head.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedlib.algorithms.fedavg import FedAvg
from fedlib.algorithms.fedper import check_split
from fedlib.config.options import MethodOptions, register
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Algorithm, ClientWork, MethodState, Params
from fedlib.data.federated import Split
from fedlib.executors.objectives import Context, Forward, Objective
from fedlib.models.groups import HEAD
from fedlib.models.registry import MODELS


def head_module(model: nn.Module, name: str = "") -> tuple[str, nn.Linear]:
    """(path, module) of ``model``'s one declared head (``fedlib.models.groups.head``), which must be an ``nn.Linear``:
    FedRoD evaluates the sum of two heads' logits as one head with the summed parameters."""
    heads = [(n, m) for n, m in model.named_modules() if getattr(m, "fedlib_group", None) == HEAD]
    what = f"model={name!r}" if name else type(model).__name__
    if len(heads) != 1 or not isinstance(heads[0][1], nn.Linear):
        found = ", ".join(f"{n or '(root)'}: {type(m).__name__}" for n, m in heads) or "none"
        raise ValueError(
            f"RunConfig: algorithm='fedrod' adds a personal head to the model's head, which must be one nn.Linear "
            f"module declared with fedlib.models.groups.head; {what} declares {found}"
        )
    return heads[0][0], heads[0][1]


class TwoHeads(nn.Module):
    """The generic head and a personal copy of it on the same features z: ``[generic(z), personal(sg[z])]`` side by
    side on the last axis (the personal head's gradient stops at the features)."""

    def __init__(self, generic: nn.Linear):
        super().__init__()
        self.generic = generic
        self.personal = copy.deepcopy(generic)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.generic(z), self.personal(z.detach())], dim=-1)


@dataclass
class Wrapped:
    """The run's model with its head replaced by ``TwoHeads`` (its own copy), and how the state's names map to its."""

    module: nn.Module
    head: str  # the head module's path in the run's model
    names: tuple[str, ...]  # the head's parameter names in the run's model ("<head>.weight", "<head>.bias")

    @classmethod
    def of(cls, model: nn.Module, probe: torch.Tensor) -> Wrapped:
        """``model`` wrapped, once its output on input rows ``probe`` is checked to be its head's."""
        path, linear = head_module(model)
        seen: list[torch.Tensor] = []
        hook, training = linear.register_forward_hook(lambda m, i, o: seen.append(o)), model.training
        try:
            with torch.no_grad():
                out = model.eval()(probe)
        finally:
            hook.remove()
            model.train(training)
        if len(seen) != 1 or seen[0] is not out:
            raise ValueError(
                f"algorithm='fedrod': {type(model).__name__}'s output is not its head's ({path}) output, so its "
                "personal head cannot be added on the head's features"
            )
        module = copy.deepcopy(model)
        parent, _, leaf = path.rpartition(".")
        owner = module.get_submodule(parent) if parent else module
        setattr(owner, leaf, TwoHeads(getattr(owner, leaf)))
        kernel = "vmap" if next(module.buffers(), None) is None else "loop"  # no longer a Linear chain
        setattr(module, "fedlib_kernel", kernel)
        names = tuple(f"{path}.{p}" for p, _ in linear.named_parameters())
        return cls(module, path, names)

    def generic(self, name: str) -> str:
        return f"{self.head}.generic.{name[len(self.head) + 1 :]}"

    def personal(self, name: str) -> str:
        return f"{self.head}.personal.{name[len(self.head) + 1 :]}"


@dataclass(eq=False)
class PersonalHeads(MethodState):
    """Every client's personal head phi_m (N, ...), under the head's names in the run's model."""

    KEY = "fedrod"
    heads: Params

    def personal_given(self, global_view: Params) -> Params:
        """The clients' view of the global model (its shared parameters beside each client's local ones) under head
        psi + phi_m: whose logits are the personal prediction g(z) + h(z) of two Linear heads."""
        return {k: v + self.heads[k] if k in self.heads else v for k, v in global_view.items()}


@dataclass(frozen=True, eq=False)
class FedRoDLoss(Objective):
    """BSM(g + log n_m, y) + CE(sg[g] + h, y) on logits ``[g, h]`` (``TwoHeads``); ``log_counts`` (K, C): each
    client's log label counts, handed to each of its rows as context (``batch``: the plan's rows per step)."""

    log_counts: torch.Tensor
    batch: int

    def context(self, step: Any, clients: int | slice | torch.Tensor, dtype: torch.dtype) -> Context:
        lc = self.log_counts[clients].to(dtype)
        return {"log_counts": lc.unsqueeze(-2).expand(*lc.shape[:-1], self.batch, lc.shape[-1])}

    def loss(
        self, forward: Forward, params: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None, ctx: Context
    ) -> torch.Tensor:
        out = forward(params, x)
        c = out.shape[-1] // 2
        g, h = out[..., :c], out[..., c:]
        per = F.cross_entropy(g + ctx["log_counts"], y, reduction="none") + F.cross_entropy(
            g.detach() + h, y, reduction="none"
        )
        return self.reduce(per, w)


def label_counts(split: Split, n_classes: int) -> torch.Tensor:
    """(N, C) each client's rows of ``split`` per label."""
    offsets, sizes = split.offsets.tolist(), split.sizes.tolist()
    counts = torch.zeros(len(sizes), n_classes, dtype=torch.float64)
    for i, (a, k) in enumerate(zip(offsets, sizes)):
        counts[i] = torch.bincount(split.y[a : a + k].cpu(), minlength=n_classes).to(torch.float64)
    return counts.to(split.y.device)


@dataclass
class FedRoDClient:
    """Each client trains body, generic head and personal head in one pass (``FedRoDLoss`` on the ``TwoHeads``
    model), keeps its personal head and uploads the rest."""

    cache: dict = field(default_factory=dict)  # id(model) -> Wrapped, id(split) -> log label counts

    def __call__(self, work: ClientWork) -> Params:
        model, state = work.model, work.state
        wrapped = self.cache.get(id(model))
        if wrapped is None:
            probe = work.split.x[:1]
            probe = probe.to(next(model.parameters()).dtype) if probe.is_floating_point() else probe
            wrapped = self.cache[id(model)] = Wrapped.of(model, probe)
        log_counts = self.cache.get(id(work.split))
        if log_counts is None:
            n_classes = head_module(model)[1].out_features
            log_counts = self.cache[id(work.split)] = label_counts(work.split, n_classes).log()
        n = state.fresh.shape[0]
        first = lambda: PersonalHeads({k: _rows(state.global_params[k], n) for k in wrapped.names})
        mine = PersonalHeads.of(state, first)  # phi_m starts as the initial head (this is round 1's global one)
        params = {}
        for k, t in work.start.items():
            if k in wrapped.names:
                params[wrapped.generic(k)] = t
                params[wrapped.personal(k)] = mine.heads[k][work.clients].clone()
            else:
                params[k] = t
        objective = FedRoDLoss(log_counts[work.clients], int(work.plan.index.shape[2]))
        trained = work.executor.train(wrapped.module, params, work.plan, work.split, work.local, objective=objective)
        for k in wrapped.names:
            mine.heads[k][work.clients] = trained[wrapped.personal(k)]
        return {k: trained[wrapped.generic(k)] if k in wrapped.names else trained[k] for k in work.start}


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    return t.unsqueeze(0).repeat(n, *[1] * t.dim())


def check_head(cfg: RunSpec) -> None:
    """The configured model's head is one ``nn.Linear`` (``head_module``), checked on the model built on torch's meta
    device (no memory) where its builder allows."""
    m = cfg.model
    spec = MODELS[m.name]
    kw = {"attention": m.attention} if spec.attention_slots else {}
    widths = spec.default_hidden if m.hidden is None else tuple(m.hidden)
    try:
        with torch.device("meta"):
            model = spec.build(spec.example_shapes[0], 10, widths, **kw)
    except Exception:  # noqa: BLE001 (a user's builder that needs real tensors: built on the CPU)
        model = spec.build(spec.example_shapes[0], 10, widths, **kw)
    head_module(model, m.name)


@register
@dataclass(frozen=True)
class FedRoD(MethodOptions):
    """No options of its own: the generic model by FedAvg over the balanced softmax, a personal head per client."""

    NAME = "fedrod"

    def check_with(self, cfg: RunSpec) -> None:
        check_split(self.NAME, cfg)
        check_head(cfg)

    def build(self, cfg: RunSpec) -> Algorithm:
        return dataclasses.replace(
            FedAvg().build(cfg),
            name=self.NAME,
            local_update=FedRoDClient(),
            evaluate="personal",
            personal=PersonalHeads,
            report_global=True,
        )
