"""The typed parts of a run config and their checks: ``DataConfig``, ``ModelConfig``, ``LocalConfig``,
``SelectionConfig`` (``fedlib.config.run.RunConfig`` holds one of each, a method's options and its own top-level
fields, ``TOP``).

The library reads a config through these parts only (``cfg.data.n_clients``, ``cfg.model.name``,
``cfg.local.batch_size``, ``cfg.selection.rule``, ``cfg.method.<option>``): one spelling per field, checked by mypy
and found by grep. The flat names users write (``lr``, ``model``, ``n_clients``) are mapped onto these fields in
``fedlib.config.legacy`` alone.

Each field carries its bounds (``fedlib.config.options.option``); a part's ``check`` adds what one field's bounds
cannot say (a partition the data set has, hidden widths the model has, local steps or epochs). Error messages name
a field as users write it (``RunConfig.n_clients``): ``RunConfig.validate`` passes each part the flat name of its
fields.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from fedlib.config.options import Part, option
from fedlib.config.presets import SELECTION as SELECTION_PRESETS
from fedlib.data import own
from fedlib.data.domains import DOMAINS
from fedlib.models.local_attention import ATTENTIONS
from fedlib.models.registry import MODELS, check_attention

DATASETS = ("synthetic", "mnist", "fmnist", "cifar10", "digits", "office31", "officehome", "domainnet")
PARTITIONS = {  # which partitions make sense for which data sets
    "synthetic": ("natural",),
    "mnist": ("labels", "shards", "iid", "dirichlet"),
    "fmnist": ("labels", "shards", "iid", "dirichlet"),
    "cifar10": ("labels", "shards", "iid", "dirichlet"),
    "digits": ("domains",),  # feature shift (pFedLA after FedBN): one client per domain
    "office31": ("domains",),
    "officehome": ("domains",),
    "domainnet": ("domains",),
}


class _Names:
    """The names of a built-in tuple and a registry of the user's, read when asked (a field's ``choices``): a data set
    or model registered after import is a choice, as ``fedlib.register_dataset`` promises."""

    def __init__(self, fixed: tuple[str, ...], registry: dict) -> None:
        self.fixed, self.registry = fixed, registry

    def __iter__(self):
        return iter((*self.fixed, *self.registry))

    def __contains__(self, name: object) -> bool:
        return name in self.fixed or name in self.registry

    def __len__(self) -> int:
        return len(self.fixed) + len(self.registry)


def partitions_of(dataset: str) -> tuple[str, ...]:
    """The partitions ``dataset`` allows: ``PARTITIONS``, or a user data set's (``fedlib.data.own``)."""
    return PARTITIONS[dataset] if dataset in PARTITIONS else own.entry(dataset).allowed()


# the data sets whose pixels ``normalize`` scales: Synthetic is its generator's numbers, the feature-shift sets are
# normalised per domain as FedBN does (``fedlib.data.domains``)
_PIXELS = tuple(d for d in PARTITIONS if d != "synthetic" and d not in DOMAINS)
RULES = (
    "uniform",
    "attention",
    "power_of_choice",
)  # selection rules; a selection preset (``fedlib.config.presets``) expands to one
# partitions whose clients' own test splits are the run's only test data (the others keep the data set's test set)
OWN_TEST = ("natural", "labels")


@dataclass(frozen=True)
class DataConfig(Part):
    dataset: str = option(
        "synthetic", choices=_Names(DATASETS, own.USER_DATASETS), doc="a built-in data set or one registered"
    )
    partition: str = option(
        "natural",
        choices=tuple(dict.fromkeys(p for v in PARTITIONS.values() for p in v)),
        doc="natural (Synthetic's own clients) | labels | shards | iid | dirichlet | domains",
    )
    n_clients: int = option(100, ge=1, doc="N (FedMCSA), M (AdaFL)")
    synthetic_alpha: float = option(
        0.5,
        ge=0,
        when=lambda d: d.dataset == "synthetic",
        when_doc="dataset='synthetic'",
        doc="Synthetic(alpha, beta): model heterogeneity",
    )
    synthetic_beta: float = option(
        0.5,
        ge=0,
        when=lambda d: d.dataset == "synthetic",
        when_doc="dataset='synthetic'",
        doc="... and feature heterogeneity",
    )
    labels_per_client: int = option(
        2,
        ge=1,
        le=10,  # mnist, fmnist and cifar10 (the data sets partition='labels' splits) have 10 classes each
        when=lambda d: d.partition == "labels",
        when_doc="partition='labels'",
        doc="k labels per client, of the data set's 10 classes",
    )
    label_stride: int = option(
        1,
        ge=1,
        le=10,
        when=lambda d: d.partition == "labels",
        when_doc="partition='labels'",
        doc="client u holds the labels (label_stride * u + j) mod 10, j < k: 1 is pFedMe's script (the papers' "
        "default), k FedMCSA's copy of it (clients u, u + 5, ... then share one label pair)",
    )
    shard_size: int = option(300, ge=1, when=lambda d: d.partition == "shards", when_doc="partition='shards'")
    dirichlet_alpha: float = option(
        0.5, gt=0, when=lambda d: d.partition == "dirichlet", when_doc="partition='dirichlet'"
    )
    train_frac: float = option(
        0.75,
        gt=0,
        le=1,
        when=lambda d: d.dataset not in DOMAINS,  # a domain's client has the domain's own test set
        when_doc="the data set is not a feature-shift one (those split by domain: " + ", ".join(DOMAINS) + ")",
        doc="per-client train share (FedMCSA: 75/25); below 1 where the clients' splits are the test data",
    )
    normalize: str = option(
        "standardize",
        choices=("standardize", "unit"),
        when=lambda d: d.dataset in _PIXELS,
        when_doc="the data set is " + " or ".join(_PIXELS),
        doc="image pixels: per-pixel standardisation with the training set's statistics, or x / 255",
    )
    data_seed: int = option(
        0,
        ge=0,
        lt=2**32,  # Synthetic's generator is numpy's RandomState, which takes seeds below 2**32
        doc="partition/generation seed (0 reproduces pFedMe's Synthetic); below 2**32",
    )
    domains: tuple | None = option(None, doc="feature-shift data: which domains, one client each (None: all)")
    domain_percent: float | None = option(
        None,
        doc="share of each domain's training set (None: the data set's own -- "
        "digits 10% as FedBN, Office/DomainNet 100%); pFedLA Figure 4(c)",
    )
    val_frac: float = option(
        0.0,
        ge=0,
        lt=1,
        doc="share of each client's training rows held out as its validation split (val_acc, val_loss; the summary's "
        "test_acc_at_best_val); 0: none (fedlib.data.holdout)",
    )
    new_client_frac: float = option(
        0.0,
        ge=0,
        lt=1,
        doc="share of the clients that never train, evaluated with the global model and after fine-tuning "
        "(new_test_acc, new_ft_test_acc); 0: none (fedlib.data.holdout)",
    )
    new_client_finetune_epochs: int = option(
        1,
        ge=1,
        when=lambda d: d.new_client_frac > 0,
        when_doc="new_client_frac > 0",
        doc="k local epochs a new client fine-tunes the global model for (new_ft_test_acc)",
    )

    def check(self, where: str | None = None, rename: Callable[[str], str] | None = None) -> None:
        self._check_domains()
        super().check(where, rename)
        self._check_new_clients()
        if self.dataset in own.USER_DATASETS:  # its partitions, clients and test data (``fedlib.data.own.check``)
            own.check(self)
            return
        if self.partition not in PARTITIONS[self.dataset]:
            raise ValueError(
                f"RunConfig.partition={self.partition!r} is not one of: {', '.join(PARTITIONS[self.dataset])}"
            )
        if self.partition in OWN_TEST and self.train_frac >= 1:
            others = ", ".join(p for p in PARTITIONS["mnist"] if p not in OWN_TEST)
            raise ValueError(
                f"RunConfig.train_frac={self.train_frac!r} must be in (0, 1) for partition={self.partition!r}: its "
                "clients' test splits (the other 1 - train_frac of each) are the run's only test data, and 1 leaves "
                f"none (every test metric NaN); the partitions that keep the data set's test set ({others}) take 1"
            )

    def _check_new_clients(self) -> None:
        """``new_client_frac`` holds out round(frac * N) clients: at least one, and at least one left to train."""
        if self.new_client_frac <= 0:
            return
        n_new = round(self.new_client_frac * self.n_clients)
        if not 1 <= n_new <= self.n_clients - 1:
            raise ValueError(
                f"RunConfig.new_client_frac={self.new_client_frac!r} holds out round({self.new_client_frac} * "
                f"n_clients={self.n_clients}) = {n_new} clients; it must hold out at least one and leave at least one "
                "to train"
            )

    def _check_domains(self) -> None:
        """Feature-shift data sets: known domains, percent in (0, 1], one client per domain."""
        p = self.domain_percent
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1):
            raise ValueError(f"RunConfig.domain_percent={p!r} must be None or in (0, 1]")
        if self.dataset not in DOMAINS:
            if self.domains is not None or p is not None:
                raise ValueError(
                    f"RunConfig: domains/domain_percent set but dataset={self.dataset!r} has no domains "
                    f"(feature-shift data sets: {', '.join(DOMAINS)})"
                )
            return
        allowed, d = DOMAINS[self.dataset], self.domains
        if d is not None and (
            not isinstance(d, tuple) or not d or any(x not in allowed for x in d) or len(set(d)) != len(d)
        ):
            raise ValueError(
                f"RunConfig.domains={d!r} must be None or a tuple of distinct {self.dataset} domains "
                f"from: {', '.join(allowed)}"
            )
        n = len(d) if d is not None else len(allowed)
        if self.n_clients != n:
            raise ValueError(
                f"RunConfig.n_clients={self.n_clients!r} must equal the number of domains ({n}: one "
                f"client per domain, RunConfig.domains={d!r})"
            )


@dataclass(frozen=True)
class ModelConfig(Part):
    name: str = option("mlr", choices=MODELS, doc="see fedlib.models.registry.MODELS (and register_model)")
    hidden: tuple | None = option(None, doc="hidden widths, one per hidden layer of the model; None = its default")
    attention: str = option("none", choices=ATTENTIONS, doc="pFedLA module after each conv layer")
    attention_local: bool = option(
        True,
        when=lambda m: m.attention != "none",
        when_doc="attention is not 'none'",
        doc="pFedLA: attention parameters stay on the client (False: the non-local ablation)",
    )
    attention_init: str = option(
        "shared",
        choices=("shared", "per_client"),
        when=lambda m: m.attention != "none" and m.attention_local,
        when_doc="the attention is local (attention not 'none', attention_local)",
        doc="pFedLA: every client's attention starts as the seed's one model has it ('shared', every stored run), "
        "or each client's is drawn on its own ('per_client', Algorithm 1 line 9)",
    )

    def check(self, where: str | None = None, rename: Callable[[str], str] | None = None) -> None:
        h = self.hidden
        if h is not None and not (
            isinstance(h, tuple) and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in h)
        ):
            raise ValueError(f"RunConfig.hidden={h!r} must be None or a tuple of positive ints")
        super().check(where, rename)
        if self.hidden is not None:
            want = len(MODELS[self.name].default_hidden)
            if len(self.hidden) != want:
                raise ValueError(
                    f"RunConfig.hidden={self.hidden!r} has {len(self.hidden)} widths but model="
                    f"{self.name!r} has {want} hidden layer(s) (default {MODELS[self.name].default_hidden})"
                )
        check_attention(self.name, self.attention, prefix="RunConfig.")

    def __eq__(self, other: object) -> bool:
        # ``cfg.model == "dnn"`` (the flat config's spelling, in notebooks and user code) compares the name; the
        # library writes ``cfg.model.name == "dnn"``
        if isinstance(other, str):
            return self.name == other
        return (
            NotImplemented
            if type(other) is not ModelConfig
            else dataclasses.astuple(self) == dataclasses.astuple(other)
        )


@dataclass(frozen=True)
class LocalConfig(Part):
    lr: float = option(0.02, gt=0, doc="eta")
    lr_decay: float = option(1.0, gt=0, doc="eta_t = eta * lr_decay^(t-1) (AdaFL CIFAR-10: 0.99 per round)")
    momentum: float = option(0.0, ge=0, lt=1, doc="SGD momentum (AdaFL: 0.5)")
    weight_decay: float = option(0.0, ge=0, doc="l2 regularisation")
    local_steps: int | None = option(20, ge=1, doc="R local steps per round")
    local_epochs: int | None = option(None, ge=1, doc="E local epochs (epoch-based training, with local_steps=None)")
    batch_size: int = option(20, ge=1, doc="|D| / B")

    def check(self, where: str | None = None, rename: Callable[[str], str] | None = None) -> None:
        super().check(where, rename)
        if self.local_steps is None and self.local_epochs is None:
            raise ValueError("RunConfig: local_steps or local_epochs must be set")
        if self.local_steps is not None and self.local_epochs is not None:  # one run under two keys otherwise
            raise ValueError(
                f"RunConfig: give local_steps or local_epochs, not both (set the other to None): local_epochs="
                f"{self.local_epochs} would override local_steps={self.local_steps}"
            )


@dataclass(frozen=True)
class SelectionConfig(Part):
    rule: str = option(
        "uniform",
        choices=RULES,
        doc="uniform | attention (AdaFL Eq. 1-2: probabilities from model divergence) | power_of_choice (Cho et al. "
        "2020: the m of highest loss among d candidates); presets expand to these",
    )
    clients_per_round: int | None = option(20, ge=1, doc="S clients uploading per round")
    fraction: float | None = option(None, gt=0, le=1, doc="C (instead of clients_per_round)")
    fraction_schedule: tuple | None = option(None, doc="AdaFL dynamic fraction (gamma_1, gamma_T, F[, T])")
    attn_decay: float = option(
        0.9,
        ge=0,
        lt=1,
        when=lambda s: s.rule == "attention",
        when_doc="selection='attention'",
        doc="AdaFL alpha: decay of the previous attention score",
    )
    poc_candidates: int | None = option(
        None,
        ge=1,
        when=lambda s: s.rule == "power_of_choice",
        when_doc="selection='power_of_choice'",
        doc="Power-of-Choice d: candidates drawn by data share, m <= d <= n_clients (None: d = 2m, at most N)",
    )
    poc_loss: str = option(
        "pow-d",
        choices=("pow-d",),
        when=lambda s: s.rule == "power_of_choice",
        when_doc="selection='power_of_choice'",
        doc="how a candidate's loss is measured: pow-d, on all its training data (the paper's cpow-d and rpow-d "
        "are not implemented)",
    )
    dropout: float = option(
        0.0,
        ge=0,
        lt=1,
        doc="share of each round's selected clients that drop out: no work, no upload (clients failing, not a "
        "model's dropout layers; fedlib.core.failures)",
    )
    stragglers: float = option(
        0.0,
        ge=0,
        le=1,
        doc="share of each round's selected clients that straggle: they upload after straggler_work of their local "
        "steps (fedlib.core.failures)",
    )
    straggler_work: float = option(
        0.5,
        gt=0,
        le=1,
        when=lambda s: s.stragglers > 0,
        when_doc="stragglers > 0",
        doc="share of its local steps a straggler completes: ceil(straggler_work * R) of its R",
    )

    def check(self, where: str | None = None, rename: Callable[[str], str] | None = None) -> None:
        if isinstance(self.rule, str) and self.rule not in RULES:  # a preset is expanded on construction
            raise ValueError(
                f"RunConfig.selection={self.rule!r} is not one of: {', '.join(RULES)}, or a preset: "
                + ", ".join(SELECTION_PRESETS)
                + " (fedlib.config.presets.SELECTION)"
            )
        super().check(where, rename)
        if self.fraction is not None and self.clients_per_round is not None:
            raise ValueError("RunConfig: give clients_per_round or fraction, not both (set the other to None)")
        fs = self.fraction_schedule
        if fs is not None:
            numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in fs)
            if not numbers or len(fs) not in (3, 4):
                raise ValueError(
                    f"RunConfig.fraction_schedule={fs!r} must be (gamma_1, gamma_T, F) or "
                    "(gamma_1, gamma_T, F, T), e.g. AdaFL's (0.1, 0.5, 5)"
                )
            if self.clients_per_round is not None or self.fraction is not None:
                raise ValueError(
                    "RunConfig: fraction_schedule replaces clients_per_round and fraction; set both to None"
                )
        if round(self.dropout + self.stragglers, 9) > 1:
            raise ValueError(
                f"RunConfig: dropout={self.dropout} + stragglers={self.stragglers} must be at most 1: both are shares "
                "of the same selected clients, and a client that drops out does not straggle"
            )
        d, m = self.poc_candidates, self.clients_per_round
        if self.rule == "power_of_choice" and d is not None and m is not None and d < m:
            raise ValueError(
                f"RunConfig.poc_candidates={d} must be >= clients_per_round={m}: Power-of-Choice keeps m of its d "
                "candidates (d = m is data-share sampling without the loss)"
            )

    def __eq__(self, other: object) -> bool:
        # ``cfg.selection == "attention"`` (the flat config's spelling, for users) compares the rule; the library
        # writes ``cfg.selection.rule``
        if isinstance(other, str):
            return self.rule == other
        if type(other) is not SelectionConfig:
            return NotImplemented
        return dataclasses.astuple(self) == dataclasses.astuple(other)


# RunConfig's layout: its parts by name, and its own top-level fields (their names are the same flat and typed)
PARTS: dict[str, type[Part]] = {
    "data": DataConfig,
    "model": ModelConfig,
    "local": LocalConfig,
    "selection": SelectionConfig,
}
TOP = ("rounds", "seed", "executor", "device", "dtype", "eval_every", "eval_train")
