"""Other clients' models a method's training clients download (``Algorithm.peers``: FedFomo's) on the Flower path:
the server keeps every client's last upload, chooses each training client's models from the run's random stream
(``Peers.choose``, as the simulation draws them after the selection) and sends them in its train message
(``Task.peers``: ``"<slot>.<name>"``, the chosen models in slot order); the client hands them to its procedure
(``ClientWork.peers``) and uploads its reported rows (``PEERS`` names) for the server's ``Peers.absorb``. Also the
rows a method holds out of each client's training for its procedure (``Algorithm.validation``), as ``simulate``
holds them out (``held_out``)."""

from __future__ import annotations

import numpy as np
import torch

from fedlib.config.run import RunConfig
from fedlib.core.stages import Params

PEERS = "peers."  # an upload's names of the rows a method's clients report on their downloads (``Peers.report``)


def sent(models: Params, names: list[str], picks: np.ndarray) -> Params:
    """One client's downloads: the traveling tensors ``names`` of the clients ``picks`` (its row of
    ``Peers.choose``: -1 in the empty slots, the last ones) from the server's last uploads ``models``."""
    return {f"{s}.{k}": models[k][int(i)] for s, i in enumerate(picks.tolist()) if i >= 0 for k in names}


def received(task_peers: Params, names: list[str], slots: int) -> tuple[np.ndarray, Params]:
    """(picks (1, slots), models name -> (R, ...)): a client's downloads as ``ClientWork.peers``."""
    r = len({k.partition(".")[0] for k in task_peers})
    picks = np.full((1, slots), -1, dtype=np.int64)
    picks[0, :r] = np.arange(r)
    models = {k: torch.stack([task_peers[f"{s}.{k}"] for s in range(r)]) for k in names} if r else {}
    return picks, models


def held_out(cfg: RunConfig, data):
    """(data, held): ``data`` less the rows ``cfg``'s method holds out of its clients' training for its client
    procedure, and those rows (None where it holds none): ``simulation.method_validation``, so that each client
    trains on the rows it trains on in ``simulate`` and weighs on the same validation rows."""
    from fedlib.algorithms import build_algorithm
    from fedlib.core.simulation import method_validation

    return method_validation(build_algorithm(cfg, n_samples=np.ones(data.n_clients)), data)
