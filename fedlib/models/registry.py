"""Model registry: every model is a plain ``nn.Module``; stacked training uses its state dict with a client axis.

Names follow the papers:
- ``mlr``: multinomial logistic regression (softmax regression), FedMCSA/pFedMe's "MLR"
  (the l2 regularisation is the optimiser's ``weight_decay``).
- ``dnn``: one hidden layer with ReLU, FedMCSA/pFedMe's "DNN" (hidden 20 on Synthetic, 100 on images).
- ``mlp``: two hidden layers with ReLU, McMahan et al.'s "2NN" as used by AdaFL (784-200-200-10).
- ``cnn``: FedMix's CIFAR-10 CNN (a small VGG, see ``fedmix_cnn``), AdaFL's CIFAR-10 model.
- ``lenet``, ``alexnet``, ``mobilenetv2``: pFedLA's conv nets with BatchNorm (``fedlib.models.convnets``; Tables
  7, 8 and 9-10 of pFedLA). They have attention slots: ``build_model(..., attention="se")`` (none | se |
  eca | ca | hybrid) puts pFedLA's client-local attention after each conv layer. What FedBN and pFedLA
  keep local is ``param_groups`` (by module type); their state-dict names agree with it (backbone
  BatchNorm names contain ``bn``, attention names ``attn``; tested). ``hidden`` is the FC widths of LeNet (120, 84) and AlexNet (4096, 4096); MobileNetV2 takes none.

Capabilities are declared, not guessed from names:

- ``kernel_of(model)``: the executor kernel a model supports, one of ``KERNELS``: "chain" (a
  Flatten/Linear/ReLU chain, ``linear_chain``: the stacked executor's hand-written batched
  forward/backward), "vmap" (buffer-free: ``torch.func.vmap`` over ``functional_call``), "loop" (has
  buffers, e.g. BatchNorm running statistics: the per-client loop executor only). Registry models carry
  ``ModelSpec.kernel`` on the built module (``model.fedlib_kernel``); any other module falls back to the
  structural rule.
- ``param_groups(model)``: each state-dict key -> "bn" (backbone BatchNorm, what FedBN keeps local),
  "attn" (pFedLA's local attention modules), "head" (the classifier layer(s), declared by every registered model with
  ``fedlib.models.groups.head``: where the split-model methods split it) or "" (the body), not from names.

New entries are covered by the contract tests in ``tests/test_models.py`` automatically. Users add theirs with
``register_model`` (``fedlib.register_model``): a plain factory, checked when it is registered.
"""

from __future__ import annotations

import functools
import inspect
import math
import threading
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from fedlib.models import convnets
from fedlib.models.groups import HEAD, head

KERNELS = ("chain", "vmap", "loop")  # executor kernels, fastest first (see ``kernel_of``)


@dataclass(frozen=True)
class ModelSpec:
    """A registry entry. ``kernel`` declares what the built model is (checked by ``kernel_of`` and the
    contract tests): "chain" for Linear chains, "vmap" for buffer-free models, "loop" for models with buffers."""

    name: str
    build: Callable[..., nn.Module]  # build(input_shape, n_classes, hidden[, attention=]) -> nn.Module
    default_hidden: tuple[int, ...]
    doc: str
    attention_slots: bool = False  # build takes attention= (pFedLA's local attention after each conv layer)
    kernel: str = "chain"  # executor kernel of the built model, one of KERNELS (see ``kernel_of``)
    example_shapes: tuple[tuple[int, ...], ...] = ((60,), (1, 28, 28))  # inputs it takes (contract tests)
    groups: tuple[str, ...] = (HEAD,)  # parameter groups of the built model besides "" and "attn" (``param_groups``)
    version: int | None = None  # None: a built-in model; a user model's (``register_model``), in its runs' keys

    def __post_init__(self):
        if self.kernel not in KERNELS:
            raise ValueError(f"ModelSpec {self.name!r}: kernel={self.kernel!r} is not one of: {', '.join(KERNELS)}")


def _chain(input_shape, n_classes, hidden) -> nn.Module:
    d = math.prod(input_shape)
    layers: list[nn.Module] = [nn.Flatten()]
    for h in hidden:
        layers += [nn.Linear(d, h), nn.ReLU()]
        d = h
    layers.append(head(nn.Linear(d, n_classes)))
    return nn.Sequential(*layers)


def fedmix_cnn(input_shape, n_classes, hidden=(512, 512)) -> nn.Module:
    """The CIFAR-10/100 CNN of FedMix (Yoon et al., ICLR 2021, appendix "experimental details": a
    modified VGG), which AdaFL uses for CIFAR-10 ("the same model architecture as given in [Yoon et
    al., 2021]"). Transcribed from the Flower baseline of the paper (adap/flower,
    baselines/fedmix/fedmix/models.py ``CustomVGG``; transcribed from that code, not from the paper's appendix):

        conv3x3(C->32, pad 1) ReLU
        conv3x3(32->64) ReLU, maxpool 2x2
        conv3x3(64->128) ReLU
        conv3x3(128->128) ReLU, maxpool 2x2, dropout 0.1
        conv3x3(128->256) ReLU
        conv3x3(256->256) ReLU, maxpool 2x2, dropout 0.1
        flatten (256 x 4 x 4 = 4096 on 32x32 inputs)
        FC 4096->512 ReLU, FC 512->512 ReLU, dropout 0.1, FC 512->n_classes

    No batch norm (no buffers). 3,491,530 parameters for (3, 32, 32) inputs and 10 classes.
    ``hidden`` = the two FC widths; other image sizes flatten 256 x (H // 8) x (W // 8).
    """
    if len(input_shape) != 3:
        raise ValueError(f"model 'cnn' needs image inputs (C, H, W), got input_shape={tuple(input_shape)}")
    c, h, w = input_shape
    h1, h2 = tuple(hidden)[:2]
    conv = lambda i, o: [nn.Conv2d(i, o, kernel_size=3, stride=1, padding=1), nn.ReLU()]
    return nn.Sequential(
        *conv(c, 32),
        *conv(32, 64),
        nn.MaxPool2d(2, 2),
        *conv(64, 128),
        *conv(128, 128),
        nn.MaxPool2d(2, 2),
        nn.Dropout(0.1),
        *conv(128, 256),
        *conv(256, 256),
        nn.MaxPool2d(2, 2),
        nn.Dropout(0.1),
        nn.Flatten(),
        nn.Linear(256 * (h // 8) * (w // 8), h1),
        nn.ReLU(),
        nn.Linear(h1, h2),
        nn.ReLU(),
        nn.Dropout(0.1),
        head(nn.Linear(h2, n_classes)),
    )


MODELS: dict[str, ModelSpec] = {
    "mlr": ModelSpec("mlr", lambda s, c, h=(): _chain(s, c, ()), (), "softmax regression (FedMCSA/pFedMe MLR)"),
    "dnn": ModelSpec(
        "dnn",
        lambda s, c, h=(100,): _chain(s, c, tuple(h)[:1]),
        (100,),
        "one hidden ReLU layer (FedMCSA/pFedMe DNN; 20 units on Synthetic, 100 on images)",
    ),
    "mlp": ModelSpec(
        "mlp",
        lambda s, c, h=(200, 200): _chain(s, c, tuple(h)[:2]),
        (200, 200),
        "two hidden ReLU layers (McMahan et al. 2NN, AdaFL's 784-200-200-10)",
    ),
    "cnn": ModelSpec(
        "cnn",
        fedmix_cnn,
        (512, 512),
        "FedMix's CIFAR-10 CNN (6 conv3x3 32-64-128-128-256-256, 3 maxpools, FC 512-512; AdaFL's CIFAR-10 model)",
        kernel="vmap",
        example_shapes=((3, 32, 32), (1, 28, 28)),
    ),
    "lenet": ModelSpec(
        "lenet",
        lambda s, c, h=(120, 84), attention="none": convnets.LeNet(s, c, h, attention),
        (120, 84),
        "LeNet with BN, pFedLA Table 7 (digits, 3x28x28)",
        attention_slots=True,
        kernel="loop",
        groups=("bn", HEAD),
        example_shapes=((3, 28, 28), (3, 32, 32)),
    ),
    "alexnet": ModelSpec(
        "alexnet",
        lambda s, c, h=(4096, 4096), attention="none": convnets.AlexNet(s, c, h, attention),
        (4096, 4096),
        "AlexNet with BN, pFedLA Table 8 = FedBN's AlexNet (Office, 3x224x224)",
        attention_slots=True,
        kernel="loop",
        groups=("bn", HEAD),
        example_shapes=((3, 224, 224), (3, 64, 64)),
    ),
    "mobilenetv2": ModelSpec(
        "mobilenetv2",
        lambda s, c, h=(), attention="none": convnets.MobileNetV2(s, c, h, attention),
        (),
        "MobileNetV2 with pFedLA Table 10's bottleneck, classification head",
        attention_slots=True,
        kernel="loop",
        groups=("bn", HEAD),
        example_shapes=((3, 28, 28), (3, 64, 64)),
    ),
}


BUILT_IN = frozenset(MODELS)  # the library's own models: never replaced, their runs' keys carry no version


def register_model(
    name: str,
    builder: Callable[..., nn.Module],
    *,
    default_hidden: tuple[int, ...] = (),
    groups: tuple[str, ...] = (),
    kernel: str | None = None,
    version: int = 1,
    attention_slots: bool = False,
    example_shapes: tuple[tuple[int, ...], ...] = ((60,), (1, 28, 28)),
    doc: str = "",
    replace: bool = False,
) -> ModelSpec:
    """Register a model of your own under ``name``, so that ``RunConfig(model=name)`` trains it like a built-in one.

    ``builder(input_shape, n_classes, hidden) -> nn.Module``: a plain factory (``input_shape`` is one sample's shape,
    e.g. ``(1, 28, 28)``; ``hidden`` the widths, ``default_hidden`` when the config gives none). A builder of two
    parameters, ``builder(input_shape, n_classes)``, is accepted for a model without widths (``default_hidden=()``).
    ``attention_slots``: the builder takes ``attention=`` (pFedLA's local attention). ``groups``: the parameter
    groups the built model has besides the shared ones ("bn": BatchNorm that FedBN keeps local; "head": the classifier
    layer(s), declared in the builder with ``fedlib.models.groups.head``, where FedPer, FedRep and LG-FedAvg split the
    model; checked on the built model, since a method that keeps a group local would otherwise train as FedAvg). ``kernel``: "chain", "vmap" or
    "loop" (``KERNELS``); None reads it off the built model (``kernel_of``: a Flatten/Linear/ReLU chain -> "chain", no
    buffers -> "vmap", else "loop"), which is the fastest it runs under.

    The builder is called here, on the first of ``example_shapes`` it builds for (the contract tests build it on all of
    them): what it returns must be an ``nn.Module`` that runs under the kernel. Whether its output width matches a
    data set's classes is checked before a run trains: by ``RunConfig.validate`` on a data set of the user's (whose
    shape is known once it is registered), by ``fedlib.runs.feasibility.check_model`` for every run.

    Store keys: a user model's runs are keyed by its name and ``version`` (``fedlib.config.legacy.key``). The code of
    a builder cannot be hashed faithfully (closures, the modules it calls), so the key cannot notice that it
    changed: bump ``version`` when you change what the model computes, and runs stored with the old one are no
    longer read. A name already registered is refused (``replace=True`` replaces a model of your own on purpose,
    e.g. re-running a notebook cell); the built-in names never are.
    """
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise ValueError(f"register_model: name={name!r} must be a non-empty string without surrounding blanks")
    if name in BUILT_IN:
        raise ValueError(
            f"register_model: name={name!r} is a built-in model ({', '.join(sorted(BUILT_IN))}); pick another"
        )
    if name in MODELS and not replace:
        raise ValueError(f"register_model: model {name!r} is already registered (replace=True to replace it)")
    if not callable(builder):
        raise TypeError(
            f"register_model: builder={builder!r} must be callable: builder(input_shape, n_classes, hidden)"
        )
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"register_model: version={version!r} must be an integer >= 1")
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(
            f"register_model: kernel={kernel!r} is not one of: {', '.join(KERNELS)} (or None: read it off the model)"
        )
    bad = [g for g in groups if g not in ("bn", HEAD)] if isinstance(groups, tuple) else [groups]
    if bad:
        raise ValueError(
            f"register_model: groups={groups!r} must be a tuple of 'bn' (BatchNorm kept local by FedBN) and 'head' "
            "(a classifier layer declared with fedlib.models.groups.head: FedPer, FedRep, LG-FedAvg split there), or ()"
        )
    hidden = tuple(default_hidden)
    if not all(isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in hidden):
        raise ValueError(f"register_model: default_hidden={default_hidden!r} must be a tuple of positive ints")
    build = _three_parameters(name, builder, hidden)
    probe, kind = _probe(name, build, hidden, attention_slots, example_shapes, kernel, groups)
    shapes = tuple(tuple(s) for s in example_shapes)  # hashable: specs key the output check's cache
    spec = ModelSpec(name, build, hidden, doc or f"user model {name!r}", attention_slots, kind, shapes, tuple(groups),
                     version)  # fmt: skip
    MODELS[name] = spec
    return spec


def unregister_model(name: str) -> None:
    """Remove a model registered with ``register_model`` (a built-in one cannot be removed)."""
    if name in BUILT_IN or name not in MODELS:
        raise ValueError(f"unregister_model: {name!r} is not a registered user model")
    del MODELS[name]


def _three_parameters(name: str, builder: Callable[..., nn.Module], hidden: tuple) -> Callable[..., nn.Module]:
    """``builder`` as ``build(input_shape, n_classes, hidden, **kw)``: a two-parameter builder gets no widths."""
    try:
        params = inspect.signature(builder).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: taken as documented
        return builder
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind == p.VAR_POSITIONAL for p in params) or len(positional) >= 3:
        return builder
    if len(positional) == 2:
        if hidden:
            raise ValueError(
                f"register_model: builder of model {name!r} takes (input_shape, n_classes) but default_hidden="
                f"{hidden!r}: a builder with widths takes (input_shape, n_classes, hidden)"
            )
        return lambda s, c, h=(), **kw: builder(s, c, **kw)
    raise TypeError(f"register_model: builder of model {name!r} must take (input_shape, n_classes[, hidden])")


def _probe(name, build, hidden, attention_slots, shapes, kernel, groups) -> tuple[nn.Module, str]:
    """Build the model on the first example shape it takes; its kernel (declared or read off it) and groups checked."""
    errors = []
    kw = {"attention": "none"} if attention_slots else {}
    for shape in shapes:
        try:
            model = build(tuple(shape), 10, hidden, **kw)
        except Exception as e:  # noqa: BLE001 (a user's code: any failure on this shape, try the next)
            errors.append(f"{tuple(shape)}: {type(e).__name__}: {e}")
            continue
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"register_model: builder of model {name!r} returned {type(model).__name__}, not an nn.Module"
            )
        if kernel is not None:
            model.fedlib_kernel = kernel
        try:
            kind = kernel_of(model)
        except ValueError as e:
            raise ValueError(f"register_model: model {name!r}: {e}") from None
        from fedlib.models.groups import param_groups

        if "bn" in groups and "bn" not in param_groups(model).values():
            raise ValueError(f"register_model: model {name!r} declares groups=('bn',) but has no BatchNorm layer")
        if HEAD in groups and HEAD not in param_groups(model).values():
            raise ValueError(
                f"register_model: model {name!r} declares groups=('head',) but no module of it declares the head "
                "(wrap its classifier layer in fedlib.models.groups.head)"
            )
        return model, kind
    raise ValueError(
        f"register_model: builder of model {name!r} builds for none of example_shapes={tuple(shapes)!r} "
        f"({'; '.join(errors)}); pass the input shapes it takes as example_shapes"
    )


def check_output(
    name: str, input_shape: tuple, n_classes: int, hidden=None, attention: str = "none", where: str = ""
) -> None:
    """Raise ValueError naming the model, the data and both widths when model ``name`` built for ``input_shape`` and
    ``n_classes`` does not map a batch of inputs to ``(batch, n_classes)`` logits (or does not run on them): else the
    loss would fail inside the first local step, or, for a wider output, train on logits of classes the data lacks.
    Checked once per registration and data shape (a model registered again is checked again)."""
    hidden = None if hidden is None else tuple(hidden)
    _check_output(MODELS[name], tuple(input_shape), n_classes, hidden, attention, where)


@functools.lru_cache(maxsize=64)
def _check_output(spec: ModelSpec, input_shape: tuple, n_classes: int, hidden, attention: str, where: str) -> None:
    name = spec.name
    kw = {"attention": attention} if spec.attention_slots else {}
    widths = spec.default_hidden if hidden is None else tuple(hidden)
    try:
        model = spec.build(tuple(input_shape), n_classes, widths, **kw).eval()
        with torch.no_grad():
            out = model(torch.zeros(2, *input_shape))
    except Exception as e:  # noqa: BLE001 (a user's model: its failure, reported with what it was given)
        raise ValueError(
            f"{where}model={name!r} does not run on inputs of shape {tuple(input_shape)} with n_classes={n_classes} "
            f"({type(e).__name__}: {e})"
        ) from None
    if not isinstance(out, torch.Tensor) or out.shape != (2, n_classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(
            f"{where}model={name!r} outputs {got[-1] if isinstance(got, tuple) and got else got} logits per sample "
            f"(output shape {got} for a batch of 2), but the data has {n_classes} classes: its output width must be "
            f"{n_classes}"
        )


def check_attention(name: str, attention: str, prefix: str = "") -> None:
    """pFedLA's attention needs a model with attention slots: raise naming both otherwise
    (``prefix``, e.g. 'RunConfig.', says where the value came from)."""
    if attention != "none" and not MODELS[name].attention_slots:
        slotted = ", ".join(n for n, m in MODELS.items() if m.attention_slots)
        raise ValueError(
            f"{prefix}attention={attention!r} needs a model with attention slots ({slotted}); "
            f"model={name!r} has none (use attention='none')"
        )


_SEEDED_BUILD = threading.Lock()


def build_model(
    name: str,
    input_shape,
    n_classes: int,
    hidden=None,
    seed: int | None = None,
    dtype=torch.float32,
    attention: str = "none",
) -> nn.Module:
    """Build registry model ``name``; ``seed`` makes the initial weights reproducible.

    ``attention`` (none | se | eca | ca | hybrid): pFedLA's local attention, for models with attention
    slots (``MODELS[name].attention_slots``); any value other than 'none' for other models is an error.
    """
    if name not in MODELS:
        raise ValueError(f"model={name!r} is not one of: {', '.join(MODELS)}")
    spec = MODELS[name]
    check_attention(name, attention)
    hidden = spec.default_hidden if hidden is None else tuple(hidden)
    kwargs = {"attention": attention} if spec.attention_slots else {}
    if seed is not None:
        # torch's global generator, seeded: runs batched in threads (``fedlib.runs.batching``) build theirs one at a time
        with _SEEDED_BUILD, torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = spec.build(tuple(input_shape), n_classes, hidden, **kwargs).to(dtype)
    else:
        model = spec.build(tuple(input_shape), n_classes, hidden, **kwargs).to(dtype)
    model.fedlib_kernel = spec.kernel  # the declaration kernel_of reads (and checks against the structure)
    return model


def _structural_kernel(model: nn.Module) -> str:
    if linear_chain(model) is not None:
        return "chain"
    return "vmap" if next(model.buffers(), None) is None else "loop"


def kernel_of(model: nn.Module) -> str:
    """The executor kernel ``model`` supports: "chain", "vmap" or "loop" (``KERNELS``).

    Declared, not inferred from names: a model built by ``build_model`` carries its ``ModelSpec.kernel``
    as ``model.fedlib_kernel`` (any module may set that attribute, e.g. "loop" to keep a Linear chain off
    the stacked kernels). Without a declaration the structure decides: ``linear_chain(model)`` is not None
    -> "chain"; no buffers -> "vmap"; else "loop". A declaration the model cannot run under is an error
    (a "chain" that is not a Linear chain, a "vmap" model with buffers: vmap over ``functional_call``
    would not update the per-client buffers); "loop" runs anything.
    """
    declared = getattr(model, "fedlib_kernel", None)
    if declared is None:
        return _structural_kernel(model)
    if declared not in KERNELS:
        raise ValueError(f"{type(model).__name__}.fedlib_kernel={declared!r} is not one of: {', '.join(KERNELS)}")
    if declared == "chain" and linear_chain(model) is None:
        raise ValueError(f"{type(model).__name__} declares kernel 'chain' but is not a Flatten/Linear/ReLU chain")
    if declared == "vmap" and next(model.buffers(), None) is not None:
        raise ValueError(f"{type(model).__name__} declares kernel 'vmap' but has buffers (use 'loop')")
    return declared


def linear_chain(model: nn.Module) -> list[str] | None:
    """Names of the Linear layers if ``model`` is Sequential(Flatten?, Linear, ReLU, ..., Linear), else None.

    Such a model's state dict holds ``<name>.weight`` (out, in) and ``<name>.bias`` (out,),
    with ReLU between consecutive Linear layers: what the stacked kernel computes.
    """
    if not isinstance(model, nn.Sequential):
        return None
    mods = list(model.named_children())
    if mods and isinstance(mods[0][1], nn.Flatten):
        mods = mods[1:]
    names = []
    for j, (name, m) in enumerate(mods):
        want_linear = j % 2 == 0
        if want_linear and isinstance(m, nn.Linear) and m.bias is not None:
            names.append(name)
        elif not want_linear and isinstance(m, nn.ReLU):
            continue
        else:
            return None
    return names if mods and len(mods) % 2 == 1 else None


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def groups_of(name: str, hidden=None, attention: str = "none") -> frozenset[str]:
    """The parameter groups (``param_groups``) of registry model ``name`` built with ``hidden`` and ``attention``, on
    its first example shape: what a config's model has, for checks before a run (a split-model method on MLR, whose
    one layer is its head, has no body to split off). Built on torch's "meta" device (no memory, no initialisation)
    where the builder allows it; cached per registration."""
    return _groups_of(MODELS[name], None if hidden is None else tuple(hidden), attention)


@functools.lru_cache(maxsize=64)
def _groups_of(spec: ModelSpec, hidden, attention: str) -> frozenset[str]:
    from fedlib.models.groups import param_groups

    kw = {"attention": attention} if spec.attention_slots else {}
    widths = spec.default_hidden if hidden is None else hidden
    try:
        with torch.device("meta"):
            model = spec.build(spec.example_shapes[0], 10, widths, **kw)
    except Exception:  # noqa: BLE001 (a user's builder that needs real tensors: built on the CPU)
        model = spec.build(spec.example_shapes[0], 10, widths, **kw)
    return frozenset(param_groups(model).values())
