"""The papers' published numbers, as data (parsed once from the papers' tables; see each CSV's source).

``fedmcsa.csv``: FedMCSA Table 1 (best mean test accuracy, mean and std over 3 runs, fine-tuned
hyperparameters) and Table 2 (ablations, mean over 3 runs), in percent; ``algorithm`` uses
fedlib's names, with 'pfedme (GM)' for pFedMe's global model.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent


def load(paper: str) -> pd.DataFrame:
    path = HERE / f"{paper}.csv"
    if not path.exists():
        raise ValueError(f"paper={paper!r} has no stored numbers; available: {', '.join(p.stem for p in HERE.glob('*.csv'))}")
    return pd.read_csv(path)
