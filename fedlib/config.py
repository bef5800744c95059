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

DATASETS = ("synthetic", "mnist", "fmnist", "cifar10")
PARTITIONS = {  # which partitions make sense for which data sets
    "synthetic": ("natural",),
    "mnist": ("labels", "shards", "iid", "dirichlet"),
    "fmnist": ("labels", "shards", "iid", "dirichlet"),
    "cifar10": ("labels", "shards", "iid", "dirichlet"),
}
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float32", "float64")
EXECUTORS = ("auto", "stacked", "loop")
NORMALIZE = ("standardize", "unit")
ALGORITHM_FIELDS = ("mu", "sigma", "lam", "amp_self_weight", "mcsa_code", "beta", "personal_lr", "inner_steps", "hf_delta")


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
    # -- model -----------------------------------------------------------------------------
    model: str = "mlr"                  # mlr | dnn | mlp (see fedlib.models.MODELS)
    hidden: tuple | None = None         # hidden sizes; None = the model's default
    # -- algorithm -------------------------------------------------------------------------
    algorithm: str = "fedavg"           # see fedlib.algorithms.ALGORITHMS
    rounds: int = 100                   # T communication rounds
    clients_per_round: int | None = 20  # S clients uploading per round (None with fraction=None: all)
    fraction: float | None = None       # C (instead of clients_per_round)
    local_steps: int | None = 20        # R local steps per round (fixed-step training)
    local_epochs: int | None = None     # E local epochs (epoch-based training; overrides local_steps)
    batch_size: int = 20                # |D| / B
    lr: float = 0.02                    # eta
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
    # -- execution -------------------------------------------------------------------------
    seed: int = 0                       # model init, client sampling, mini-batches
    executor: str = "auto"              # auto | stacked | loop
    device: str = "auto"                # auto | cpu | cuda
    dtype: str = "float32"              # float32 | float64
    eval_every: int = 1                 # evaluate every k rounds (and always at the last)
    eval_train: bool = False            # also compute training loss/accuracy

    def replace(self, **changes) -> "RunConfig":
        return dataclasses.replace(self, **changes)

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
        from .models import MODELS

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
        for name in ("n_clients", "rounds", "batch_size", "eval_every", "labels_per_client", "shard_size", "inner_steps"):
            at_least(name, 1)
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"RunConfig.{name}={getattr(self, name)!r} must be an integer")
        at_least("clients_per_round", 1, none_ok=True)
        at_least("local_steps", 1, none_ok=True)
        at_least("local_epochs", 1, none_ok=True)
        for name in ("lr", "synthetic_alpha", "synthetic_beta", "momentum", "weight_decay", "mu", "dirichlet_alpha",
                     "sigma", "lam", "amp_self_weight", "beta", "personal_lr", "hf_delta"):
            at_least(name, 0)
        if self.amp_self_weight > 1:
            raise ValueError(f"RunConfig.amp_self_weight={self.amp_self_weight!r} must be in [0, 1]")
        if self.lr <= 0:
            raise ValueError(f"RunConfig.lr={self.lr!r} must be > 0")
        if self.momentum >= 1:
            raise ValueError(f"RunConfig.momentum={self.momentum!r} must be in [0, 1)")
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
        if self.hidden is not None and (not isinstance(self.hidden, tuple) or not all(isinstance(h, int) and h > 0 for h in self.hidden)):
            raise ValueError(f"RunConfig.hidden={self.hidden!r} must be None or a tuple of positive ints")
        # an algorithm-specific field set for an algorithm that ignores it is almost always a mistake
        unused = {k for k in self.changed() if k in ALGORITHM_FIELDS} - set(ALGORITHMS[self.algorithm].USES)
        if unused:
            raise ValueError(f"RunConfig: {', '.join(sorted(unused))} set but algorithm={self.algorithm!r} does not use it")
        return self

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch
        return "cuda" if torch.cuda.is_available() else "cpu"

    def label(self) -> str:
        """A short human label: the fields that differ from the defaults."""
        return " ".join(f"{k}={v}" for k, v in self.changed().items()) or "defaults"


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
