"""FedMCSA's experiment grids: Tables 1-2, Figures 3-5 and our readings of the method, ``EXPERIMENTS`` and ``STEPS``.

Every grid is a pure function of ``(profile, available)``: the profile ('smoke' | 'quick' | 'paper') and which data
sets are present (``fedlib.data.available.Available``); it returns the base config and the cells to expand over it.
Nothing here trains or reads the store, so listing an experiment's runs costs nothing and gives the same runs
wherever the same data is present. Table 1's second stage takes its winners explicitly (``tuning.table1_winners``
reads them from the stored first-stage runs, ``table1`` turns them into a grid), so no grid depends on what is in
the store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedlib.config.run import RunConfig
from fedlib.papers.fedmcsa.paper import DATA, FEDMCSA_PARTITION, HIDDEN, base
from fedlib.papers.fedmcsa.tuning import TABLE1_KNOBS, TABLE1_LRS, table1_winners

if TYPE_CHECKING:
    from fedlib.data.available import Available


TABLE2_ALGORITHMS = ["fedmcsa", "fedmcsa-mcsa", "fedavg", "fedavg+mcsa", "pfedme", "pfedme+mcsa", "local"]


def _smoke(cells: list[dict]) -> list[dict]:
    """CI size: a few clients, a few local steps."""
    return [{**c, "n_clients": 6, "clients_per_round": 3, "local_steps": 3} for c in cells]


def cells(datasets, models, **extra) -> list[dict]:
    """Grid cells of FedMCSA's data settings (``DATA``) x models, the DNN at the paper's width per data set."""
    out = []
    for d in datasets:
        for m in models:
            out.append({**DATA[d], "model": m, "hidden": HIDDEN[d] if m == "dnn" else None, **extra})
    return out


def _sized(profile: str, rounds: int, cells_: list[dict]) -> tuple[RunConfig, list[dict]]:
    return base(rounds), _smoke(cells_) if profile == "smoke" else cells_


# (data sets, rounds, seeds) of Table 2's grid at each profile; CIFAR-10 where its data is present
TABLE2_GRID = {
    "smoke": (["synthetic"], 3, [0]),
    "quick": (["synthetic", "mnist"], 200, [0]),
    "paper": (["synthetic", "mnist", "fmnist", "cifar10"], 800, [0, 1, 2]),
}


def table2(profile: str, available: "Available | None" = None):
    """Table 2 (ablations: MCSA on/off for FedMCSA, FedAvg, pFedMe) + our Local baseline."""
    datasets, rounds, seeds = TABLE2_GRID[profile]
    return _sized(profile, rounds, cells(datasets, ["mlr", "dnn"], algorithm=TABLE2_ALGORITHMS, seed=seeds))


# Figure 5: sigma on Synthetic, MLR and DNN, everything else at the defaults; the sweep goes on to the
# local limit (sigma -> inf: each client attends only to itself) and the Local baseline is drawn beside it.
SIGMAS = [0.0, 10.0, 30.0, 50.0, 70.0, 100.0, 1000.0, 100000.0]


def sigma(profile: str, available: "Available | None" = None):
    """Figure 5 (effect of sigma), extended to the local limit, with the Local baseline."""
    rounds, sigmas = {"smoke": (3, [0.0, 50.0, 100000.0]), "quick": (200, SIGMAS), "paper": (800, SIGMAS)}[profile]
    c = cells(["synthetic"], ["mlr", "dnn"], algorithm="fedmcsa", sigma=sigmas, seed=[0]) + cells(
        ["synthetic"], ["mlr", "dnn"], algorithm="local", seed=[0]
    )
    return _sized(profile, rounds, c)


# Figures 3 (MLR) and 4 (DNN): every method "with the same hyperparameters" (lr 0.02, |D| = 20, R = 20, T = 800) on
# Synthetic and MNIST. The paper gives no values for the baselines' own knobs; ours: FedProx mu = 0.01; Per-FedAvg
# beta = 0.001 (pFedMe's README command for Per-FedAvg), alpha = lr; pFedMe as in Table 2; HeurFedAMP sigma = 50
# (FedMCSA's), xi_ii = 0.5, lambda = 5. pFedMe gives both PM and GM from one run.
FIGURE_METHODS = [
    {"algorithm": "fedavg"},
    {"algorithm": "fedprox", "mu": 0.01},
    {"algorithm": "perfedavg", "beta": 0.001},
    {"algorithm": "pfedme"},
    {"algorithm": "heurfedamp"},
    {"algorithm": "fedmcsa"},
    {"algorithm": "local"},
]


FIGURE_DATASETS = {"smoke": ["synthetic"], "quick": ["synthetic", "mnist"], "paper": ["synthetic", "mnist"]}
FIGURE_ROUNDS = {"smoke": 3, "quick": 200, "paper": 800}


def _figure(model: str, profile: str, datasets: list | None = None, **extra):
    """Every method of ``FIGURE_METHODS`` on ``datasets`` (default: the profile's) with the figures' rounds, and
    ``extra`` fields in every cell (FedMCSA's partition)."""
    datasets = FIGURE_DATASETS[profile] if datasets is None else datasets
    c = [{**cell, **m, **extra} for cell in cells(datasets, [model]) for m in FIGURE_METHODS]
    return _sized(profile, FIGURE_ROUNDS[profile], c)


def fig3(profile: str, available: "Available | None" = None):
    """Figure 3: every method on MLR, Synthetic and MNIST."""
    return _figure("mlr", profile)


def fig4(profile: str, available: "Available | None" = None):
    """Figure 4: every method on the DNN, Synthetic and MNIST."""
    return _figure("dnn", profile)


def fig3_partition(profile: str, available: "Available | None" = None):
    """Figure 3's MNIST panel once more on FedMCSA's own partition (``FEDMCSA_PARTITION``, client u holds the labels
    (2u + j) mod 10): every method of ``FIGURE_METHODS``, their setting, seed 0. Where a method's setting is Table
    2's, the run is ``table2_partition``'s (the same key)."""
    return _figure("mlr", profile, ["mnist"], **FEDMCSA_PARTITION)


def fig4_partition(profile: str, available: "Available | None" = None):
    """Figure 4's MNIST panel on FedMCSA's own partition (as ``fig3_partition``, with the DNN)."""
    return _figure("dnn", profile, ["mnist"], **FEDMCSA_PARTITION)


# Table 1 ("performance comparisons using fine-tuned hyperparameters"): |D| = 20, R = 20, T = 800 fixed, 3 runs; the
# paper names neither its grid nor how it picked the winner. Ours, stage 1 (`fedmcsa_table1_grid`, seed 0): lr in
# TABLE1_LRS for every method, crossed with one knob of each method that has one (TABLE1_KNOBS; each knob's first
# value is the one Figures 3-4 use, so those runs are reused). Between the stages, an explicit step picks each Table 1
# row's winner from the stored stage-1 runs (``table1_winners``: highest sample-weighted BMTA of seed 0); stage 2
# (`fedmcsa_table1`, ``table1``) runs those winners with the profile's seeds. pFedMe's GM and PM rows pick their
# winners separately. CIFAR-10 cells run where its data is present.


TABLE1_SEEDS = {"smoke": [0, 1], "quick": [0, 1], "paper": [0, 1, 2]}


def table1_grid(profile: str, available: "Available | None" = None):
    """Stage 1 of Table 1: the stated grid, seed 0."""
    datasets, models, rounds, lrs = {
        "smoke": (["synthetic"], ["mlr"], 3, [0.01, 0.05]),
        "quick": (["synthetic"], ["mlr"], 200, TABLE1_LRS),
        "paper": (["synthetic", "mnist", "fmnist", "cifar10"], ["mlr", "dnn"], 800, TABLE1_LRS),
    }[profile]
    c = [
        {**cell, "algorithm": alg, "lr": list(lrs), **knobs}
        for cell in cells(datasets, models)
        for alg, knobs in TABLE1_KNOBS.items()
    ]
    return _sized(profile, rounds, c)


def table1(profile: str, available: "Available | None" = None, *, winners: dict):
    """Stage 2 of Table 1: every row's winner (``table1_winners``) with the profile's seeds."""
    return RunConfig.of(), [{**w.changed(), "seed": TABLE1_SEEDS[profile]} for w in winners.values()]


def partition_winners(winners: dict) -> dict:
    """Table 1's image rows (``table1_winners``, picked on pFedMe's partition) on FedMCSA's own partition
    (``FEDMCSA_PARTITION``), ``{(dataset, model, row): RunConfig}``. Synthetic has no label partition: its rows are
    left out. The winners are not picked again on that partition (a second 36-run grid per image cell, 144 runs):
    the setting each method was tuned to is held, and only the partition changes."""
    return {k: w.replace(**FEDMCSA_PARTITION) for k, w in winners.items() if w.get("dataset") != "synthetic"}


def table1_partition(profile: str, available: "Available | None" = None, *, winners: dict):
    """Table 1's image cells once more on FedMCSA's own partition: every image row's winner (``partition_winners``)
    with the profile's seeds. Where a winner's setting is Table 2's, the run is ``table2_partition``'s (same key)."""
    return table1(profile, available, winners=partition_winners(winners))


# Both readings of FedMCSA (not in the paper): on Synthetic, the paper's equations (prox lambda toward the received
# personalised model, plain attention) beside the authors' code (``mcsa_code``: no effective prox, attention rows
# reweighted by the sampled clients' data sizes), at Table 2's setting (sigma 50) and the code's default sigma 1000,
# the paper's Table 2 rows FedMCSA / FedMCSA^-MCSA, and Figure 5's sigma sweep. The two switches apart, a 2x2 at
# sigma 50: anchor on / reweighting off (the paper), anchor off alone (``lam=0``), reweighting alone with the anchor on
# (``by_data_size``), both (``mcsa_code``). FedMCSA^-MCSA's code row drops the prox only (``mcsa_code`` keeps its
# mean equal-weight there); with ``by_data_size`` its mean is data-size weighted, as the pFedMe code base averages.
# Table 2's other two Synthetic rows with FedMCSA's attention, FedAvg^+MCSA and pFedMe^+MCSA, get their code reading
# too: their clients have no anchor of FedMCSA's kind (FedAvg's: plain SGD; pFedMe's: its own Moreau envelope, which
# the code keeps), so it is the reweighting alone (``by_data_size``); their paper's-equations runs are Table 2's.
# Local is the yardstick. The paper's equations once more with its text's model component, each layer (weight and bias
# together; ``component='layer'``), where every other run attends over each tensor as the authors' code does.
READINGS = [
    {"algorithm": "fedmcsa"},  # the paper's equations (Table 2's cell): anchor on, reweighting off
    {"algorithm": "fedmcsa", "component": "layer"},  # ... with a layer, not a tensor, as the component (its text)
    {"algorithm": "fedmcsa", "lam": 0.0},  # anchor off, reweighting off
    {"algorithm": "fedmcsa", "by_data_size": True},  # anchor on, reweighting on
    {"algorithm": "fedmcsa", "mcsa_code": True},  # anchor off, reweighting on (the authors' code)
    {"algorithm": "fedmcsa", "mcsa_code": True, "sigma": 1000.0},  # ... at the code's default sigma
    {"algorithm": "fedmcsa-mcsa", "mcsa_code": True},  # Table 2's FedMCSA^-MCSA row, prox off, equal-weight mean
    {"algorithm": "fedmcsa-mcsa", "mcsa_code": True, "by_data_size": True},  # ... with the data-weighted mean
    {"algorithm": "fedmcsa-mcsa"},
    {"algorithm": "fedavg+mcsa"},  # Table 2's FedAvg^+MCSA cell: the paper's attention
    {"algorithm": "fedavg+mcsa", "by_data_size": True},  # ... as in the authors' code: rows reweighted by data size
    {"algorithm": "pfedme+mcsa"},  # Table 2's pFedMe^+MCSA cell
    {"algorithm": "pfedme+mcsa", "by_data_size": True},  # ... as in the authors' code
    {"algorithm": "local"},
]


def readings(profile: str, available: "Available | None" = None):
    """Both readings of FedMCSA on Synthetic (Tables 1-2 cells, 3 seeds) and Figure 5's sweep as in the code."""
    rounds, seeds, sigmas = {
        "smoke": (3, [0], [0.0, 100000.0]),
        "quick": (200, [0], SIGMAS),
        "paper": (800, [0, 1, 2], SIGMAS),
    }[profile]
    c = [{**cell, **r, "seed": seeds} for cell in cells(["synthetic"], ["mlr", "dnn"]) for r in READINGS]
    c += cells(["synthetic"], ["mlr", "dnn"], algorithm="fedmcsa", mcsa_code=True, sigma=sigmas, seed=[0])
    return _sized(profile, rounds, c)


# The readings on the image data of Table 2 (MNIST, FMNIST; CIFAR-10 where present): FedMCSA's rows only (the 2x2 of
# the code's two switches, the text's per-layer component, the code at its default sigma) and Local. Their paper's-
# equations and Local cells are Table 2's runs (the same keys). Then the paper's equations, the code and Local once
# more on the partition of FedMCSA's own copy of the pFedMe script: client u holds the labels (2u + j) mod 10
# (``label_stride=2``), where pFedMe's, ours everywhere else, has (u + j) mod 10.
READINGS_IMAGES = [r for r in READINGS if r["algorithm"] in ("fedmcsa", "local")]
# (data sets, rounds, seeds) of the image grids at each profile: Table 2's, CIFAR-10 where its data is present
IMAGE_GRID = {
    "smoke": (["mnist"], 3, [0]),
    "quick": (["mnist"], 200, [0]),
    "paper": (["mnist", "fmnist", "cifar10"], 800, [0, 1, 2]),
}


READINGS_PARTITION = [{"algorithm": "fedmcsa"}, {"algorithm": "fedmcsa", "mcsa_code": True}, {"algorithm": "local"}]


def readings_images(profile: str, available: "Available | None" = None):
    """FedMCSA's readings (the 2x2 of the authors' code's switches, per layer, the code at sigma 1000) and Local on
    Table 2's image data, at Table 2's setting (N = 20, S = 10, 2 labels per client); the paper's equations, the code
    and Local also on FedMCSA's own partition (``FEDMCSA_PARTITION``)."""
    datasets, rounds, seeds = IMAGE_GRID[profile]
    c = [{**cell, **r, "seed": seeds} for cell in cells(datasets, ["mlr", "dnn"]) for r in READINGS_IMAGES]
    c += [
        {**cell, **r, **FEDMCSA_PARTITION, "seed": seeds}
        for cell in cells(datasets, ["mlr", "dnn"])
        for r in READINGS_PARTITION
    ]
    return _sized(profile, rounds, c)


def table2_partition(profile: str, available: "Available | None" = None):
    """Table 2's image cells (every method, Local too) once more on FedMCSA's own partition (``FEDMCSA_PARTITION``:
    client u holds the labels (2u + j) mod 10); FedMCSA's and Local's runs are ``readings_images``' (the same keys)."""
    datasets, rounds, seeds = IMAGE_GRID[profile]
    c = cells(datasets, ["mlr", "dnn"], algorithm=TABLE2_ALGORITHMS, seed=seeds, **FEDMCSA_PARTITION)
    return _sized(profile, rounds, c)


# Which model Table 2's FedMCSA^-MCSA row evaluates. The paper's numbers for that row sit at FedAvg's in every column
# (a global model's), where Algorithm 1 evaluates the clients' trained models Theta_i, as ours does (12-14 points
# above the paper on FMNIST). Table 2's FedMCSA^-MCSA runs once more with ``report_mean``: the same training (Table 2's
# Theta_i, equal up to the last bits of float32 rounding), and the mean the server sends evaluated beside them every
# round (the ``gm_*`` columns); the image cells on both partitions (``FEDMCSA_PARTITION`` too). Both readings: the
# paper's equations (Table 2's runs) and the authors' code's (no prox, the data-size weighted mean the pFedMe code base
# averages by), whose evaluation of the mean would be that code base's ``evaluate()`` of the server's model.
MINUS_MEAN = [
    {"algorithm": "fedmcsa-mcsa", "report_mean": True},
    {"algorithm": "fedmcsa-mcsa", "report_mean": True, "mcsa_code": True, "by_data_size": True},
]


def table2_mean(profile: str, available: "Available | None" = None):
    """Table 2's FedMCSA^-MCSA row, in both readings, with the mean the server sends evaluated too (``MINUS_MEAN``),
    on Table 2's data; the image cells also on FedMCSA's own partition."""
    datasets, rounds, seeds = TABLE2_GRID[profile]
    images = IMAGE_GRID[profile][0]
    c = [{**cell, **r, "seed": seeds} for cell in cells(datasets, ["mlr", "dnn"]) for r in MINUS_MEAN]
    c += [
        {**cell, **r, **FEDMCSA_PARTITION, "seed": seeds} for cell in cells(images, ["mlr", "dnn"]) for r in MINUS_MEAN
    ]
    return _sized(profile, rounds, c)


# The field's baselines beside FedMCSA, in Table 2's six columns (Synthetic, MNIST, FMNIST x MLR, DNN) at Table 2's
# setting (FedMCSA's shared optimiser settings, Sec. 5.1), each new method at its own paper's defaults. Table 2's own
# rows (FedMCSA, FedAvg, pFedMe, Local) are its runs (the same keys). A split-model method needs a body below its
# head, which MLR has not: those run on the DNN only. ``beyond_val``: the same table under the validation protocol
# (10% of each client's training rows held out; test accuracy at the round best on validation), every row retrained.
BEYOND_PAPER = ["fedmcsa", "fedavg", "pfedme", "local"]
BEYOND_SPLIT = ["fedper", "fedrep", "lgfedavg", "fedbabu", "fedrod"]
BEYOND_MIXING = ["apfl", "fedala", "fedfomo", "fedamp", "ditto", "feddyn", "fednova"]
BEYOND_VAL_FRAC = 0.1


def _beyond_cells(datasets, seeds, **extra) -> list[dict]:
    return cells(datasets, ["mlr", "dnn"], algorithm=BEYOND_PAPER + BEYOND_MIXING, seed=seeds, **extra) + cells(
        datasets, ["dnn"], algorithm=BEYOND_SPLIT, seed=seeds, **extra
    )


def beyond(profile: str, available: "Available | None" = None):
    """Table 2's columns with the field's personalised and drift-correcting baselines as extra rows."""
    datasets, rounds, seeds = TABLE2_GRID[profile]
    return _sized(profile, rounds, _beyond_cells([d for d in datasets if d != "cifar10"], seeds))


def beyond_val(profile: str, available: "Available | None" = None):
    """``beyond`` under the validation protocol (``val_frac``): the round is chosen on validation, not on test."""
    datasets, rounds, seeds = TABLE2_GRID[profile]
    data = [d for d in datasets if d != "cifar10"]
    return _sized(profile, rounds, _beyond_cells(data, seeds, val_frac=BEYOND_VAL_FRAC))


# Table 2's pFedMe rows as the authors' code scores them (the deviation register, docs/deviations.md): its
# "personalised" accuracy tests the local models w_i (``personal_eval='local'``) where the paper's PM is theta_i.
# Only what is scored changes, so each switched run trains its default's models; notebook 13 sets the two readings
# side by side, paired by seed.
CODE_EVAL = {"pfedme": {"personal_eval": "local"}, "pfedme+mcsa": {"personal_eval": "local"}}


def table2_code_eval(profile: str, available: "Available | None" = None):
    """Table 2's pFedMe and pFedMe^+MCSA cells with the authors' code's evaluation switch (``CODE_EVAL``)."""
    datasets, rounds, seeds = TABLE2_GRID[profile]
    out = [c for alg, sw in CODE_EVAL.items() for c in cells(datasets, ["mlr", "dnn"], algorithm=alg, seed=seeds, **sw)]
    return _sized(profile, rounds, out)


# Table 1's pFedMe (PM) and Per-FedAvg rows as the authors' code scores them: pFedMe's PM tests w_i
# (``personal_eval='local'``), Per-FedAvg adapts with two steps on test batches (``adapt_eval='code'``). Each switch
# goes on the row's winner as the paper's scoring picked it: only what is scored changes, so the tuning is not redone
# and each switched run trains its winner's models, paired with it by seed in notebook 12.
TABLE1_CODE_EVAL = {"pfedme": CODE_EVAL["pfedme"], "perfedavg": {"adapt_eval": "code"}}


def code_eval_winners(winners: dict) -> dict:
    """The Table 1 rows of ``winners`` (``table1_winners``) that have a code switch (``TABLE1_CODE_EVAL``), each with
    its switch on, ``{(dataset, model, row): RunConfig}``."""
    return {k: w.replace(**TABLE1_CODE_EVAL[k[2]]) for k, w in winners.items() if k[2] in TABLE1_CODE_EVAL}


def table1_code_eval(profile: str, available: "Available | None" = None, *, winners: dict):
    """Table 1's pFedMe (PM) and Per-FedAvg winners with the authors' code's evaluation switches, the profile's
    seeds."""
    return table1(profile, available, winners=code_eval_winners(winners))


EXPERIMENTS = {
    "fedmcsa_readings": readings,
    "fedmcsa_readings_images": readings_images,
    "fedmcsa_fig3": fig3,
    "fedmcsa_fig4": fig4,
    "fedmcsa_fig3_partition": fig3_partition,
    "fedmcsa_fig4_partition": fig4_partition,
    "fedmcsa_table1_grid": table1_grid,
    "fedmcsa_table1": table1,
    "fedmcsa_table1_partition": table1_partition,
    "fedmcsa_table1_code_eval": table1_code_eval,
    "fedmcsa_table2": table2,
    "fedmcsa_table2_partition": table2_partition,
    "fedmcsa_table2_mean": table2_mean,
    "fedmcsa_table2_code_eval": table2_code_eval,
    "fedmcsa_sigma": sigma,
    "fedmcsa_beyond": beyond,
    "fedmcsa_beyond_val": beyond_val,
}
# experiment -> (the experiment whose runs the step reads, the keyword its grid takes, the step)
STEPS = {
    "fedmcsa_table1": ("fedmcsa_table1_grid", "winners", table1_winners),
    "fedmcsa_table1_partition": ("fedmcsa_table1_grid", "winners", table1_winners),
    "fedmcsa_table1_code_eval": ("fedmcsa_table1_grid", "winners", table1_winners),
}
