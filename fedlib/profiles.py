"""Named experiments at three profiles: 'smoke' (CI, seconds), 'quick' (CPU, minutes), 'paper' (the papers' settings).

A notebook asks for ``(base, grid) = profiles.get(name, profile)`` and hands them to
``run_grid``; the same presets serve scripts and papermill grids, so no notebook carries its
own hyperparameters. Each entry says which paper setting its 'paper' profile follows.
"""
from __future__ import annotations

from .config import RunConfig, resolve_profile

# Quickstart: FedAvg vs FedProx on Synthetic(0.5, 0.5), DNN 60-20-10, FedMCSA's optimiser settings
# (lr 0.02, |D| = 20, R = 20, S = 20 of N = 100). 'paper' is FedMCSA's T = 800.
_QUICKSTART_BASE = RunConfig(model="dnn", hidden=(20,))
QUICKSTART = {
    "smoke": (_QUICKSTART_BASE.replace(n_clients=10, clients_per_round=5, rounds=5, local_steps=5),
              [{"algorithm": "fedavg"}, {"algorithm": "fedprox", "mu": 0.1}]),
    "quick": (_QUICKSTART_BASE.replace(rounds=150),
              [{"algorithm": "fedavg", "seed": [0, 1]}, {"algorithm": "fedprox", "mu": 0.1, "seed": [0, 1]}]),
    "paper": (_QUICKSTART_BASE.replace(rounds=800),
              [{"algorithm": "fedavg", "seed": [0, 1, 2]}, {"algorithm": "fedprox", "mu": 0.1, "seed": [0, 1, 2]}]),
}

# FedMCSA (Sec. 5.1): lr 0.02, |D| = 20, R = 20, sigma = 50, lambda = 5, T = 800; Synthetic N = 100, S = 20, DNN
# hidden 20; MNIST/FMNIST N = 20 (2 labels per client, the pFedMe recipe, seed 1), S = 10, DNN hidden 100.
# pFedMe's own settings where FedMCSA gives none: K = 5, eta_p = 0.01, beta = 1, lambda = FedMCSA's 5.
FEDMCSA_DATA = {
    "synthetic": dict(dataset="synthetic", partition="natural", n_clients=100, clients_per_round=20),
    "mnist": dict(dataset="mnist", partition="labels", n_clients=20, clients_per_round=10, data_seed=1),
    "fmnist": dict(dataset="fmnist", partition="labels", n_clients=20, clients_per_round=10, data_seed=1),
    "cifar10": dict(dataset="cifar10", partition="labels", n_clients=20, clients_per_round=10, data_seed=1),
}
FEDMCSA_HIDDEN = {"synthetic": (20,), "mnist": (100,), "fmnist": (100,), "cifar10": (100,)}
TABLE2_ALGORITHMS = ["fedmcsa", "fedmcsa-mcsa", "fedavg", "fedavg+mcsa", "pfedme", "pfedme+mcsa", "local"]


def _fedmcsa_base(rounds: int) -> RunConfig:
    """FedMCSA's optimiser settings (Sec. 5.1) at ``rounds`` rounds."""
    return RunConfig(lr=0.02, batch_size=20, local_steps=20, rounds=rounds)


def _smoke(cells: list[dict]) -> list[dict]:
    """CI size: a few clients, a few local steps."""
    return [{**c, "n_clients": 6, "clients_per_round": 3, "local_steps": 3} for c in cells]


def _fedmcsa_cells(datasets, models, **extra) -> list[dict]:
    cells = []
    for d in datasets:
        for m in models:
            cells.append({**FEDMCSA_DATA[d], "model": m, "hidden": FEDMCSA_HIDDEN[d] if m == "dnn" else None, **extra})
    return cells


def _table2(datasets, rounds, seeds, smoke=False):
    cells = _fedmcsa_cells(datasets, ["mlr", "dnn"], algorithm=TABLE2_ALGORITHMS, seed=seeds)
    return _fedmcsa_base(rounds), _smoke(cells) if smoke else cells


FEDMCSA_TABLE2 = {
    "smoke": _table2(["synthetic"], 3, [0], smoke=True),
    "quick": _table2(["synthetic", "mnist"], 200, [0]),
    "paper": _table2(["synthetic", "mnist", "fmnist"], 800, [0, 1, 2]),
}

# Figure 5: sigma on Synthetic, MLR and DNN, everything else at the defaults; the sweep goes on to the
# local limit (sigma -> inf: each client attends only to itself) and the Local baseline is drawn beside it.
SIGMAS = [0.0, 10.0, 30.0, 50.0, 70.0, 100.0, 1000.0, 100000.0]


def _fig5(rounds, sigmas, seeds, smoke=False):
    cells = (_fedmcsa_cells(["synthetic"], ["mlr", "dnn"], algorithm="fedmcsa", sigma=sigmas, seed=seeds)
             + _fedmcsa_cells(["synthetic"], ["mlr", "dnn"], algorithm="local", seed=seeds))
    return _fedmcsa_base(rounds), _smoke(cells) if smoke else cells


FEDMCSA_SIGMA = {
    "smoke": _fig5(3, [0.0, 50.0, 100000.0], [0], smoke=True),
    "quick": _fig5(200, SIGMAS, [0]),
    "paper": _fig5(800, SIGMAS, [0]),
}

# Figures 3 (MLR) and 4 (DNN): every method "with the same hyperparameters" (lr 0.02, |D| = 20, R = 20, T = 800) on
# Synthetic and MNIST. The paper gives no values for the baselines' own knobs; ours: FedProx mu = 0.01; Per-FedAvg
# beta = 0.001 (pFedMe's README command for Per-FedAvg), alpha = lr; pFedMe as in Table 2; HeurFedAMP sigma = 50
# (FedMCSA's), xi_ii = 0.5, lambda = 5. pFedMe gives both PM and GM from one run.
FIGURE_METHODS = [{"algorithm": "fedavg"}, {"algorithm": "fedprox", "mu": 0.01},
                  {"algorithm": "perfedavg", "beta": 0.001}, {"algorithm": "pfedme"},
                  {"algorithm": "heurfedamp"}, {"algorithm": "fedmcsa"}, {"algorithm": "local"}]


def _figure(model, datasets, rounds, smoke=False):
    cells = [{**cell, **m} for cell in _fedmcsa_cells(datasets, [model]) for m in FIGURE_METHODS]
    return _fedmcsa_base(rounds), _smoke(cells) if smoke else cells


FEDMCSA_FIG3 = {"smoke": _figure("mlr", ["synthetic"], 3, True), "quick": _figure("mlr", ["synthetic", "mnist"], 200),
                "paper": _figure("mlr", ["synthetic", "mnist"], 800)}
FEDMCSA_FIG4 = {"smoke": _figure("dnn", ["synthetic"], 3, True), "quick": _figure("dnn", ["synthetic", "mnist"], 200),
                "paper": _figure("dnn", ["synthetic", "mnist"], 800)}

# Table 1 ("performance comparisons using fine-tuned hyperparameters"): |D| = 20, R = 20, T = 800 fixed, 3 runs; the
# paper names neither its grid nor how it picked the winner. Ours, stage 1 (`fedmcsa_table1_grid`, seed 0): lr in
# TABLE1_LRS for every method, crossed with one knob of each method that has one (TABLE1_KNOBS; each knob's first
# value is the one Figures 3-4 use, so those runs are reused). Stage 2 (`fedmcsa_table1`): each Table 1 row's winner
# (fedlib.tuning.select: highest sample-weighted BMTA of seed 0) with the profile's seeds. pFedMe's GM and PM rows
# pick their winners separately. CIFAR-10 cells run where its data is present.
TABLE1_LRS = [0.01, 0.02, 0.05]
TABLE1_KNOBS = {"fedavg": {}, "fedprox": {"mu": [0.01, 0.1]}, "perfedavg": {"beta": [0.001, 0.01]},
                "pfedme": {"lam": [5.0, 15.0]}, "heurfedamp": {"amp_self_weight": [0.5, 0.8]},
                "fedmcsa": {"sigma": [50.0, 1000.0]}, "local": {}}
TABLE1_SEEDS = {"smoke": [0, 1], "quick": [0, 1], "paper": [0, 1, 2]}


def _table1_grid(datasets, models, rounds, lrs, smoke=False):
    cells = [{**cell, "algorithm": alg, "lr": list(lrs), **knobs}
             for cell in _fedmcsa_cells(datasets, models) for alg, knobs in TABLE1_KNOBS.items()]
    return _fedmcsa_base(rounds), _smoke(cells) if smoke else cells


FEDMCSA_TABLE1_GRID = {
    "smoke": _table1_grid(["synthetic"], ["mlr"], 3, [0.01, 0.05], smoke=True),
    "quick": _table1_grid(["synthetic"], ["mlr"], 200, TABLE1_LRS),
    "paper": _table1_grid(["synthetic", "mnist", "fmnist", "cifar10"], ["mlr", "dnn"], 800, TABLE1_LRS),
}


def _fedmcsa_table1(profile: str):
    """Stage 2 of Table 1: every row's grid winner among the stored seed-0 runs, with the profile's seeds. A row whose
    grid is not yet complete in the store has no winner and is left out (``tuning.select`` reports it)."""
    from .runner import expand
    from .tuning import select

    base, grid = FEDMCSA_TABLE1_GRID[profile]
    grid, _ = available_cells(grid, base)
    winners, _ = select(expand(base, grid) if grid else [])
    cells = [{**w.changed(), "seed": TABLE1_SEEDS[profile]} for w in winners.values()]
    return RunConfig(), cells


# AdaFL (Sec. 3.1): MNIST, M = 100 clients of 2 shards of 300 (McMahan et al.'s non-IID split of the 60,000 training
# images; each client trains on all its 600, the official 10,000 test images test the global model), MLP 784-200-200-10,
# lr 0.01, momentum 0.5, E = 5, B = 10, alpha = 0.9, dynamic fraction 0.1 -> 0.5 in F = 5 steps, T = 1000 (Tables 1-2;
# Dyn. FedAvg "with T = 1500"; Figure 3: 500 rounds). Pixels are scaled to [0, 1] (the paper does not say how it
# preprocesses MNIST). 'quick' keeps the data and model but trains E = 1 for 100 rounds.
ADAFL_ABLATION = {  # label -> the cell's fields (Tables 1 and 2 of AdaFL)
    "AdaFL": {"selection": "attention", "fraction_schedule": (0.1, 0.5, 5)},
    "Attn.-0.1": {"selection": "attention", "fraction": 0.1},
    "Attn.-0.5": {"selection": "attention", "fraction": 0.5},
    "Dyn. FedAvg": {"fraction_schedule": (0.1, 0.5, 5), "rounds_factor": 1.5},
    "FedAvg-0.1": {"fraction": 0.1},
    "FedAvg-0.5": {"fraction": 0.5},
}
_ADAFL_MNIST = RunConfig(dataset="mnist", partition="shards", n_clients=100, shard_size=300, train_frac=1.0,
                         normalize="unit", model="mlp", hidden=(200, 200), lr=0.01, momentum=0.5, local_epochs=5,
                         local_steps=None, batch_size=10, clients_per_round=None, eval_every=1)


def adafl_cells(labels: dict, rounds: int, seeds, **extra) -> list[dict]:
    """Grid cells of AdaFL labelled variants at ``rounds`` (``rounds_factor`` scales T for Dyn. FedAvg)."""
    cells = []
    for fields in labels.values():
        f = dict(fields)
        t = int(round(rounds * f.pop("rounds_factor", 1)))
        cells.append({**f, "rounds": t, "seed": list(seeds), **extra})
    return cells


ADAFL_NAMES = {"fedavg": "FedAvg", "fedprox": "FedProx", "fedmix": "FedMix", "naivemix": "NaiveMix",
               "scaffold": "SCAFFOLD", "fedmcsa": "FedMCSA"}


def adafl_label(cfg: RunConfig) -> str:
    """The AdaFL paper's name of a config: AdaFL / Attn.-0.1 / Dyn. FedAvg / FedAvg-0.5 for FedAvg (Tables 1-2),
    AdaFL+FedProx / FedProx-0.1 ... for the others (Tables 3-4); other methods keep their registry name."""
    name = ADAFL_NAMES.get(cfg.algorithm, cfg.algorithm)
    attn, dyn = cfg.selection == "attention", cfg.fraction_schedule is not None
    frac = f"{cfg.fraction:g}" if cfg.fraction is not None else f"S{cfg.clients_per_round}"
    if attn and dyn:
        return "AdaFL" if cfg.algorithm == "fedavg" else f"AdaFL+{name}"
    if attn:
        return f"Attn.-{frac}" if cfg.algorithm == "fedavg" else f"Attn.+{name}-{frac}"
    if dyn:
        return f"Dyn. {name}"
    return f"{name}-{frac}"


# CIFAR-10 cells (Sec. 3.1): IID over the 100 clients, the FedMix paper's CNN, lr 0.01 decaying by 0.99 per round.
# They run where CIFAR-10 is present; offline they are reported absent by the notebooks.
ADAFL_CIFAR = {"dataset": "cifar10", "partition": "iid", "model": "cnn", "hidden": None, "lr_decay": 0.99}


def _adafl(rounds, seeds, labels=ADAFL_ABLATION, smoke=False, cifar=True, **extra):
    base = _ADAFL_MNIST
    if smoke:
        base = base.replace(n_clients=10, shard_size=30, local_epochs=1)
    elif rounds <= 100:
        base = base.replace(local_epochs=1)
    cells = adafl_cells(labels, rounds, seeds, **extra)
    if cifar and not smoke:
        cells += adafl_cells(labels, rounds, seeds, **{**extra, **ADAFL_CIFAR})
    return base, cells


ADAFL_TABLE1 = {"smoke": _adafl(6, [0], smoke=True), "quick": _adafl(100, [0]), "paper": _adafl(1000, [0, 1, 2])}
# Figure 3 draws 500 rounds. AdaFL's schedule depends on T, so it runs at T = 500; a constant-fraction run's first
# 500 rounds do not depend on T, so FedAvg-0.1/0.5 are Table 1's T = 1000 runs, drawn up to round 500.
FIG3_LABELS = {k: ADAFL_ABLATION[k] for k in ("AdaFL", "FedAvg-0.1", "FedAvg-0.5")}


def _fig3(rounds, seeds, smoke=False):
    base, cells = _adafl(rounds, seeds, FIG3_LABELS, smoke=smoke, cifar=False)
    return base, [c if "fraction_schedule" in c else {**c, "rounds": 2 * rounds} for c in cells]


# paper: the 3 trials of Table 1 (the paper's figure shows one curve per method; ours draws the mean and a band)
ADAFL_FIG3 = {"smoke": _fig3(6, [0], smoke=True), "quick": _fig3(50, [0]), "paper": _fig3(500, [0, 1, 2])}

# Tables 3-4: AdaFL incorporated into FedProx, FedMix and SCAFFOLD, against each at constant fractions 0.1 and 0.5.
# The paper gives none of their own knobs; ours: FedProx mu = 0.01, FedMix lambda = 0.05 with means of M_k = 10
# samples (FedMix's CIFAR-10 value; see fedlib/algorithms/fedmix.py) and the Taylor term at the public codes' batch
# scale, SCAFFOLD eta_g = 1 (option II). Why the batch scale: with the per-sample term, as the equation reads, both
# FedMix runs on MNIST collapse after about 300 rounds (to 26-93% from a best of 96.5%); at the batch scale both end
# steady (last-10 97.19 and 97.61, std over the last 100 rounds 0.56 and 0.11 points). The per-sample runs stay
# stored as an ablation (``adafl_fedmix_scale`` below, drawn in notebook 23).
ADAFL_COMBINED = {"fedprox": {"mu": 0.01}, "fedmix": {"mix_lam": 0.05, "mix_mean_size": 10, "mix_taylor_scale": "batch"},
                  "scaffold": {}}
COMBINED_LABELS = {"AdaFL": ADAFL_ABLATION["AdaFL"], "-0.1": {"fraction": 0.1}, "-0.5": {"fraction": 0.5}}


def _table3(rounds, seeds, smoke=False):
    base, _ = _adafl(rounds, seeds, smoke=smoke, cifar=False)
    cells = []
    for alg, knobs in ADAFL_COMBINED.items():
        cells += adafl_cells(COMBINED_LABELS, rounds, seeds, algorithm=alg, **knobs)
        if not smoke:
            cells += adafl_cells(COMBINED_LABELS, rounds, seeds, algorithm=alg, **knobs, **ADAFL_CIFAR)
    return base, cells


ADAFL_TABLE3 = {"smoke": _table3(6, [0], smoke=True), "quick": _table3(100, [0]), "paper": _table3(1000, [0, 1, 2])}

# FedMix's Taylor-term scale (an ablation, not in the paper): AdaFL+FedMix and FedMix-0.1 with the term taken per
# sample, as FedMix's equation reads (mix_taylor_scale "sample"); Table 3's cells take it at the batch scale. Seed 0.
FEDMIX_SCALE_LABELS = {k: COMBINED_LABELS[k] for k in ("AdaFL", "-0.1")}


def _fedmix_scale(rounds, smoke=False):
    base, _ = _adafl(rounds, [0], smoke=smoke, cifar=False)
    knobs = {**ADAFL_COMBINED["fedmix"], "mix_taylor_scale": "sample"}
    return base, adafl_cells(FEDMIX_SCALE_LABELS, rounds, [0], algorithm="fedmix", **knobs)


ADAFL_FEDMIX_SCALE = {"smoke": _fedmix_scale(6, smoke=True), "quick": _fedmix_scale(100),
                      "paper": _fedmix_scale(1000)}

# Selection dynamics (not in the paper): AdaFL vs Dyn. FedAvg on the same non-IID MNIST shards, but each client keeps
# 20% of its 600 images as a local test split, so the global model's accuracy on every client is measured each round;
# and AdaFL's selection (attention + dynamic fraction over N = 20) under FedMCSA, a personalised method, in FedMCSA's
# own MNIST setting, against FedMCSA with the same schedule but uniform selection.
def _dynamics(rounds, epochs, smoke=False):
    base, _ = _adafl(rounds, [0], smoke=smoke, cifar=False)
    base = base.replace(train_frac=0.8, local_epochs=epochs)
    shards = [{"selection": "attention", "fraction_schedule": (0.1, 0.5, 5), "rounds": rounds},
              {"fraction_schedule": (0.1, 0.5, 5), "rounds": rounds}]
    mcsa = dict(FEDMCSA_DATA["mnist"], clients_per_round=None, fraction_schedule=(0.1, 0.5, 5), model="dnn",
                hidden=(100,), algorithm="fedmcsa", lr=0.02, momentum=0.0, batch_size=20, local_epochs=None,
                local_steps=20, train_frac=0.75, normalize="standardize", shard_size=300, rounds=rounds)
    if smoke:
        mcsa.update(n_clients=6, local_steps=3)
    cells = shards + [{**mcsa, "selection": "attention"}, mcsa]
    return base, cells


ADAFL_DYNAMICS = {"smoke": _dynamics(6, 1, smoke=True), "quick": _dynamics(100, 1), "paper": _dynamics(200, 5)}

# pFedLA (Sec. 4.1 and Appendix): digits, one client per domain (FedBN's protocol: 743 training images each, 28x28x3),
# LeNet with BN (Table 7), SGD lr 0.01, T = 100, E = 1, all clients every round. The paper gives no batch size nor the
# baselines' knobs; ours: B = 32 (FedBN's code), FedProx mu = 0.01 (FedBN's code), pFedMe lambda = 15, eta_p = 0.01,
# K = 5 (pFedMe's defaults), Ditto lambda = 0.1. Offline only MNIST, USPS and MNIST-M exist: the grid then runs on
# those three and says so; with SVHN and SynthDigits present it is the paper's five-domain setting. The paper profile
# evaluates every 10 rounds (and at T): the three test sets hold 21,008 images, and testing every round would cost
# about three times the training.
PFEDLA_METHODS = {"fedavg": {}, "fedprox": {"mu": 0.01}, "fedbn": {}, "pfedme": {"lam": 15.0, "inner_steps": 5},
                  "ditto": {"lam": 0.1}}
PFEDLA_ATTENTIONS = ["none", "se", "eca", "ca", "hybrid"]
DIGITS5 = ("mnist", "svhn", "usps", "synthdigits", "mnist_m")


def digits_domains() -> tuple:
    """The paper's five digit domains when all are present, else the present ones (offline: MNIST, USPS, MNIST-M)."""
    from .data.domains import digits_available
    present = digits_available()
    return DIGITS5 if set(DIGITS5) <= set(present) else tuple(d for d in DIGITS5 if d in present)


def _pfedla_base(domains: tuple, rounds: int) -> RunConfig:
    return RunConfig(dataset="digits", partition="domains", domains=domains, n_clients=max(1, len(domains)),
                     model="lenet", lr=0.01, local_epochs=1, local_steps=None, batch_size=32, clients_per_round=None,
                     rounds=rounds)


def _method_cells(methods, attentions, seeds, extra, **data) -> list[dict]:
    """pFedLA's Table 1/3 grid: every method (with its knobs, ``PFEDLA_METHODS``) x every attention kind."""
    return [{**data, "algorithm": m, **PFEDLA_METHODS[m], "attention": attentions, "seed": seeds, **extra}
            for m in methods]


def _fig4_cells(seeds, extra, percents, **data) -> list[dict]:
    """pFedLA Figure 4's grid: (a) FedBN x attention type, (b) FedProx without attention and with local / non-local
    SE, (c) FedBN and FedBN+SE over the local data sizes ``percents``. (c) leaves out the default size (digits 10%,
    Office 100%): those runs are (a)'s, not repeated under another key."""
    return [{**data, "algorithm": "fedbn", "attention": PFEDLA_ATTENTIONS, "seed": seeds, **extra},
            {**data, "algorithm": "fedprox", "mu": 0.01, "attention": "se", "attention_local": [True, False],
             "seed": seeds, **extra},
            {**data, "algorithm": "fedprox", "mu": 0.01, "seed": seeds, **extra},
            {**data, "algorithm": "fedbn", "attention": ["none", "se"], "seed": seeds, **extra, "domain_percent": percents}]


# The pFedLA grids are functions of the profile, evaluated when asked for: they depend on which domains are present.
def _pfedla_table1(profile: str):
    doms = digits_domains()
    rounds, seeds, methods, attns, extra = {
        "smoke": (2, [0], ["fedavg", "fedbn", "ditto"], ["none", "se", "hybrid"], {"domain_percent": 0.02}),
        "quick": (30, [0], list(PFEDLA_METHODS), PFEDLA_ATTENTIONS, {"eval_every": 5}),
        "paper": (100, [0, 1, 2, 3, 4], list(PFEDLA_METHODS), PFEDLA_ATTENTIONS, {"eval_every": 10}),
    }[profile]
    return _pfedla_base(doms, rounds), (_method_cells(methods, attns, seeds, extra) if len(doms) >= 2 else [])


def _pfedla_fig4(profile: str):
    """Figure 4 on the digits substitute (the smoke profile's default size is 2%, so its (c) adds 4%)."""
    doms = digits_domains()
    rounds, seeds, percents, extra = {"smoke": (2, [0], [0.02, 0.04], {"domain_percent": 0.02}),
                                      "quick": (30, [0], [0.3], {"eval_every": 5}),
                                      "paper": (100, [0, 1, 2], [0.2, 0.4, 0.6, 0.8, 1.0], {"eval_every": 10})}[profile]
    return _pfedla_base(doms, rounds), (_fig4_cells(seeds, extra, percents) if len(doms) >= 2 else [])

# pFedLA on Office-31, Office-Home, DomainNet (Sec. 4.2, Appendix): AlexNet with BN (Table 8), SGD lr 0.01, T = 200,
# E = 1, every domain's full training split (domain_percent None = 100%), batch 32 (ours; the paper gives none).
# Cells exist only for the data sets present (all their domains), so offline both grids are empty.
OFFICE_SETS = ("office31", "officehome", "domainnet")


def _office_cells(profile: str):
    from .data.domains import DOMAINS, available
    present = available()
    rounds, seeds, extra = {"smoke": (1, [0], {"domain_percent": 0.05}), "quick": (10, [0], {"eval_every": 5}),
                            "paper": (200, [0, 1, 2], {"eval_every": 10})}[profile]
    sets = [d for d in OFFICE_SETS if present[d] and set(DOMAINS[d]) <= set(present[d])]
    base = RunConfig(dataset="office31", partition="domains", n_clients=3, model="alexnet", lr=0.01, local_epochs=1,
                     local_steps=None, batch_size=32, clients_per_round=None, rounds=rounds)
    data = lambda d: {"dataset": d, "n_clients": len(DOMAINS[d])}
    return base, sets, seeds, extra, data


def _pfedla_office_table3(profile: str):
    base, sets, seeds, extra, data = _office_cells(profile)
    return base, [c for d in sets for c in _method_cells(list(PFEDLA_METHODS), PFEDLA_ATTENTIONS, seeds, extra, **data(d))]


def _pfedla_office_fig4(profile: str):
    """Figure 4 on Office-31, data size 10%-80% beside (a)'s 100%."""
    base, sets, seeds, extra, data = _office_cells(profile)
    if "office31" not in sets:
        return base, []
    percents = {"smoke": [0.1], "quick": [0.3], "paper": [0.1, 0.2, 0.4, 0.6, 0.8]}[profile]
    return base, _fig4_cells(seeds, extra, percents, **data("office31"))


EXPERIMENTS = {"quickstart": QUICKSTART, "fedmcsa_fig3": FEDMCSA_FIG3, "fedmcsa_fig4": FEDMCSA_FIG4,
               "fedmcsa_table1_grid": FEDMCSA_TABLE1_GRID, "fedmcsa_table1": _fedmcsa_table1,
               "fedmcsa_table2": FEDMCSA_TABLE2, "fedmcsa_sigma": FEDMCSA_SIGMA,
               "adafl_table1": ADAFL_TABLE1, "adafl_fig3": ADAFL_FIG3, "adafl_table3": ADAFL_TABLE3,
               "adafl_fedmix_scale": ADAFL_FEDMIX_SCALE,
               "adafl_dynamics": ADAFL_DYNAMICS, "pfedla_table1": _pfedla_table1, "pfedla_fig4": _pfedla_fig4,
               "pfedla_office_table3": _pfedla_office_table3, "pfedla_office_fig4": _pfedla_office_fig4}


def available_cells(grid: list[dict], base: RunConfig) -> tuple[list[dict], list[str]]:
    """The grid cells whose data set is present, and the names of the absent data sets. A cell that names no data
    set uses ``base``'s (AdaFL's cells take MNIST from the base config), and a cell that names no domains uses
    ``base``'s domains (pFedLA's digits cells run on the domains present, which ``base`` lists)."""
    from .data import domains, readers
    keep, missing = [], set()
    present = None
    for cell in grid:
        d = cell.get("dataset", base.dataset)
        if d in domains.DOMAINS:
            present = present if present is not None else domains.available()
            doms = cell.get("domains", base.domains if d == base.dataset else None) or domains.DOMAINS[d]
            if set(doms) <= set(present[d]) and present[d]:
                keep.append(cell)
            else:
                missing.add(d)
        elif d == "synthetic" or readers.available(d):
            keep.append(cell)
        else:
            missing.add(d)
    return keep, sorted(missing)


def get(name: str, profile: str | None = None) -> tuple[RunConfig, list[dict]]:
    """(base config, grid) of experiment ``name`` at ``profile`` (env FEDLIB_PROFILE wins, default 'quick')."""
    if name not in EXPERIMENTS:
        raise ValueError(f"experiment={name!r} is not one of: {', '.join(EXPERIMENTS)}")
    entry, profile = EXPERIMENTS[name], resolve_profile(profile)
    return entry(profile) if callable(entry) else entry[profile]
