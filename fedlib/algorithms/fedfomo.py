"""FedFomo: Zhang, Sapra, Fidler, Yeung, Alvarez, "Personalized Federated Learning with First Order Model
Optimization", ICLR 2021 (Sec. 3, Algorithm 1).

Each round, every selected client i (paper symbols -> ``RunConfig`` / state):

1. downloads M other clients' models theta_n (M -> ``fomo_m``), chosen by the server from its affinity matrix P
   (N x N, ``Affinity.p``) epsilon-greedily (epsilon -> ``fomo_eps``);
2. weighs each on its own validation rows D_i^val by the first-order gain per unit distance
       w_n = (L_i(theta_i) - L_i(theta_n)) / ||theta_n - theta_i||          (Eq. 5-6)
   with theta_i its current model and L_i the mean cross-entropy on D_i^val; the server adds w_n to P_{i,n};
3. keeps the positive ones, normalised: w_n <- max(w_n, 0) / sum_m max(w_m, 0), and moves to
       theta_i <- theta_i + sum_n w_n (theta_n - theta_i)                   (Eq. 7)
   (if every w_n <= 0, theta_i stays as it is);
4. trains locally from there (the run's local steps, plain SGD) and uploads the result.

The clients' own models theta_i are evaluated (``evaluate='personal'``); no global model exists.

Choices where the paper leaves one:

- Which models are available: the server keeps every client's last upload (``State.client_params``: only the
  selected clients train, so a client's model is what it last uploaded); a client's candidates are the other
  clients that have uploaded at least once before this round (``Affinity.seen``). In round 1 nobody has, and every
  client trains from its own model. A client with fewer than M candidates downloads all of them.
- Epsilon-greedy, per client and round: with probability ``fomo_eps`` the M models are drawn uniformly without
  replacement among the candidates, else the M of highest P_{i,n} (ties broken at random: P starts at zero, where
  the lowest indices would otherwise win every time). The draws come from the run's random stream,
  drawn by the engine after the selection (``Algorithm.peers``: ``FomoClient.choose``; a hand-built ``ClientWork``
  without ``peers`` draws from its ``rng``), so a seed fixes them and a resumed run repeats them. The paper decays epsilon over the
  rounds; here it is constant (a schedule can be added as an option).
- P_{i,n} accumulates the raw w_n, negative ones included, so a model that hurt client i loses affinity (as the
  PFLlib code's ``weight_vector``); P_{i,i} is never used (a client is not its own candidate).
- Validation rows: the data's validation split where the run has one (``val_frac`` > 0), else ``fomo_val_frac`` of
  each client's training rows, held out of its training (``Algorithm.validation``; 0.2 as PFLlib's ``val_ratio``):
  drawn as the data's validation split would be, the same rows for every run on the data, whatever its seed
  (``simulation.method_validation``). A client without validation rows keeps its own model.
- The distance ||theta_n - theta_i|| is over the model's parameters (not buffers such as BatchNorm statistics, as
  the paper's theta and the PFLlib code's ``parameters()``); the update of step 3 applies to every floating tensor
  that travels, buffers included, with the same weights. Tensors a method keeps local (``Algorithm.shared``) are
  never downloaded: the candidate model is n's shared tensors with i's own local ones. Two equal models (distance 0)
  weigh 0.
- What travels (``Algorithm.peers``, counted in the bytes by the simulation and ``fedlib.flower`` alike): down, each
  downloaded model as one upload's traveling tensors; up, each client's model and its M raw weights w_n (float64,
  0 in empty slots), from which the server updates P (``FomoClient.absorb``) and marks it as uploaded.
- The weights are computed from the losses the executor's ``evaluate`` reports (the models in eval mode), the same
  on both executors: the stacked executor runs FedFomo as the loop one does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedlib.algorithms.local import no_aggregation
from fedlib.config.options import MethodOptions, option, register
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Algorithm, ClientWork, MethodState, Params, local_sgd
from fedlib.data.holdout import rows_of


@dataclass(eq=False)
class Affinity(MethodState):
    """The server's FedFomo state: ``p['P']`` (N, N) float64 affinities P_{i,n}, ``seen['uploaded']`` (N,) bool."""

    KEY = "fedfomo"
    p: Params
    seen: Params


def choose(
    clients: np.ndarray, uploaded: np.ndarray, affinity: np.ndarray, m: int, eps: float, rng: np.random.Generator
) -> np.ndarray:
    """(K, m) indices of the models each of ``clients`` downloads, -1 in slots it has no candidate for: among the
    other clients that have uploaded, uniformly with probability ``eps``, else the highest ``affinity[i]`` (ties at
    random). Per client, one draw for the coin and one per candidate for the ties, whichever way the coin falls."""
    out = np.full((len(clients), m), -1, dtype=np.int64)
    for row, i in enumerate(clients):
        cand = np.flatnonzero(uploaded & (np.arange(len(uploaded)) != i))
        explore, ties = rng.random() < eps, rng.random(len(cand))
        k = min(m, len(cand))
        if k == 0:
            continue
        if explore:
            out[row, :k] = rng.choice(cand, k, replace=False)
        else:
            out[row, :k] = cand[np.lexsort((ties, -affinity[i, cand]))[:k]]
    return out


def fomo_weights(own_loss: torch.Tensor, their_loss: torch.Tensor, dist: torch.Tensor, valid: torch.Tensor):
    """(raw, mixing) (K, M) weights from client losses ``own_loss`` (K,), the downloaded models' ``their_loss`` (K, M)
    on the client's validation rows and their parameter distances ``dist`` (K, M): raw w_n = (L_i(theta_i) -
    L_i(theta_n)) / ||theta_n - theta_i|| (0 where the distance is 0, the slot is empty (``valid`` False) or the
    client has no validation rows: a NaN loss), and mixing = max(raw, 0) normalised per row (a row of zeros stays
    zero: the client keeps its own model)."""
    raw = (own_loss[:, None] - their_loss) / dist
    raw = torch.where(valid & (dist > 0) & torch.isfinite(raw), raw, torch.zeros_like(raw))
    pos = raw.clamp_min(0)
    total = pos.sum(dim=1, keepdim=True)
    return raw, torch.where(total > 0, pos / torch.where(total > 0, total, torch.ones_like(total)), pos)


@dataclass
class FomoClient:
    """FedFomo's client procedure (module docstring): download, weigh, move, train; and its ``Peers`` declaration:
    the server chooses the models (``choose``), each client reports its raw weights w_n (``report``, one per slot)
    and the server adds them to P (``absorb``)."""

    m: int
    eps: float

    @property
    def slots(self) -> int:
        return self.m

    def affinity(self, state) -> Affinity:
        n, dev = len(state.fresh), state.fresh.device
        return Affinity.of(
            state,
            lambda: Affinity(
                {"P": torch.zeros(n, n, dtype=torch.float64, device=dev)},
                {"uploaded": torch.zeros(n, dtype=torch.bool, device=dev)},
            ),
        )

    def choose(self, state, clients: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        aff = self.affinity(state)
        return choose(np.asarray(clients), aff.seen["uploaded"].cpu().numpy(), aff.p["P"].cpu().numpy(), self.m,
                      self.eps, rng)  # fmt: skip

    def report(self, state) -> Params:
        return {"w": self._raw}

    def like(self, state) -> Params:
        return {"w": torch.zeros(self.m, dtype=torch.float64)}

    def absorb(self, state, clients: np.ndarray, picks: np.ndarray, rows: Params) -> None:
        """P_{i,n} += w_n (raw): the server's record of what helped whom; the clients have uploaded."""
        aff = self.affinity(state)
        p, ids, raw = aff.p["P"], np.asarray(clients), rows["w"].cpu()
        r, c = np.nonzero(picks >= 0)
        p[torch.as_tensor(ids[r], device=p.device), torch.as_tensor(picks[r, c], device=p.device)] += raw[r, c].to(p)
        aff.seen["uploaded"][torch.as_tensor(ids, device=p.device)] = True

    def __call__(self, work: ClientWork) -> Params:
        if work.peers is None:  # a hand-built work: draw and record here, as the engine does around the procedure
            if work.rng is None:
                raise ValueError("FedFomo needs the run's random stream (ClientWork.rng) or its peers (.peers)")
            ids = work.clients.cpu().numpy()
            picks = self.choose(work.state, ids, work.rng)
            trained = work.train(self.personalise(work, picks, work.state.client_params))
            self.absorb(work.state, ids, picks, self.report(work.state))
            return trained
        picks, models = work.peers
        return work.train(self.personalise(work, picks, models))

    def personalise(self, work: ClientWork, picks: np.ndarray, models: Params) -> Params:
        """theta_i + sum_n w_n (theta_n - theta_i) for the round's clients (their ``work.start``, their own models),
        ``picks`` (K, M) numbering rows of ``models``; keeps the raw weights (K, M) for ``report``."""
        if work.val is None:
            raise ValueError("FedFomo needs validation rows (ClientWork.val)")
        k_clients = len(work.clients)
        self._raw = torch.zeros(k_clients, self.m, dtype=torch.float64)
        if (picks < 0).all():
            return work.start
        own, ex = work.start, work.executor
        val = rows_of(work.val, work.clients.cpu().numpy())
        params = {name for name, _ in work.model.named_parameters()}
        travels = [k for k, t in own.items() if t.is_floating_point() and work.shared(k)]
        measured = [k for k in travels if k in params]  # ||theta_n - theta_i||: over the parameters
        if not measured:  # nothing of the model travels: nothing to download
            return work.start
        dev = own[measured[0]].device
        own_loss = _mean_loss(ex.evaluate(work.model, own, val, True))

        def download(s: int) -> Params:  # slot s: every client's s-th download (its own model where it has none)
            has = torch.as_tensor(picks[:, s] >= 0, device=dev)
            idx = torch.as_tensor(np.maximum(picks[:, s], 0), device=dev)
            return {
                k: torch.where(has.view(-1, *[1] * (t.dim() - 1)), models[k][idx], t) if k in travels else t
                for k, t in own.items()
            }

        their_loss, dist = [], []
        for s in range(picks.shape[1]):  # one slot at a time: K models in memory, not K x M
            cand = download(s)
            their_loss.append(_mean_loss(ex.evaluate(work.model, cand, val, True)))
            sq = [(cand[k] - own[k]).to(torch.float64).reshape(k_clients, -1).square().sum(1) for k in measured]
            dist.append(torch.stack(sq).sum(0).sqrt().cpu())
        valid = torch.as_tensor(picks >= 0)
        raw, w = fomo_weights(own_loss, torch.stack(their_loss, 1), torch.stack(dist, 1), valid)
        self._raw = raw.to(torch.float64)
        out = dict(own)
        for s in range(picks.shape[1]):
            cand = download(s)
            for k in travels:
                t = own[k]
                out[k] = out[k] + w[:, s].to(t).view(-1, *[1] * (t.dim() - 1)) * (cand[k] - t)
        return out


def _mean_loss(result: tuple[np.ndarray, np.ndarray, np.ndarray]) -> torch.Tensor:
    _, loss, rows = result
    with np.errstate(invalid="ignore", divide="ignore"):
        return torch.as_tensor(np.asarray(loss, dtype=np.float64) / np.asarray(rows, dtype=np.float64))


@register
@dataclass(frozen=True)
class FedFomo(MethodOptions):
    NAME = "fedfomo"
    fomo_m: int = option(5, ge=1, le=10_000, doc="M: models each selected client downloads per round")
    fomo_eps: float = option(
        0.3, ge=0, le=1, doc="epsilon: probability a client's M models are drawn at random rather than by affinity"
    )
    fomo_val_frac: float = option(
        0.2,
        gt=0,
        lt=1,
        doc="share of each client's training rows held out as its validation rows when the run has no validation "
        "split (val_frac = 0); with one, FedFomo weighs on it and this is unused",
    )

    def build(self, cfg: RunSpec) -> Algorithm:
        fomo = FomoClient(self.fomo_m, self.fomo_eps)
        return Algorithm(
            name=self.NAME,
            local=local_sgd(cfg),
            aggregate=no_aggregation,
            trains="selected",
            start="personal",
            evaluate="personal",
            local_update=fomo,
            validation=self.fomo_val_frac,
            peers=fomo,
        )
