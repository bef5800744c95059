"""AdaFL's experiment grids: Tables 1-4, Figure 3 and our ablations, the paper's labels of a config, ``EXPERIMENTS``.

Every grid is a pure function of ``(profile, available)`` (``fedlib.data.available.Available``); it returns the base
config and the cells to expand over it, and neither trains nor reads the store, so the same profile and data give
the same runs everywhere. AdaFL's MNIST cells take the data set from the base config; the CIFAR-10 cells run where
that data is present.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedlib.config.run import RunConfig
from fedlib.papers.fedmcsa.paper import DATA as FEDMCSA_DATA

if TYPE_CHECKING:
    from fedlib.data.available import Available


# AdaFL (Sec. 3.1): MNIST, M = 100 clients of 2 shards of 300 (McMahan et al.'s non-IID split of the 60,000 training
# images; each client trains on all its 600, the official 10,000 test images test the global model), MLP 784-200-200-10,
# lr 0.01, momentum 0.5, E = 5, B = 10, alpha = 0.9, dynamic fraction 0.1 -> 0.5 in F = 5 steps, T = 1000 (Tables 1-2;
# Dyn. FedAvg "with T = 1500"; Figure 3: 500 rounds). Pixels are scaled to [0, 1] (the paper does not say how it
# preprocesses MNIST). 'quick' keeps the data and model but trains E = 1 for 100 rounds.
ABLATION = {  # label -> the cell's fields (Tables 1 and 2 of AdaFL)
    "AdaFL": {"selection": "attention", "fraction_schedule": (0.1, 0.5, 5)},
    "Attn.-0.1": {"selection": "attention", "fraction": 0.1},
    "Attn.-0.5": {"selection": "attention", "fraction": 0.5},
    "Dyn. FedAvg": {"fraction_schedule": (0.1, 0.5, 5), "rounds_factor": 1.5},
    "FedAvg-0.1": {"fraction": 0.1},
    "FedAvg-0.5": {"fraction": 0.5},
}
MNIST_BASE = RunConfig.of(
    dataset="mnist",
    partition="shards",
    n_clients=100,
    shard_size=300,
    train_frac=1.0,
    normalize="unit",
    model="mlp",
    hidden=(200, 200),
    lr=0.01,
    momentum=0.5,
    local_epochs=5,
    local_steps=None,
    batch_size=10,
    clients_per_round=None,
    eval_every=1,
)


def cells(labels: dict, rounds: int, seeds, **extra) -> list[dict]:
    """Grid cells of AdaFL labelled variants at ``rounds`` (``rounds_factor`` scales T for Dyn. FedAvg)."""
    out = []
    for fields in labels.values():
        f = dict(fields)
        t = int(round(rounds * f.pop("rounds_factor", 1)))
        out.append({**f, "rounds": t, "seed": list(seeds), **extra})
    return out


NAMES = {
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "fedmix": "FedMix",
    "naivemix": "NaiveMix",
    "scaffold": "SCAFFOLD",
    "fedmcsa": "FedMCSA",
}


def label(cfg: RunConfig) -> str:
    """The AdaFL paper's name of a config: AdaFL / Attn.-0.1 / Dyn. FedAvg / FedAvg-0.5 for FedAvg (Tables 1-2),
    AdaFL+FedProx / FedProx-0.1 ... for the others (Tables 3-4), PoC-0.1 / Dyn. PoC for Power-of-Choice's selection;
    other methods keep their registry name."""
    alg = cfg.get("algorithm")
    name = NAMES.get(alg, alg)
    attn, dyn = cfg.get("selection") == "attention", cfg.get("fraction_schedule") is not None
    frac = f"{cfg.get('fraction'):g}" if cfg.get("fraction") is not None else f"S{cfg.get('clients_per_round')}"
    if cfg.get("selection") == "power_of_choice":  # the beyond table's rows
        poc = "PoC" if alg == "fedavg" else f"PoC+{name}"
        return f"Dyn. {poc}" if dyn else f"{poc}-{frac}"
    if attn and dyn:
        return "AdaFL" if alg == "fedavg" else f"AdaFL+{name}"
    if attn:
        return f"Attn.-{frac}" if alg == "fedavg" else f"Attn.+{name}-{frac}"
    if dyn:
        return f"Dyn. {name}"
    return f"{name}-{frac}"


# CIFAR-10 cells (Sec. 3.1): IID over the 100 clients, the FedMix paper's CNN, lr 0.01 decaying by 0.99 per round.
# They run where CIFAR-10 is present; offline they are reported absent by the notebooks.
CIFAR = {"dataset": "cifar10", "partition": "iid", "model": "cnn", "hidden": None, "lr_decay": 0.99}


def _adafl(rounds, seeds, labels=ABLATION, smoke=False, cifar=True, **extra):
    base = MNIST_BASE
    if smoke:
        base = base.replace(n_clients=10, shard_size=30, local_epochs=1)
    elif rounds <= 100:
        base = base.replace(local_epochs=1)
    out = cells(labels, rounds, seeds, **extra)
    if cifar and not smoke:
        out += cells(labels, rounds, seeds, **{**extra, **CIFAR})
    return base, out


def table1(profile: str, available: "Available | None" = None):
    """Tables 1-2: the ablation (AdaFL, attention alone, dynamic fraction alone, FedAvg at 0.1 / 0.5), T = 1000."""
    rounds, seeds = {"smoke": (6, [0]), "quick": (100, [0]), "paper": (1000, [0, 1, 2])}[profile]
    return _adafl(rounds, seeds, smoke=profile == "smoke")


# Figure 3 draws 500 rounds. AdaFL's schedule depends on T, so it runs at T = 500; a constant-fraction run's first
# 500 rounds do not depend on T, so FedAvg-0.1/0.5 are Table 1's T = 1000 runs, drawn up to round 500.
# paper: the 3 trials of Table 1 (the paper's figure shows one curve per method; ours draws the mean and a band)
FIG3_LABELS = {k: ABLATION[k] for k in ("AdaFL", "FedAvg-0.1", "FedAvg-0.5")}


def fig3(profile: str, available: "Available | None" = None):
    """Figure 3: AdaFL vs FedAvg-0.1 / 0.5 on non-IID MNIST over 500 rounds."""
    rounds, seeds = {"smoke": (6, [0]), "quick": (50, [0]), "paper": (500, [0, 1, 2])}[profile]
    base, out = _adafl(rounds, seeds, FIG3_LABELS, smoke=profile == "smoke", cifar=False)
    return base, [c if "fraction_schedule" in c else {**c, "rounds": 2 * rounds} for c in out]


# Tables 3-4: AdaFL incorporated into FedProx, FedMix and SCAFFOLD, against each at constant fractions 0.1 and 0.5.
# The paper gives none of their own knobs; ours: FedProx mu = 0.01, FedMix lambda = 0.05 (FedMix's CIFAR-10 value; see
# fedlib/algorithms/fedmix.py) with means of M_k = 10 samples, the Taylor term at the public codes' batch scale,
# SCAFFOLD eta_g = 1 (option II). M_k = 10 is our choice, not FedMix's CIFAR-10 setting ("all": one mean of each
# client's data, 100 means in all here): each client sends 60 means, each closer to raw images than one mean of 600,
# so the privacy FedMix trades for accuracy is less than at its own setting; ``mix_mean_size`` >= 600 gives "all". Why
# the batch scale: with the per-sample term, as the equation reads, both FedMix runs on MNIST collapse after about 300
# rounds (to 26-93% from a best of 96.5%); at the batch scale both end steady (last-10 97.19 and 97.61, std over the
# last 100 rounds 0.56 and 0.11 points). The per-sample runs stay stored as an ablation (``fedmix_scale`` below, drawn
# in notebook 23).
COMBINED = {
    "fedprox": {"mu": 0.01},
    "fedmix": {"mix_lam": 0.05, "mix_mean_size": 10, "mix_taylor_scale": "batch"},
    "scaffold": {},
}
COMBINED_LABELS = {"AdaFL": ABLATION["AdaFL"], "-0.1": {"fraction": 0.1}, "-0.5": {"fraction": 0.5}}


def table3(profile: str, available: "Available | None" = None):
    """Tables 3-4: AdaFL + FedProx / FedMix / SCAFFOLD against each at fractions 0.1 and 0.5."""
    rounds, seeds = {"smoke": (6, [0]), "quick": (100, [0]), "paper": (1000, [0, 1, 2])}[profile]
    smoke = profile == "smoke"
    base, _ = _adafl(rounds, seeds, smoke=smoke, cifar=False)
    out = []
    for alg, knobs in COMBINED.items():
        out += cells(COMBINED_LABELS, rounds, seeds, algorithm=alg, **knobs)
        if not smoke:
            out += cells(COMBINED_LABELS, rounds, seeds, algorithm=alg, **knobs, **CIFAR)
    return base, out


# FedMix's Taylor-term scale (an ablation, not in the paper): AdaFL+FedMix and FedMix-0.1 with the term taken per
# sample, as FedMix's equation reads (mix_taylor_scale "sample"); Table 3's cells take it at the batch scale. Seed 0.
FEDMIX_SCALE_LABELS = {k: COMBINED_LABELS[k] for k in ("AdaFL", "-0.1")}


def fedmix_scale(profile: str, available: "Available | None" = None):
    """FedMix's Taylor term per sample (as its equation reads) instead of Table 3's batch scale, seed 0."""
    rounds = {"smoke": 6, "quick": 100, "paper": 1000}[profile]
    base, _ = _adafl(rounds, [0], smoke=profile == "smoke", cifar=False)
    knobs = {**COMBINED["fedmix"], "mix_taylor_scale": "sample"}
    return base, cells(FEDMIX_SCALE_LABELS, rounds, [0], algorithm="fedmix", **knobs)


# SCAFFOLD's control variates under momentum (an ablation, not in the paper): AdaFL+SCAFFOLD and SCAFFOLD-0.1 with
# option II's c_i+ taken as the clients' mean gradient, (1 - m) (x - y_i) / (K eta_l) (``control_estimate``
# "gradient"), where Table 3's cells take option II as written, the mean momentum-SGD update, ~1 / (1 - m) = 2x the
# gradient at AdaFL's m = 0.5 (``fedlib.algorithms.scaffold``). At the paper profile both run at Table 3's three seeds,
# so each pairs with its Table 3 cell seed by seed; seed 0 below it.
SCAFFOLD_CONTROL_LABELS = FEDMIX_SCALE_LABELS
SCAFFOLD_CONTROL_SEEDS = {"AdaFL": [0, 1, 2], "-0.1": [0, 1, 2]}


def scaffold_control(profile: str, available: "Available | None" = None):
    """SCAFFOLD's control variates as the clients' mean gradient (not the mean momentum update)."""
    rounds = {"smoke": 6, "quick": 100, "paper": 1000}[profile]
    base, _ = _adafl(rounds, [0], smoke=profile == "smoke", cifar=False)
    out = []
    for name, fields in SCAFFOLD_CONTROL_LABELS.items():
        seeds = SCAFFOLD_CONTROL_SEEDS[name] if profile == "paper" else [0]
        out += cells({name: fields}, rounds, seeds, algorithm="scaffold", control_estimate="gradient")
    return base, out


# Selection dynamics (not in the paper): AdaFL vs Dyn. FedAvg on the same non-IID MNIST shards, but each client keeps
# 20% of its 600 images as a local test split, so the global model's accuracy on every client is measured each round;
# and AdaFL's selection (attention + dynamic fraction over N = 20) under FedMCSA, a personalised method, in FedMCSA's
# own MNIST setting, against FedMCSA with the same schedule but uniform selection.
def dynamics(profile: str, available: "Available | None" = None):
    """Whom AdaFL's attention selects (not in the paper), with FedAvg and with FedMCSA."""
    rounds, epochs = {"smoke": (6, 1), "quick": (100, 1), "paper": (200, 5)}[profile]
    smoke = profile == "smoke"
    base, _ = _adafl(rounds, [0], smoke=smoke, cifar=False)
    base = base.replace(train_frac=0.8, local_epochs=epochs)
    shards = [
        {"selection": "attention", "fraction_schedule": (0.1, 0.5, 5), "rounds": rounds},
        {"fraction_schedule": (0.1, 0.5, 5), "rounds": rounds},
    ]
    mcsa = dict(
        FEDMCSA_DATA["mnist"],
        clients_per_round=None,
        fraction_schedule=(0.1, 0.5, 5),
        model="dnn",
        hidden=(100,),
        algorithm="fedmcsa",
        lr=0.02,
        momentum=0.0,
        batch_size=20,
        local_epochs=None,
        local_steps=20,
        train_frac=0.75,
        normalize="standardize",
        shard_size=300,
        rounds=rounds,
    )
    if smoke:
        mcsa.update(n_clients=6, local_steps=3)
    return base, shards + [{**mcsa, "selection": "attention"}, mcsa]


# Power-of-Choice (Cho, Wang and Joshi 2020) beside AdaFL's selection, at Table 1's MNIST setting (T = 1000): at
# 10% of the clients, and under AdaFL's dynamic fraction, so that it uploads exactly AdaFL's budget every round
# (sum_t gamma^(t) M); d = 2m candidates (its paper's d = 2m setting). Table 1's rows are its runs (the same keys).
# CIFAR-10 cells where the data is present.
POC = {"selection": "power_of_choice"}
BEYOND = {
    **ABLATION,
    "PoC-0.1": {**POC, "fraction": 0.1},
    "Dyn. PoC": {**POC, "fraction_schedule": (0.1, 0.5, 5)},
}


def beyond(profile: str, available: "Available | None" = None):
    """Table 1 with Power-of-Choice at AdaFL's upload budget as extra rows."""
    rounds, seeds = {"smoke": (6, [0]), "quick": (100, [0]), "paper": (1000, [0, 1, 2])}[profile]
    return _adafl(rounds, seeds, labels=BEYOND, smoke=profile == "smoke")


# The widened table's failure column: each beyond row again with 20% of every round's selected clients dropping out
# (they train and upload nothing, fedlib.core.failures). Every method aggregates, and AdaFL scores, the clients that
# did upload; the uploads counted (``uploads``) are those made, so a row here spends 8 of its 10 selections a round at
# the fraction 0.1.
DROPOUT = 0.2


def beyond_dropout(profile: str, available: "Available | None" = None):
    """The beyond table's rows with ``DROPOUT`` of each round's selected clients dropping out."""
    base, out = beyond(profile, available)
    return base, [{**c, "dropout": DROPOUT} for c in out]


EXPERIMENTS = {
    "adafl_table1": table1,
    "adafl_fig3": fig3,
    "adafl_table3": table3,
    "adafl_fedmix_scale": fedmix_scale,
    "adafl_scaffold_control": scaffold_control,
    "adafl_dynamics": dynamics,
    "adafl_beyond": beyond,
    "adafl_beyond_dropout": beyond_dropout,
}
