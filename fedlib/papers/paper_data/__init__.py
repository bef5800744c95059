"""The papers' published numbers, as data (parsed once from the papers' tables; see each CSV's source).

``fedmcsa.csv``: FedMCSA Table 1 (best mean test accuracy, mean and std over 3 runs, fine-tuned
hyperparameters) and Table 2 (ablations, mean over 3 runs), in percent; ``algorithm`` uses
fedlib's names, with 'pfedme (GM)' for pFedMe's global model.

``adafl.csv``: AdaFL Tables 1-4 (``metric``: average of the last 10 rounds, best, rounds and cost to
``target``), means over 3 trials, methods by the paper's labels (AdaFL, Attn.-0.1, FedProx-0.5, ...).
``pfedla.csv``: pFedLA Table 1 (digits) and Table 3 (Office-31, Office-Home, DomainNet) per domain and
average, method x attention (none = the base method), and Table 5 (= Table 11, the hybrid's learned weights
per client and layer). ``pfedla_params.csv``: pFedLA Tables 2 and 4 (parameter counts).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent


def load(paper: str) -> pd.DataFrame:
    path = HERE / f"{paper}.csv"
    if not path.exists():
        raise ValueError(
            f"paper={paper!r} has no stored numbers; available: {', '.join(p.stem for p in HERE.glob('*.csv'))}"
        )
    return pd.read_csv(path)
