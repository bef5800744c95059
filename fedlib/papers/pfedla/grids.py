"""pFedLA's experiment grids: Table 1 and Figure 4 on the digits, Table 3 and Figure 4 on the Office data, the
attention-initialisation ablation, ``EXPERIMENTS``.

Every grid is a pure function of ``(profile, available)`` (``fedlib.data.available.Available``): the digit grids run
on the domains present (offline MNIST, USPS, MNIST-M), the Office grids only where all of a data set's domains are.
A grid neither trains nor reads the store, so the same profile and data give the same runs everywhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedlib.config.run import RunConfig

if TYPE_CHECKING:
    from fedlib.data.available import Available


def _available(available: "Available | None") -> "Available":
    from fedlib.data.available import Available

    return available if available is not None else Available.scan()


# pFedLA (Sec. 4.1 and Appendix): digits, one client per domain (FedBN's protocol: 743 training images each, 28x28x3),
# LeNet with BN (Table 7), SGD lr 0.01, T = 100, E = 1, all clients every round. The paper gives no batch size nor the
# baselines' knobs; ours: B = 32 (FedBN's code), FedProx mu = 0.01 (FedBN's code), pFedMe lambda = 15, eta_p = 0.01,
# K = 5 (pFedMe's Synthetic settings: its README's), Ditto lambda = 0.1. Offline only MNIST, USPS and MNIST-M exist: the grid then runs on
# those three and says so; with SVHN and SynthDigits present it is the paper's five-domain setting. The paper profile
# evaluates every 10 rounds (and at T): the three test sets hold 21,008 images, and testing every round would cost
# about three times the training.
METHODS = {
    "fedavg": {},
    "fedprox": {"mu": 0.01},
    "fedbn": {},
    "pfedme": {"lam": 15.0, "inner_steps": 5},
    "ditto": {"lam": 0.1},
}
ATTENTIONS = ["none", "se", "eca", "ca", "hybrid"]
DIGITS5 = ("mnist", "svhn", "usps", "synthdigits", "mnist_m")


def digits_domains(available: "Available | None" = None) -> tuple:
    """The paper's five digit domains when all are present, else the present ones (offline: MNIST, USPS, MNIST-M)."""
    present = _available(available).domains_of("digits")
    return DIGITS5 if set(DIGITS5) <= set(present) else tuple(d for d in DIGITS5 if d in present)


def digits_base(domains: tuple, rounds: int) -> RunConfig:
    """The digits setting on ``domains`` (one client each) at ``rounds`` rounds."""
    return RunConfig.of(
        dataset="digits",
        partition="domains",
        domains=domains,
        n_clients=max(1, len(domains)),
        model="lenet",
        lr=0.01,
        local_epochs=1,
        local_steps=None,
        batch_size=32,
        clients_per_round=None,
        rounds=rounds,
    )


def method_cells(methods, attentions, seeds, extra, **data) -> list[dict]:
    """pFedLA's Table 1/3 grid: every method (with its knobs, ``METHODS``) x every attention kind."""
    return [{**data, "algorithm": m, **METHODS[m], "attention": attentions, "seed": seeds, **extra} for m in methods]


def fig4_cells(seeds, extra, percents, **data) -> list[dict]:
    """pFedLA Figure 4's grid: (a) FedBN x attention type, (b) FedProx without attention and with local / non-local
    SE, (c) FedBN and FedBN+SE over the local data sizes ``percents``. (c) leaves out the default size (digits 10%,
    Office 100%): those runs are (a)'s, not repeated under another key."""
    return [
        {**data, "algorithm": "fedbn", "attention": ATTENTIONS, "seed": seeds, **extra},
        {
            **data,
            "algorithm": "fedprox",
            "mu": 0.01,
            "attention": "se",
            "attention_local": [True, False],
            "seed": seeds,
            **extra,
        },
        {**data, "algorithm": "fedprox", "mu": 0.01, "seed": seeds, **extra},
        {**data, "algorithm": "fedbn", "attention": ["none", "se"], "seed": seeds, **extra, "domain_percent": percents},
    ]


def table1(profile: str, available: "Available | None" = None):
    """Table 1 on the digit domains present: 5 methods x {base, SE, ECA, CA, hybrid}."""
    doms = digits_domains(available)
    rounds, seeds, methods, attns, extra = {
        "smoke": (2, [0], ["fedavg", "fedbn", "ditto"], ["none", "se", "hybrid"], {"domain_percent": 0.02}),
        "quick": (30, [0], list(METHODS), ATTENTIONS, {"eval_every": 5}),
        "paper": (100, [0, 1, 2, 3, 4], list(METHODS), ATTENTIONS, {"eval_every": 10}),
    }[profile]
    return digits_base(doms, rounds), (method_cells(methods, attns, seeds, extra) if len(doms) >= 2 else [])


def fig4(profile: str, available: "Available | None" = None):
    """Figure 4 on the digits substitute (the smoke profile's default size is 2%, so its (c) adds 4%)."""
    doms = digits_domains(available)
    rounds, seeds, percents, extra = {
        "smoke": (2, [0], [0.02, 0.04], {"domain_percent": 0.02}),
        "quick": (30, [0], [0.3], {"eval_every": 5}),
        "paper": (100, [0, 1, 2], [0.2, 0.4, 0.6, 0.8, 1.0], {"eval_every": 10}),
    }[profile]
    return digits_base(doms, rounds), (fig4_cells(seeds, extra, percents) if len(doms) >= 2 else [])


# Each client's attention drawn on its own (an ablation, not in the paper's tables): Algorithm 1 (line 9) initialises
# every client's W_{i,la} at random, where Table 1's cells start every client from the seed's one model, attention
# included (``attention_init='shared'``). Every method of Table 1 with SE, whose one-unit slot in LeNet can start
# dead (``local_attention.SE``): from one draw, on every client of that seed at once; FedBN with the hybrid too, the
# other kind that holds SE (notebook 31: no change there, so not run on the other methods). Table 1's seeds.
INIT_ATTENTIONS = {"fedbn": ["se", "hybrid"], "fedavg": ["se"], "fedprox": ["se"], "pfedme": ["se"], "ditto": ["se"]}


def attention_init(profile: str, available: "Available | None" = None):
    """Table 1's methods + SE (FedBN + hybrid too) on the digits with each client's attention drawn on its own
    (``per_client``)."""
    base, cells = table1(profile, available)  # no cells below two digit domains, as Table 1
    return base, [
        {**c, "attention": INIT_ATTENTIONS[c["algorithm"]], "attention_init": "per_client"}
        for c in cells
        if c["algorithm"] in INIT_ATTENTIONS
    ]


# pFedLA on Office-31, Office-Home, DomainNet (Sec. 4.3, Appendix): AlexNet with BN (Table 8), SGD lr 0.01, T = 200,
# E = 1, every domain's full training split (domain_percent None = 100%), batch 32 (ours; the paper gives none).
# Cells exist only for the data sets present (all their domains), so offline both grids are empty.
OFFICE_SETS = ("office31", "officehome", "domainnet")


def _office(profile: str, available: "Available | None"):
    from fedlib.data.domains import DOMAINS

    available = _available(available)
    rounds, seeds, extra = {
        "smoke": (1, [0], {"domain_percent": 0.05}),
        "quick": (10, [0], {"eval_every": 5}),
        "paper": (200, [0, 1, 2], {"eval_every": 10}),
    }[profile]
    sets = [d for d in OFFICE_SETS if available.domains_of(d) and set(DOMAINS[d]) <= set(available.domains_of(d))]
    base = RunConfig.of(
        dataset="office31",
        partition="domains",
        n_clients=3,
        model="alexnet",
        lr=0.01,
        local_epochs=1,
        local_steps=None,
        batch_size=32,
        clients_per_round=None,
        rounds=rounds,
    )
    data = lambda d: {"dataset": d, "n_clients": len(DOMAINS[d])}
    return base, sets, seeds, extra, data


def office_table3(profile: str, available: "Available | None" = None):
    """Table 3 on Office-31 / Office-Home / DomainNet, each where all its domains are present."""
    base, sets, seeds, extra, data = _office(profile, available)
    return base, [c for d in sets for c in method_cells(list(METHODS), ATTENTIONS, seeds, extra, **data(d))]


def office_fig4(profile: str, available: "Available | None" = None):
    """Figure 4 on Office-31, data size 10%-80% beside (a)'s 100%."""
    base, sets, seeds, extra, data = _office(profile, available)
    if "office31" not in sets:
        return base, []
    percents = {"smoke": [0.1], "quick": [0.3], "paper": [0.1, 0.2, 0.4, 0.6, 0.8]}[profile]
    return base, fig4_cells(seeds, extra, percents, **data("office31"))


# The split-model baselines as pFedLA's base methods (Table 1's digits setting): FedPer and FedRep keep the head on
# the client, FedRoD adds a personal head beside a shared generic one; each under every attention kind, the modules
# local as in Table 1. Their heads are the model's declared ``head`` group (LeNet's last linear layer).
BEYOND_METHODS = {"fedper": {}, "fedrep": {}, "fedrod": {}}


def beyond(profile: str, available: "Available | None" = None):
    """Table 1's grid with FedPer, FedRep and FedRoD as the base methods."""
    doms = digits_domains(available)
    rounds, seeds, attns, extra = {
        "smoke": (2, [0], ["none", "se"], {"domain_percent": 0.02}),
        "quick": (30, [0], ATTENTIONS, {"eval_every": 5}),
        "paper": (100, [0, 1, 2, 3, 4], ATTENTIONS, {"eval_every": 10}),
    }[profile]
    cells = [{"algorithm": m, **kw, "attention": attns, "seed": seeds, **extra} for m, kw in BEYOND_METHODS.items()]
    return digits_base(doms, rounds), (cells if len(doms) >= 2 else [])


EXPERIMENTS = {
    "pfedla_table1": table1,
    "pfedla_fig4": fig4,
    "pfedla_attention_init": attention_init,
    "pfedla_office_table3": office_table3,
    "pfedla_office_fig4": office_fig4,
    "pfedla_beyond": beyond,
}
