"""Parameter groups: each state-dict key's group, declared by the module that holds it (a module's ``fedlib_group``)
or by its type (BatchNorm: "bn"), never guessed from names. FedBN keeps "bn" on the clients, pFedLA "attn"."""

from __future__ import annotations

from torch import nn

HEAD = "head"  # the classifier layer(s) producing the logits, declared by every registered model (``head``)


def head(module: nn.Module) -> nn.Module:
    """Declare ``module`` the model's classifier head (group "head") and return it: the last layer(s), whose output
    is the logits. The split-model methods (FedPer, FedRep, LG-FedAvg) split a model at this declaration, since the
    papers define their split as "the base layers" vs "the personalisation/classifier layers", which a name cannot
    tell reliably (``fc3`` is LeNet's head, ``fc2`` is not)."""
    module.fedlib_group = HEAD
    return module


def _own_group(module: nn.Module) -> str:
    declared = getattr(module, "fedlib_group", None)  # a module class or instance may declare its group
    if declared is not None:
        return declared
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return "bn"
    return ""


def param_groups(model: nn.Module) -> dict[str, str]:
    """Every ``model.state_dict()`` key -> its group: "bn" (parameters and buffers of backbone BatchNorm
    layers: what FedBN, Li et al. 2021, keeps on the client), "attn" (pFedLA's local attention modules,
    modules declaring ``fedlib_group = "attn"``: what pFedLA, Liang et al., keeps on the client), "head" (the
    classifier layer(s) a model declares with ``head``: where the split-model methods split it) or "" (everything
    else: the body).

    Decided by module types (or a module's ``fedlib_group`` attribute), not by names. The outermost
    grouped module wins: a BatchNorm inside an attention module (CA's ``norm``) is "attn", since sharing
    the attention (pFedLA's non-local ablation) means sharing all of it, its BN included.
    """
    groups: dict[str, str] = {}
    for name, module in model.named_modules(remove_duplicate=False):  # pre-order: parents come first
        parent = groups.get(name.rsplit(".", 1)[0] if "." in name else "", "") if name else ""
        groups[name] = parent or _own_group(module)
    return {k: groups[k.rsplit(".", 1)[0] if "." in k else ""] for k in model.state_dict()}
