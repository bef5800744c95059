"""Server-side attention among client models: FedMCSA (per component: tensor or layer), HeurFedAMP and FedAMP
(whole model).

All turn the K uploaded models into K personalised models W_i = sum_k psi_ik Theta_k with weights psi summing to 1
per row, so all are ``Mixing.to_personal`` matrices for the round loop: FedMCSA and HeurFedAMP from cosine
similarities (vectorised: for each component, normalise the K flattened copies, S = P_n P_n^T, and a row softmax;
milliseconds for 100 clients), FedAMP from squared distances.
"""

from __future__ import annotations

import torch

Params = dict[str, torch.Tensor]


def cosine_matrix(p: torch.Tensor) -> torch.Tensor:
    """(K, K) cosine similarities of the K rows of ``p`` flattened (a zero row has cosine 0 to all)."""
    flat = p.reshape(p.shape[0], -1).to(torch.float64)
    unit = flat / flat.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return unit @ unit.T


def mcsa_weights(
    uploads: Params, sigma: float, n_samples: torch.Tensor | None = None, by_layer: bool = False
) -> dict[str, torch.Tensor]:
    """FedMCSA's model-components self-attention, Eq. (6)-(7): one (K, K) matrix per component.

    psi_{i,l,k} = exp(sigma cos(theta_{i,l}, theta_{k,l})) / sum_h exp(sigma cos(theta_{i,l}, theta_{h,l})).

    Eq. (7) as printed puts cos(theta_k, theta_h) in the denominator; only the row
    normalisation over h for fixed i makes sum_k psi_{i,l,k} = 1, which Eq. (6) requires
    ("a convex combination"), so we use the row softmax. By default a component is one parameter tensor
    (a layer's weight and its bias are separate components), as in the authors' code, which
    iterates over ``model.parameters()``; every stored FedMCSA run is of that kind. ``by_layer``: a component is a
    layer, as the paper's text has it ("we regard each layer in a model as a basic unit", Sec. 3; theta_{i,l} "the
    model parameter of l-th layer"): the cosine is taken over the layer's tensors concatenated (``layer_of``: the
    parameters of one module), and every tensor of the layer gets the layer's matrix. ``sigma`` [sigma] scales the
    similarities: sigma = 0 gives uniform averaging among the uploads, sigma -> inf each client's own model.

    ``n_samples``: the "as in the authors' code" variant, which multiplies each row by the
    uploaders' data-size shares and renormalises (not in the paper).
    """
    groups: dict[str, list[str]] = {}
    for name in uploads:
        groups.setdefault(layer_of(name) if by_layer else name, []).append(name)
    out = {}
    for names in groups.values():
        k = uploads[names[0]].shape[0]
        p = uploads[names[0]] if len(names) == 1 else torch.cat([uploads[n].reshape(k, -1) for n in names], 1)
        a = torch.softmax(sigma * cosine_matrix(p), dim=1)
        if n_samples is not None:
            a = a * (n_samples.to(a.dtype) / n_samples.sum())[None, :]
            a = a / a.sum(dim=1, keepdim=True)
        out.update(dict.fromkeys(names, a))
    return out


def layer_of(name: str) -> str:
    """The layer a parameter belongs to, its module: 'fc1.weight' -> 'fc1' (a top-level parameter: itself)."""
    return name.rpartition(".")[0] or name


def heurfedamp_weights(uploads: Params, sigma: float, self_weight: float) -> torch.Tensor:
    """HeurFedAMP (Huang et al., "Personalized Cross-Silo Federated Learning on Non-IID Data", AAAI 2021).

    Whole-model attention: cosine similarity of the flattened models (all components
    concatenated); client i keeps ``self_weight`` [xi_{i,i}] on its own model and spreads
    1 - xi_{i,i} over the others in proportion to exp(sigma cos(w_i, w_j)), j != i.
    With one upload the client keeps its own model.
    """
    flat = whole_models(uploads)
    if len(flat) == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    logits = sigma * cosine_matrix(flat)
    logits.fill_diagonal_(float("-inf"))
    a = torch.softmax(logits, dim=1) * (1 - self_weight)
    a.diagonal().fill_(self_weight)
    return a


def whole_models(uploads: Params) -> torch.Tensor:
    """The K uploads as (K, D) float64 rows, all their tensors concatenated (HeurFedAMP's and FedAMP's w_i)."""
    names = list(uploads)
    k = uploads[names[0]].shape[0]
    return torch.cat([uploads[n].reshape(k, -1).to(torch.float64) for n in names], dim=1)


def fedamp_weights(uploads: Params, alpha: float, sigma: float) -> torch.Tensor:
    """FedAMP's attentive message passing (Huang et al., AAAI 2021, Eq. 5): (K, K) weights xi of the cloud models.

    u_i = w_i - alpha grad_{w_i} sum_{j != i} A(||w_i - w_j||^2) written as a combination of the uploads, with the
    paper's xi_{i,j} = alpha A'(||w_i - w_j||^2) for j != i and xi_{i,i} = 1 - sum_{j != i} xi_{i,j}, where
    A(x) = 1 - exp(-x / sigma), so A'(x) = exp(-x / sigma) / sigma: close models (small distance) pass each other
    more. ``alpha`` [alpha_k] is the step, ``sigma`` [sigma] the distance scale; the distances are over whole models
    (all uploaded tensors concatenated). The rows sum to 1 but are convex only while sum_j xi_{i,j} <= 1, which the
    paper's small steps keep (alpha (K - 1) / sigma <= 1 suffices); beyond it xi_{i,i} < 0 and u_i extrapolates
    away from the others (kept, not clipped: it is the gradient step). Squared distances are summed row by row,
    ||w_i - w_j||^2 directly rather than from a Gram matrix, which would cancel digits between close models."""
    flat = whole_models(uploads)
    d = torch.stack([(flat - row).square().sum(dim=1) for row in flat])
    xi = alpha * torch.exp(-d / sigma) / sigma
    xi.fill_diagonal_(0.0)
    xi.diagonal().copy_(1 - xi.sum(dim=1))
    return xi
