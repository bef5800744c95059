"""A run is a pure function of a frozen ``RunConfig``.

Every field has a commented default; ``validate()`` checks all of them before any data is
loaded or any training starts, naming the field and the allowed values. ``key()`` hashes
the config for the results store.

Key stability: the key hashes only the fields that differ from their defaults (plus a
schema version), so adding a new field with a default keeps every stored result's key.
Changing an existing default changes what old keys mean: bump ``SCHEMA`` when you do.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, fields

SCHEMA = 1

DATASETS = ("synthetic", "mnist", "fmnist", "cifar10", "digits", "office31", "officehome", "domainnet")
SELECTIONS = ("uniform", "attention")
PARTITIONS = {  # which partitions make sense for which data sets
    "synthetic": ("natural",),
    "mnist": ("labels", "shards", "iid", "dirichlet"),
    "fmnist": ("labels", "shards", "iid", "dirichlet"),
    "cifar10": ("labels", "shards", "iid", "dirichlet"),
    "digits": ("domains",),             # feature shift (pFedLA after FedBN): one client per domain
    "office31": ("domains",),
    "officehome": ("domains",),
    "domainnet": ("domains",),
}
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float32", "float64")
EXECUTORS = ("auto", "stacked", "loop")
NORMALIZE = ("standardize", "unit")
ATTENTIONS = ("none", "se", "eca", "ca", "hybrid")
ALGORITHM_FIELDS = ("mu", "sigma", "lam", "amp_self_weight", "mcsa_code", "beta", "personal_lr", "inner_steps", "hf_delta",
                    "mix_lam", "mix_mean_size", "mix_taylor_scale", "server_lr", "lr_decay")
MIX_TAYLOR_SCALES = ("sample", "batch")


@dataclass(frozen=True)
class RunConfig:
    # -- data ------------------------------------------------------------------------------
    dataset: str = "synthetic"          # synthetic | mnist | fmnist | cifar10
    partition: str = "natural"          # natural (Synthetic's own clients) | labels | shards | iid | dirichlet
    n_clients: int = 100                # N (FedMCSA), M (AdaFL)
    synthetic_alpha: float = 0.5        # Synthetic(alpha, beta): model heterogeneity
    synthetic_beta: float = 0.5         # ... and feature heterogeneity
    labels_per_client: int = 2          # 'labels' partition: classes per client (pFedMe recipe)
    shard_size: int = 300               # 'shards' partition: McMahan et al. shard size (2 per client)
    dirichlet_alpha: float = 0.5        # 'dirichlet' partition concentration
    train_frac: float = 0.75            # per-client train share (FedMCSA: 75/25)
    normalize: str = "standardize"      # images: per-pixel standardisation (pFedMe) or x/255
    data_seed: int = 0                  # partition/generation seed (0 reproduces pFedMe's Synthetic)
    domains: tuple | None = None        # feature-shift data: which domains, one client each (None: all of the data set's)
    domain_percent: float | None = None  # share of each domain's training set (None: the data set's own -- digits 10% as
                                         # FedBN, Office/DomainNet 100%); pFedLA Figure 4(c) varies it
    # -- model -----------------------------------------------------------------------------
    model: str = "mlr"                  # mlr | dnn | mlp (see fedlib.models.MODELS)
    hidden: tuple | None = None         # hidden sizes; None = the model's default
    # -- algorithm -------------------------------------------------------------------------
    algorithm: str = "fedavg"           # see fedlib.algorithms.ALGORITHMS
    rounds: int = 100                   # T communication rounds
    clients_per_round: int | None = 20  # S clients uploading per round (None with fraction=None: all)
    fraction: float | None = None       # C (instead of clients_per_round)
    fraction_schedule: tuple | None = None  # AdaFL dynamic fraction (gamma_1, gamma_T, F): F equal steps over T rounds
    selection: str = "uniform"          # uniform | attention (AdaFL Eq. 1-2: probabilities from model divergence)
    attn_decay: float = 0.9             # AdaFL alpha: decay of the previous attention score
    local_steps: int | None = 20        # R local steps per round (fixed-step training)
    local_epochs: int | None = None     # E local epochs (epoch-based training; overrides local_steps)
    batch_size: int = 20                # |D| / B
    lr: float = 0.02                    # eta
    lr_decay: float = 1.0               # eta_t = eta * lr_decay^(t-1) (AdaFL CIFAR-10: 0.99 per round)
    momentum: float = 0.0               # SGD momentum (AdaFL: 0.5)
    weight_decay: float = 0.0           # l2 regularisation
    mu: float = 0.0                     # FedProx proximal strength
    sigma: float = 50.0                 # FedMCSA/HeurFedAMP attention scale sigma (FedMCSA default 50)
    lam: float = 5.0                    # FedMCSA/HeurFedAMP client proximal strength lambda (FedMCSA default 5)
    amp_self_weight: float = 0.5        # HeurFedAMP self-attention weight xi_ii
    mcsa_code: bool = False             # FedMCSA "as in the authors' code" (data-size reweighting, no prox)
    beta: float = 1.0                   # pFedMe server mixing beta (1: plain average); Per-FedAvg's outer step beta
    hf_delta: float = 1e-3              # Per-FedAvg (HF) finite-difference step delta
    personal_lr: float = 0.01           # pFedMe personal learning rate eta_p
    inner_steps: int = 5                # pFedMe K steps solving the personalised problem
    server_lr: float = 1.0              # SCAFFOLD global step size eta_g
    mix_lam: float = 0.05               # FedMix / NaiveMix mixing ratio lambda
    mix_mean_size: int = 10             # FedMix M_k: samples per shared mean (averaged) data point
    mix_taylor_scale: str = "sample"    # FedMix Taylor term: "sample" (the equation) | "batch" (x (1 - lam) / B, public codes)
    attention: str = "none"             # pFedLA module after each conv layer: none | se | eca | ca | hybrid
    attention_local: bool = True        # pFedLA: attention parameters stay on the client (False: the "non-local" ablation)
    # -- execution -------------------------------------------------------------------------
    seed: int = 0                       # model init, client sampling, mini-batches
    executor: str = "auto"              # auto | stacked | loop
    device: str = "auto"                # auto | cpu | cuda
    dtype: str = "float32"              # float32 | float64
    eval_every: int = 1                 # evaluate every k rounds (and always at the last)
    eval_train: bool = False            # also compute training loss/accuracy

    @classmethod
    def of(cls, **fields_) -> "RunConfig":
        """A config from field names (flat names such as ``lr``, ``sigma``; dotted ones come with the typed parts)."""
        return cls(**fields_)

    def replace(self, **changes) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    def flat(self) -> dict:
        """Every field under its flat name (what ``config.json`` and results frames carry)."""
        return dataclasses.asdict(self)

    def get(self, name: str):
        """A field's value by flat (``mu``) or dotted (``method.mu``) name."""
        return self.flat()[name.rsplit(".", 1)[-1]]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def changed(self) -> dict:
        """Fields that differ from the defaults (what a short label or the key needs)."""
        base = RunConfig()
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(base, f.name)}

    def key(self) -> str:
        blob = json.dumps({"schema": SCHEMA, **_jsonable(self.changed())}, sort_keys=True)
        return hashlib.sha1(blob.encode()).hexdigest()[:16]

    def validate(self) -> "RunConfig":
        """Raise ValueError naming the field and its allowed values; returns self for chaining."""
        from .algorithms import ALGORITHMS
        from .models import MODELS, check_attention

        def choice(name, allowed):
            v = getattr(self, name)
            if v not in allowed:
                raise ValueError(f"RunConfig.{name}={v!r} is not one of: {', '.join(map(str, allowed))}")

        def at_least(name, lo, none_ok=False):
            v = getattr(self, name)
            if v is None and none_ok:
                return
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < lo:
                raise ValueError(f"RunConfig.{name}={v!r} must be a number >= {lo}")

        choice("dataset", DATASETS)
        choice("partition", PARTITIONS[self.dataset])
        choice("model", tuple(MODELS))
        choice("algorithm", tuple(ALGORITHMS))
        choice("executor", EXECUTORS)
        choice("device", DEVICES)
        choice("dtype", DTYPES)
        choice("normalize", NORMALIZE)
        choice("selection", SELECTIONS)
        choice("attention", ATTENTIONS)
        choice("mix_taylor_scale", MIX_TAYLOR_SCALES)
        for name in ("n_clients", "rounds", "batch_size", "eval_every", "labels_per_client", "shard_size", "inner_steps",
                     "mix_mean_size"):
            at_least(name, 1)
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"RunConfig.{name}={getattr(self, name)!r} must be an integer")
        at_least("clients_per_round", 1, none_ok=True)
        at_least("local_steps", 1, none_ok=True)
        at_least("local_epochs", 1, none_ok=True)
        for name in ("lr", "synthetic_alpha", "synthetic_beta", "momentum", "weight_decay", "mu", "dirichlet_alpha",
                     "sigma", "lam", "amp_self_weight", "beta", "personal_lr", "hf_delta", "mix_lam", "attn_decay"):
            at_least(name, 0)
        for name in ("lr_decay", "server_lr"):
            at_least(name, 0)
            if getattr(self, name) <= 0:
                raise ValueError(f"RunConfig.{name}={getattr(self, name)!r} must be > 0")
        if self.attn_decay >= 1:
            raise ValueError(f"RunConfig.attn_decay={self.attn_decay!r} (AdaFL alpha) must be in [0, 1)")
        if self.selection != "attention" and "attn_decay" in self.changed():
            raise ValueError("RunConfig: attn_decay set but selection='uniform' does not use it (use selection='attention')")
        if self.mix_lam > 1:
            raise ValueError(f"RunConfig.mix_lam={self.mix_lam!r} (FedMix lambda) must be in [0, 1]")
        if not isinstance(self.attention_local, bool):
            raise ValueError(f"RunConfig.attention_local={self.attention_local!r} must be True or False")
        check_attention(self.model, self.attention, prefix="RunConfig.")
        if not self.attention_local and self.attention == "none":
            raise ValueError("RunConfig: attention_local=False (the non-local ablation) needs attention in "
                             "se | eca | ca | hybrid")
        if self.fraction_schedule is not None:
            fs = self.fraction_schedule
            numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in fs) if isinstance(fs, tuple) else False
            if not numbers or len(fs) not in (3, 4):
                raise ValueError(f"RunConfig.fraction_schedule={fs!r} must be (gamma_1, gamma_T, F) or "
                                 "(gamma_1, gamma_T, F, T), e.g. AdaFL's (0.1, 0.5, 5)")
            if self.clients_per_round is not None or self.fraction is not None:
                raise ValueError("RunConfig: fraction_schedule replaces clients_per_round and fraction; set both to None")
            from .selection import StepFraction
            # raises naming what is wrong
            StepFraction(float(fs[0]), float(fs[1]), fs[2], fs[3] if len(fs) == 4 else self.rounds)
        if self.amp_self_weight > 1:
            raise ValueError(f"RunConfig.amp_self_weight={self.amp_self_weight!r} must be in [0, 1]")
        if self.lr <= 0:
            raise ValueError(f"RunConfig.lr={self.lr!r} must be > 0")
        if self.momentum >= 1:
            raise ValueError(f"RunConfig.momentum={self.momentum!r} must be in [0, 1)")
        self._validate_domains()
        if not 0 < self.train_frac <= 1:
            raise ValueError(f"RunConfig.train_frac={self.train_frac!r} must be in (0, 1]")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError(f"RunConfig.fraction={self.fraction!r} must be in (0, 1] or None")
        if self.fraction is not None and self.clients_per_round is not None:
            raise ValueError("RunConfig: give clients_per_round or fraction, not both (set the other to None)")
        if self.local_steps is None and self.local_epochs is None:
            raise ValueError("RunConfig: local_steps or local_epochs must be set")
        if self.dirichlet_alpha <= 0:
            raise ValueError(f"RunConfig.dirichlet_alpha={self.dirichlet_alpha!r} must be > 0")
        if self.device == "cuda":
            import torch
            if not torch.cuda.is_available():
                raise ValueError("RunConfig.device='cuda' but no CUDA device is available; use 'auto' or 'cpu'")
        widths_ok = isinstance(self.hidden, tuple) and all(isinstance(h, int) and h > 0 for h in self.hidden)
        if self.hidden is not None and not widths_ok:
            raise ValueError(f"RunConfig.hidden={self.hidden!r} must be None or a tuple of positive ints")
        if "clients_per_round" not in ALGORITHMS[self.algorithm].USES and (
                self.selection != "uniform" or self.fraction_schedule is not None):
            raise ValueError(f"RunConfig: algorithm={self.algorithm!r} selects no clients, so selection and "
                             "fraction_schedule do not apply")
        # an algorithm-specific field set for an algorithm that ignores it is almost always a mistake
        unused = {k for k in self.changed() if k in ALGORITHM_FIELDS} - set(ALGORITHMS[self.algorithm].USES)
        if unused:
            raise ValueError(f"RunConfig: {', '.join(sorted(unused))} set but algorithm={self.algorithm!r} does not use it")
        return self

    def _validate_domains(self) -> None:
        """Feature-shift data sets: known domains, percent in (0, 1], one client per domain."""
        from .data.domains import DOMAINS
        p = self.domain_percent
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1):
            raise ValueError(f"RunConfig.domain_percent={p!r} must be None or in (0, 1]")
        if self.dataset not in DOMAINS:
            if self.domains is not None or p != RunConfig.domain_percent:
                raise ValueError(f"RunConfig: domains/domain_percent set but dataset={self.dataset!r} has no domains "
                                 f"(feature-shift data sets: {', '.join(DOMAINS)})")
            return
        allowed = DOMAINS[self.dataset]
        d = self.domains
        if d is not None and (not isinstance(d, tuple) or not d or any(x not in allowed for x in d) or len(set(d)) != len(d)):
            raise ValueError(f"RunConfig.domains={d!r} must be None or a tuple of distinct {self.dataset} domains from: "
                             f"{', '.join(allowed)}")
        n = len(d) if d is not None else len(allowed)
        if self.n_clients != n:
            raise ValueError(f"RunConfig.n_clients={self.n_clients!r} must equal the number of domains ({n}: one client "
                             f"per domain, RunConfig.domains={d!r})")

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch
        return "cuda" if torch.cuda.is_available() else "cpu"

    def label(self) -> str:
        """A short human label: the fields that differ from the defaults."""
        return " ".join(f"{k}={v}" for k, v in self.changed().items()) or "defaults"


def flat_field_names() -> tuple[str, ...]:
    """Every flat field name a config, grid cell or ``--where`` filter may use."""
    return tuple(f.name for f in fields(RunConfig))


def _jsonable(d: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def from_dict(d: dict) -> RunConfig:
    """Inverse of ``to_dict`` (JSON turns tuples into lists); unknown fields are an error naming them."""
    names = {f.name for f in fields(RunConfig)}
    unknown = set(d) - names
    if unknown:
        raise ValueError(f"unknown RunConfig field(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(names))}")
    d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    return RunConfig(**d)


PROFILES = ("smoke", "quick", "paper")


def resolve_profile(profile: str | None = None) -> str:
    """The run profile: env ``FEDLIB_PROFILE`` (so CI can force 'smoke') wins, then ``profile``, then 'quick'."""
    p = os.environ.get("FEDLIB_PROFILE") or profile or "quick"
    if p not in PROFILES:
        raise ValueError(f"profile={p!r} is not one of: {', '.join(PROFILES)}")
    return p
