"""Memory a run will need, estimated from its config before anything is allocated, and refused when it cannot fit;
and what the data set cannot give the config, refused before any data loads.

A config such as ``n_clients=10**9``, ``hidden=(10**6,)`` or ``batch_size=10**7`` passes every per-field check, and
unchecked would fill the machine's memory or hang while generating data. ``check(cfg)`` estimates the run's peak memory
from the config alone and raises a ``ValueError`` with the estimate, its parts and the limit when it exceeds what is
available. The estimate counts what the engine holds (``fedlib.core.state.State``: every client's model and the last
one the server sent, plus the global model and a method's own state), what local training holds at once (the
trainers' parameters, gradients, optimiser state and start points, and their activations for a batch), and the data
set's tensors, and what the run records as it goes (``records``: per round, who uploaded; per evaluated round, every
client's accuracy and loss; AdaFL's scores; the attention trace, capped at ``ATTENTION_TRACE_BYTES``). It is meant
to catch orders of magnitude, not to predict to the megabyte: it errs high (measured: ``estimate``), and only the
runs about to train are checked (a stored result is read on any machine). It also counts each round's mini-batch plan
(``plan``: the row indices of every local step of every client training, and pFedMe's inner steps, which repeat a
step's batch ``inner_steps`` times): else ``local_steps=10**9`` would pass every check and then fail allocating it.

``check`` also refuses, before any data loads, what the data set cannot give the config (``check_data``: a partition
that needs more samples than the data set has, ``check_model``: a model that does not take its inputs) and, from the
clients' sizes the partition will draw (``client_sizes``: the same draws, from the class counts alone), a client
left with no sample or no training sample: else these would fail only when the config's data loaded, naming the
partitioner's arguments (``k=11: must be in [1, 10]``), after a grid had trained the configs before it.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from fedlib.core.callbacks import ATTENTION_TRACE_BYTES
from fedlib.data import own, partition
from fedlib.data.domains import CLASSES, DOMAINS
from fedlib.data.federated import PAD_WASTE
from fedlib.executors import hardware
from fedlib.models.registry import MODELS, check_output

# (input shape, samples in the whole data set) per data set; Synthetic is generated per client (sizes below)
DATA = {
    "mnist": ((1, 28, 28), 70_000),
    "fmnist": ((1, 28, 28), 70_000),
    "cifar10": ((3, 32, 32), 60_000),
    "digits": ((3, 28, 28), 5 * 80_000),  # MNIST, SVHN, USPS, SynthDigits, MNIST-M (at most, before domain_percent)
    "office31": ((3, 224, 224), 4_110),
    "officehome": ((3, 224, 224), 15_588),
    "domainnet": ((3, 224, 224), 6 * 100_000),
}
SYNTHETIC_SHAPE = (60,)
SYNTHETIC_MEAN_SIZE = 2_300  # E[(floor(LogNormal(4, 2)) + 50) * 5] ~ (e^6 + 50) * 5 (fedlib.data.synthetic)
SYNTHETIC_MAX_SIZE = 30_000  # a bound on one client's size there (pFedMe's data set: 250 to 25,810)
# Per class, (training set, test set) of the data sets 'labels' (both pooled), 'shards', 'iid' and 'dirichlet' (the
# training set) split: the files' own counts (the readers check each file's checksum; tests/test_config_bounds.py
# compares these with the files where they are present).
CLASS_COUNTS = {
    "mnist": (
        (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949),
        (980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009),
    ),
    "fmnist": ((6000,) * 10, (1000,) * 10),
    "cifar10": ((5000,) * 10, (1000,) * 10),
}
# how ``fedlib.data.load_federated`` calls the partitioners: 2 shards a client, Dirichlet's default min_size
SHARDS_PER_CLIENT = 2
DIRICHLET_MIN_SIZE = 10
# conv nets take images of at least this side (AlexNet's three 3x3/2 max-pools: 63; fedlib.models.convnets), else any
IMAGE_SIDE_MIN = {"alexnet": 63}

# Copies of every client's model held at the peak (measured peaks, in a fresh process, ``tests/test_memory_estimate.py``:
# FedAvg-like methods 4-6.7 copies, those keeping personal models apart 7-10.8, where each counts its training too):
# the clients' models and those the server sent, the round's stacked uploads and the aggregate's workspace, the
# evaluated models, and the last round's buffers, freed but kept for reuse (``fedlib.runs.malloc``)
STATE_COPIES = 7
PERSONAL_COPIES = 4  # more where clients keep models apart (personal evaluation, a method's personal models)
TRAIN_COPIES = 4  # per trainer: parameters, gradients, momentum, the start point (anchor)
ACTIVATION_COPIES = 3  # forward outputs kept for backward, their gradients, workspace
# Copies of the data set (float32, as read or generated) while it loads (measured: 3.0-3.3): Synthetic's per-client
# arrays, their concatenation and the train and test stacks; an image set's uint8 arrays (kept by the reader), their
# float32 conversion, its normalised copy and the stacks. A run of another dtype then holds a converted copy too.
DATA_LOAD_COPIES = 3.5
ROW_BYTES = 2048  # one evaluated round's metrics row: a dict of ~17 Python numbers (fedlib.core.callbacks.Evaluation)
# a round's mini-batch plan (fedlib.data.federated), per (step, client, row): ``sample_steps``'s float64 draws, their
# int64 rows, the sorted rows and those plus the offsets; ``sample_epochs``: per (epoch, client, row slot) the int64
# index and its weight kept (lists, then concatenated), and one epoch's working tensors (keys, permutation, masks)
STEP_PLAN_BYTES = 32
EPOCH_PLAN_BYTES = 24
EPOCH_WORK_BYTES = 64
# pFedMe's K inner steps (``PFedMeClient``): per (inner step, client, row) the repeated batch's int64 index and the
# chain executor's bool comparison of consecutive steps; per inner step the step vector and a Python list entry
INNER_PLAN_BYTES = 9
INNER_STEP_BYTES = 16


class TooLarge(ValueError):
    """A run, or runs side by side (``--jobs N``), that would need more memory than the machine has: refused before
    anything trains; the command line prints it as one line."""


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1024 or unit == "PB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} PB"


@functools.lru_cache(maxsize=64)
def model_size(name: str, hidden: tuple | None, attention: str, input_shape: tuple, n_classes: int) -> tuple[int, int]:
    """(parameters and buffers, activations per sample) of a model. Parameters are counted on the meta device
    (nothing allocated, whatever the widths); activations from the widths for Linear chains, and for conv nets
    from one real forward pass of the model at its default widths (a forward on the meta device would import
    torch's compiler stack: seconds per process)."""
    spec = MODELS[name]
    kw = {"attention": attention} if spec.attention_slots else {}
    widths = hidden if hidden is not None else spec.default_hidden
    with torch.device("meta"):
        params = sum(t.numel() for t in spec.build(input_shape, n_classes, widths, **kw).state_dict().values())
    if spec.kernel == "chain":
        return params, math.prod(input_shape) * 2 + 2 * sum(widths) + n_classes  # input, flatten, pre/post ReLU
    return params, math.prod(input_shape) + sum(widths) + _conv_activations(name, attention, input_shape, n_classes)


@functools.lru_cache(maxsize=16)
def _conv_activations(name: str, attention: str, input_shape: tuple, n_classes: int) -> int:
    spec = MODELS[name]
    kw = {"attention": attention} if spec.attention_slots else {}
    model = spec.build(input_shape, n_classes, spec.default_hidden, **kw).eval()
    acts = [0]

    def count(module, inputs, output):
        if isinstance(output, torch.Tensor) and not list(module.children()):
            acts[0] += output.numel()

    hooks = [m.register_forward_hook(count) for m in model.modules()]
    with torch.no_grad():
        model(torch.zeros(1, *input_shape))
    for h in hooks:
        h.remove()
    return acts[0]


def estimate(cfg) -> dict[str, float]:
    """Bytes the run of ``cfg`` adds at its peak to a process that has imported fedlib, by part: 'clients' (every
    client's model, ``STATE_COPIES`` of it, and ``PERSONAL_COPIES`` more where the method keeps personal models),
    'training' (each client that trains: the method's ``trains``, all N for FedMCSA or pFedMe, and for an evaluation
    by fine-tuning, FedBABU's), 'data' (the data set at its load, ``DATA_LOAD_COPIES`` of its float32 arrays, a copy
    in the run's dtype where that differs, and the padded evaluation blocks; feature-shift data: one copy of
    ``DATA``'s bound; one more in the run's dtype where the method holds validation rows out of training,
    ``Algorithm.validation``), 'plan', 'records'. It errs high:
    the measured peaks of ``tests/test_memory_estimate.py`` lie between a third of it and all of it; its parts are
    summed, though the data's load copies are freed before the models are built (the allocator keeps them,
    ``fedlib.runs.malloc``, and the run reuses them)."""
    d, m = cfg.data, cfg.model
    b = 8 if cfg.dtype == "float64" else 4
    check_model(cfg)  # model_size builds the model for the data set's inputs
    shape = input_shape(d.dataset)
    params, acts = model_size(m.name, m.hidden, m.attention, shape, 10)  # class count: a rounding error here
    n = d.n_clients
    alg = cfg.method.build(cfg)
    # an evaluation by fine-tuning (FedBABU) trains every client's copy of the global model at once
    trainers = n if alg.trains == "all" or alg.finetune is not None else _selected(cfg)
    personal = alg.evaluate == "personal" or alg.personal is not None or alg.finetune is not None
    values = data_samples(cfg) * math.prod(shape)
    evaluated = 1.0 if cfg.eval_train else 1 - d.train_frac  # rows evaluated per client, padded into blocks
    held = 4 * DATA_LOAD_COPIES + (b if b != 4 else 0) + b * PAD_WASTE * evaluated
    if d.dataset in DOMAINS:  # ``DATA`` counts every domain's whole training set: a bound many times what loads
        held = b
    if alg.validation > 0 and d.val_frac == 0:  # the training split the method's held-out rows leave (FedFomo)
        held += b
    return {
        "clients": n * params * b * (STATE_COPIES + PERSONAL_COPIES * personal),
        "training": trainers * (params * TRAIN_COPIES + cfg.local.batch_size * acts * ACTIVATION_COPIES) * b,
        "data": values * held,
        "plan": plan(cfg),
        "records": records(cfg),
    }


EXACT_SIZES_UP_TO = 10**6  # Synthetic clients whose sizes ``data_samples`` draws (8 MB); beyond, their mean


def data_samples(cfg) -> int:
    """Samples in the data set a run of ``cfg`` loads: Synthetic's drawn sizes (``client_sizes``: heavy-tailed, so
    the largest of 4,000 clients holds 547,550 samples and their mean is not a bound; ``SYNTHETIC_MEAN_SIZE`` a client
    above ``EXACT_SIZES_UP_TO`` clients, where the sample mean falls below it), else the whole data set's."""
    d = cfg.data
    if d.dataset != "synthetic":
        return samples_of(d.dataset)
    if d.n_clients > EXACT_SIZES_UP_TO:
        return d.n_clients * SYNTHETIC_MEAN_SIZE
    return int(client_sizes(cfg).sum())


def _selected(cfg) -> int:
    """Clients selected a round: ``clients_per_round``, or the fraction's (the largest of a schedule's)."""
    n, s = cfg.data.n_clients, cfg.selection
    fraction = max(s.fraction_schedule[:2]) if s.fraction_schedule else s.fraction
    return min(n, s.clients_per_round or math.ceil((fraction or 1.0) * n))


def plan(cfg) -> float:
    """Bytes of a round's mini-batch plan (``fedlib.core.state.Schedule.plan``), drawn for every client that trains
    that round (the method's ``trains``: the selected ones, or all N), and of pFedMe's inner steps: R local steps
    (times the batches a step takes, Per-FedAvg's 2 or 3) x clients x B rows, or E epochs of the largest client's
    rows (``largest_client``); each local step of pFedMe repeats its batch K = ``inner_steps`` times. Unchecked,
    ``local_steps=10**9`` or pFedMe's ``inner_steps=10**9`` would draw a plan of tens of GB before failing."""
    loc = cfg.local
    alg = cfg.method.build(cfg)
    n, s = cfg.data.n_clients, cfg.selection
    k = n if alg.trains == "all" else min(n, s.clients_per_round or math.ceil((s.fraction or 1.0) * n))
    if loc.local_epochs is not None:
        width = math.ceil(largest_client(cfg) / loc.batch_size) * loc.batch_size
        total = k * width * (loc.local_epochs * EPOCH_PLAN_BYTES + EPOCH_WORK_BYTES)
    else:
        total = loc.local_steps * alg.batches_per_step * k * loc.batch_size * STEP_PLAN_BYTES
    inner = getattr(cfg.method, "inner_steps", 0)  # pFedMe's K
    return total + inner * (k * loc.batch_size * INNER_PLAN_BYTES + INNER_STEP_BYTES)


def largest_client(cfg) -> int:
    """A bound on one client's samples: Synthetic's largest size, a client's 2 shards, an IID client's share, else
    the whole data set (Dirichlet and 'labels' sizes vary; a feature-shift client is one domain)."""
    d = cfg.data
    if d.dataset == "synthetic":
        return SYNTHETIC_MAX_SIZE
    if d.partition == "shards":
        return SHARDS_PER_CLIENT * d.shard_size
    if d.partition == "iid" and d.dataset in CLASS_COUNTS:
        return -(-sum(CLASS_COUNTS[d.dataset][0]) // d.n_clients)
    return samples_of(d.dataset)


def records(cfg) -> float:
    """Bytes of what ``fedlib.core.simulation.simulate`` records over the run: 'selected' (rounds x N, bool); per evaluated
    round (every ``eval_every`` and the last) every client's accuracy and loss (float64, kept in lists and then copied
    into arrays: 4 x 8 bytes a client) and the metrics row; AdaFL's selection scores (rounds x N float64, list and
    array; Power-of-Choice's candidate losses the same); the attention trace of a method that keeps one
    (``Algorithm.traces``), as if of a model of 7 parameter tensors, up to its cap (N = 100: 5.6 MB). Unchecked,
    ``rounds=10**9`` would pass every other check and then fail allocating 'selected'."""
    n, rounds = cfg.data.n_clients, cfg.rounds
    evaluated = -(-rounds // cfg.eval_every) + 1
    total = rounds * n + evaluated * (4 * 8 * n + ROW_BYTES)
    if cfg.selection.rule in ("attention", "power_of_choice"):
        total += 2 * 8 * rounds * n
    if "attention" in cfg.method.build(cfg).traces:
        total += min(ATTENTION_TRACE_BYTES, 10 * (7 + 1) * 8 * n * n)
    return total


def run_bytes(est: dict) -> float:
    """The part of ``estimate`` each run of a unit holds on its own: all but the data, which the unit loads once."""
    return sum(v for k, v in est.items() if k != "data")


def check(cfg, limit: int | None = None) -> dict[str, float]:
    """Raise ``ValueError`` when ``cfg``'s estimated peak memory exceeds ``limit`` (default: ``available_bytes``);
    returns the estimate. The data set must also hold what the partition cuts (``check_data``), the model must take
    its inputs (``check_model``), and every client must get a sample to train on and, where the clients' splits are
    the test data, one to test on (``check_clients``: after the memory check, which bounds the clients to draw)."""
    d = cfg.data
    check_data(cfg)
    check_model(cfg)
    most = d.n_clients * SYNTHETIC_MAX_SIZE if d.dataset == "synthetic" else samples_of(d.dataset)
    if cfg.local.batch_size > most:
        raise ValueError(
            f"RunConfig.batch_size={cfg.local.batch_size} exceeds the {most} samples dataset={d.dataset!r} can have "
            f"(n_clients={d.n_clients}): a batch is drawn from one client's data"
        )
    parts = estimate(cfg)
    limit = limit if limit is not None else hardware.available_bytes(cfg.resolved_device())
    total = sum(parts.values())
    if limit is not None and total > limit:
        detail = ", ".join(f"{k} {_bytes(v)}" for k, v in parts.items())
        raise TooLarge(
            f"RunConfig: this run would need about {_bytes(total)} of memory ({detail}), more than the "
            f"{_bytes(limit)} available; lower n_clients, the model's hidden widths, batch_size, local_steps or "
            "local_epochs (pFedMe: inner_steps), clients_per_round or rounds"
        )
    check_clients(cfg)
    return parts


def check_data(cfg) -> None:
    """Raise ``ValueError`` naming the field and its limit when the data set has too few samples for what the
    partition cuts: N clients at all, an IID client a sample each, 2 shards of ``shard_size`` each, a Dirichlet
    client ``DIRICHLET_MIN_SIZE`` samples (from its training set: those partitions keep its test set apart)."""
    d = cfg.data
    if d.dataset in own.USER_DATASETS:  # in memory already: cut it as the run will (the partitioners name what fails)
        own.load(d)
        return
    if d.dataset != "synthetic" and d.dataset in DATA and d.n_clients > DATA[d.dataset][1]:
        raise ValueError(
            f"RunConfig.n_clients={d.n_clients} exceeds the {DATA[d.dataset][1]} samples of dataset={d.dataset!r}"
        )
    if d.dataset not in CLASS_COUNTS or d.partition == "labels":
        return
    n_train, n = sum(CLASS_COUNTS[d.dataset][0]), d.n_clients
    of = f"the {n_train} training samples of dataset={d.dataset!r} (partition={d.partition!r} splits those)"
    if d.partition == "iid" and n > n_train:
        raise ValueError(f"RunConfig.n_clients={n} must be <= {n_train}: one sample a client at least, of {of}")
    if d.partition == "dirichlet" and n * DIRICHLET_MIN_SIZE > n_train:
        raise ValueError(
            f"RunConfig.n_clients={n} must be <= {n_train // DIRICHLET_MIN_SIZE}: every client gets at least "
            f"{DIRICHLET_MIN_SIZE} of {of}"
        )
    if d.partition == "shards":
        if n * SHARDS_PER_CLIENT > n_train:
            raise ValueError(
                f"RunConfig.n_clients={n} must be <= {n_train // SHARDS_PER_CLIENT}: {SHARDS_PER_CLIENT} shards of "
                f"at least one sample a client, of {of}"
            )
        most = n_train // (n * SHARDS_PER_CLIENT)
        if d.shard_size > most:
            raise ValueError(
                f"RunConfig.shard_size={d.shard_size} must be <= {most} with n_clients={n}: {n} clients x "
                f"{SHARDS_PER_CLIENT} shards x {d.shard_size} = {n * SHARDS_PER_CLIENT * d.shard_size} samples, more "
                f"than {of}"
            )


def input_shape(dataset: str) -> tuple:
    """The shape of one input of ``dataset``: Synthetic's feature vectors, the others' (C, H, W) images, a user data
    set's own (``fedlib.data.own.info``)."""
    if dataset in own.USER_DATASETS:
        return own.info(dataset)[0]
    return SYNTHETIC_SHAPE if dataset == "synthetic" else DATA[dataset][0]


def n_classes(dataset: str) -> int:
    """The classes of ``dataset``: 10, the feature-shift sets' own (Office-31: 31), a user data set's."""
    if dataset in own.USER_DATASETS:
        return own.info(dataset)[1]
    return len(CLASSES[dataset]) if dataset in CLASSES else 10


def samples_of(dataset: str) -> int:
    """Samples in the whole of ``dataset`` (not Synthetic, generated per client)."""
    return own.info(dataset)[2] if dataset in own.USER_DATASETS else DATA[dataset][1]


def takes(model: str, shape: tuple) -> bool:
    """Whether registry model ``model`` takes inputs of ``shape``: a Linear chain (``kernel`` 'chain') flattens any
    input; a conv net needs (C, H, W) images of at least ``IMAGE_SIDE_MIN`` a side; a user model is asked
    (``check_model``)."""
    if MODELS[model].version is not None:
        return True  # check_model runs it on the data set's inputs
    if MODELS[model].kernel == "chain":
        return True
    return len(shape) == 3 and min(shape[1:]) >= IMAGE_SIDE_MIN.get(model, 1)


def check_model(cfg) -> None:
    """Raise ``ValueError`` naming the model, the data set and the models that take its inputs when the model does
    not, before the data loads (else LeNet on Synthetic would fail with "not enough values to unpack", AlexNet on
    MNIST in a conv2d, after the data had loaded). A user model (``fedlib.register_model``) is built for the data
    set's inputs and classes and run on two inputs: it must give one logit per class (``check_output``)."""
    name, dataset = cfg.model.name, cfg.data.dataset
    shape = input_shape(dataset)
    if MODELS[name].version is not None:
        m = cfg.model
        check_output(name, shape, n_classes(dataset), m.hidden, m.attention, where=f"RunConfig (dataset={dataset!r}): ")
        return
    if takes(name, shape):
        return
    has = f"{shape} feature vectors" if len(shape) != 3 else f"{shape[1]}x{shape[2]} images"
    needs = (
        f"is a conv net and needs images of at least {IMAGE_SIDE_MIN.get(name, 1)}x{IMAGE_SIDE_MIN.get(name, 1)}"
        if len(shape) == 3
        else "is a conv net and needs (C, H, W) images"
    )
    allowed = ", ".join(m for m in MODELS if takes(m, shape))
    raise ValueError(
        f"RunConfig.model={name!r} {needs}, but dataset={dataset!r} has {has}; models for dataset={dataset!r}: {allowed}"
    )


def client_sizes(cfg) -> np.ndarray | None:
    """Every client's samples (before its train/test split) as ``fedlib.data.load_federated`` will cut them, from
    the config alone: Synthetic's generated sizes (the generator's first draw), the 'labels' and 'dirichlet'
    partitions' draws from the class counts (``partition.labels_per_client_sizes``, ``partition.dirichlet_sizes``),
    2 shards each, an IID share. None for feature-shift data (one client per domain, split by its recipe). Cached;
    read-only."""
    d = cfg.data
    if d.dataset not in CLASS_COUNTS and d.dataset != "synthetic":
        return None
    return _client_sizes(
        d.dataset,
        d.partition,
        d.n_clients,
        d.labels_per_client,
        d.label_stride,
        d.shard_size,
        d.dirichlet_alpha,
        d.data_seed,
    )


@functools.lru_cache(maxsize=64)
def _client_sizes(dataset, partition_name, n, k, stride, shard_size, alpha, seed) -> np.ndarray:
    if dataset == "synthetic":  # fedlib.data.synthetic: sizes = (floor(LogNormal(4, 2)) + 50) * 5, drawn first
        sizes = (np.random.RandomState(seed).lognormal(4, 2, n).astype(int) + 50) * 5
    elif partition_name == "labels":
        sizes = partition.labels_per_client_sizes(np.add(*CLASS_COUNTS[dataset]), n, k, seed, label_stride=stride)
    elif partition_name == "dirichlet":
        sizes = partition.dirichlet_sizes(CLASS_COUNTS[dataset][0], n, alpha, seed, DIRICHLET_MIN_SIZE)
    elif partition_name == "shards":
        sizes = np.full(n, SHARDS_PER_CLIENT * shard_size)
    else:  # iid: np.array_split of the training set
        q, r = divmod(sum(CLASS_COUNTS[dataset][0]), n)
        sizes = np.array([q + 1] * r + [q] * (n - r))
    sizes = np.asarray(sizes, dtype=np.int64)
    sizes.flags.writeable = False
    return sizes


def check_clients(cfg) -> None:
    """Raise ``ValueError`` naming the fields when a client of ``cfg`` would hold no sample, no training sample
    (``int(train_frac * size)``, ``partition.split_train_test``'s rule) or, where its split is the test data
    (``config.OWN_TEST``), no test sample: else loading the data would fail on the first ("every client needs at
    least one training sample"), and a run with no test data would store NaN metrics."""
    d = cfg.data
    try:
        sizes = client_sizes(cfg)
    except ValueError as e:  # Dirichlet draws that never give every client its minimum
        raise ValueError(
            f"RunConfig: partition='dirichlet' with n_clients={d.n_clients}, dirichlet_alpha={d.dirichlet_alpha} and "
            f"data_seed={d.data_seed} leaves some client fewer than {DIRICHLET_MIN_SIZE} samples in every draw "
            f"({e}); lower n_clients or raise dirichlet_alpha"
        ) from None
    if sizes is None:
        return
    empty = np.flatnonzero(sizes == 0)
    if empty.size:
        raise ValueError(
            f"RunConfig.n_clients={d.n_clients} is too many for partition={d.partition!r} with labels_per_client="
            f"{d.labels_per_client} and data_seed={d.data_seed}: {empty.size} clients (the first: client "
            f"{empty[0]}) would hold no sample (each label's samples are cut among its holders in turn, each taking "
            "between 1/(holders + 1) and half of what is left, so with many holders the last ones get none); lower "
            "n_clients"
        )
    n_train = (d.train_frac * sizes).astype(np.int64)  # split_train_test: int(train_frac * n) per client
    i = int(np.argmin(sizes))  # the smallest client keeps the fewest
    if n_train[i] < 1:
        raise ValueError(
            f"RunConfig.train_frac={d.train_frac!r} leaves client {i} of its {sizes[i]} samples none to train on "
            f"(int(train_frac * {sizes[i]}) = 0): train_frac must be at least 1/{sizes[i]} here (the smallest "
            f"client of dataset={d.dataset!r}, partition={d.partition!r}, n_clients={d.n_clients})"
        )
    from fedlib.config.run import OWN_TEST

    if d.partition in OWN_TEST and int((sizes - n_train).min()) < 1:
        raise ValueError(
            f"RunConfig.train_frac={d.train_frac!r} leaves a client of partition={d.partition!r} no test sample: "
            "its clients' splits are the run's only test data"
        )
