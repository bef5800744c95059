"""APFL and FedALA: golden two-client rounds on both executors (by hand, and against plain autograd transcriptions of
the papers' client loops in float64), their reductions to FedAvg, the executors agreeing on the methods' own state,
and their options' bounds."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import simulate_with, small_synthetic
from torch.func import functional_call

from fedlib.algorithms import build_algorithm
from fedlib.config.run import RunConfig
from fedlib.core.state import evaluation_params
from fedlib.data.federated import FederatedData
from fedlib.executors import LoopExecutor, StackedExecutor
from fedlib.models.registry import build_model

EXECUTORS = [StackedExecutor, LoopExecutor]


def _two_clients():
    """Client 0: one training row x=(1,0) label 0; client 1: three rows x=(0,1) label 1; one test row each, the same
    as its training rows. Every mini-batch of a client is its one row, whatever the draws."""
    x = np.array([[1, 0], [0, 1], [0, 1], [0, 1], [1, 0], [0, 1]], dtype=np.float64)
    y = np.array([0, 1, 1, 1, 0, 1])
    return FederatedData.from_parts(
        "two", x, y, [np.array([0]), np.array([1, 2, 3])], [np.array([4]), np.array([5])], 2
    )


ROWS = [(torch.tensor([[1.0, 0.0]], dtype=torch.float64), torch.tensor([0])),
        (torch.tensor([[0.0, 1.0]], dtype=torch.float64), torch.tensor([1]))]  # fmt: skip
SHARE = [0.25, 0.75]  # FedAvg's weights: 1 and 3 training rows


def _mlr():
    model = build_model("mlr", (2,), 2, dtype=torch.float64)
    for p in model.parameters():
        torch.nn.init.zeros_(p)
    return model


def _run(cfg, executor, data=None, model=None):
    data = _two_clients() if data is None else data
    model = _mlr() if model is None else model
    return simulate_with(build_algorithm(cfg, n_samples=data.train.sizes.numpy()), data, model, executor,
                         cfg.rounds, local_steps=cfg.local_steps, local_epochs=cfg.local_epochs,
                         batch_size=cfg.batch_size, seed=cfg.seed, progress=False)  # fmt: skip


def _loss(model, params, x, y):
    return F.cross_entropy(functional_call(model, params, (x,)), y)


def _grad(model, params, x, y):
    p = {n: t.clone().requires_grad_(True) for n, t in params.items()}
    return dict(zip(p, torch.autograd.grad(_loss(model, p, x, y), list(p.values()))))


# -- APFL ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("executor", EXECUTORS)
def test_apfl_first_step_by_hand(executor):
    """Zero MLR, one step, lr 0.5, alpha 0.25: softmax(0) = (1/2, 1/2), so client 0's gradient is grad_b = (-1/2, 1/2),
    grad_W = [[-1/2, 0], [1/2, 0]] at w and at vbar (both 0). w steps to b = (1/4, -1/4), W = [[1/4, 0], [-1/4, 0]];
    v by alpha times that: b = (1/16, -1/16), W = [[1/16, 0], [-1/16, 0]]; alpha's gradient <v - w, g> is 0 (v = w
    at the step), so alpha stays 1/4. Client 1 mirrors it. The global model is FedAvg's: b = (-1/8, 1/8),
    W = [[1/16, -3/16], [-1/16, 3/16]]. Evaluated: vbar_i = v_i / 4 + 3 w / 4 with the global w."""
    cfg = RunConfig(n_clients=2, clients_per_round=2, rounds=1, lr=0.5, local_steps=1, batch_size=1,
                    algorithm="apfl", apfl_alpha=0.25)  # fmt: skip
    res = _run(cfg, executor())
    t = lambda v: torch.tensor(v, dtype=torch.float64)
    st = res.state.extra["apfl"]
    assert torch.equal(st.v["1.bias"], t([[1 / 16, -1 / 16], [-1 / 16, 1 / 16]]))
    assert torch.equal(st.v["1.weight"], t([[[1 / 16, 0], [-1 / 16, 0]], [[0, -1 / 16], [0, 1 / 16]]]))
    assert torch.equal(st.alpha["alpha"], t([0.25, 0.25]))
    assert torch.equal(res.state.global_params["1.bias"], t([-1 / 8, 1 / 8]))
    assert torch.equal(res.state.global_params["1.weight"], t([[1 / 16, -3 / 16], [-1 / 16, 3 / 16]]))
    # test rows: client 0's x=(1,0) has logits W[:, 0] + b: v's (1/8, -1/8), the global model's (-1/16, 1/16), so
    # vbar's 1/4 (1/8, -1/8) + 3/4 (-1/16, 1/16) = (-1/64, 1/64): class 1, wrong; client 1's x=(0,1): v's (-1/8, 1/8),
    # the global's (-5/16, 5/16), vbar's (-17/64, 17/64): class 1, right
    assert res.client_acc.tolist() == [[0.0, 1.0]]
    ce = lambda z, c: float(F.cross_entropy(t([z, -z])[None], torch.tensor([c])))
    assert res.metrics.test_loss.iloc[0] == pytest.approx((ce(-1 / 64, 0) + ce(-17 / 64, 1)) / 2, rel=0, abs=1e-15)
    assert res.metrics.gm_test_acc.iloc[0] == 0.5


def _apfl_reference(model, rounds, steps, lr, alpha0, alpha_lr):
    """APFL's client loop (the paper's three updates per step, from the values before it) and FedAvg's server,
    by autograd, both clients selected every round."""
    w_glob = {n: t.clone() for n, t in model.state_dict().items()}
    v = [{n: t.clone() for n, t in w_glob.items()} for _ in ROWS]
    alpha = [torch.tensor(alpha0, dtype=torch.float64) for _ in ROWS]
    for _ in range(rounds):
        uploads = []
        for i, (x, y) in enumerate(ROWS):
            w = {n: t.clone() for n, t in w_glob.items()}
            for _ in range(steps):
                a = alpha[i]
                vbar = {n: a * v[i][n] + (1 - a) * w[n] for n in w}
                g, gw = _grad(model, vbar, x, y), _grad(model, w, x, y)
                da = sum(((v[i][n] - w[n]) * g[n]).sum() for n in w)
                v[i] = {n: v[i][n] - lr * a * g[n] for n in w}
                alpha[i] = (a - alpha_lr * da).clamp(0, 1)
                w = {n: w[n] - lr * gw[n] for n in w}
            uploads.append(w)
        w_glob = {n: sum(s * u[n] for s, u in zip(SHARE, uploads)) for n in w_glob}
    return w_glob, v, alpha


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("alpha_lr", [None, 2.0])
def test_apfl_two_rounds_match_the_reference(executor, alpha_lr):
    """Three local steps, two rounds: the global model, every v_i and alpha_i, and the personal models' test loss
    (vbar_i = alpha_i v_i + (1 - alpha_i) w with the final global w) as a direct transcription computes them; alpha
    moves (its step the round's lr, or its own)."""
    cfg = RunConfig(n_clients=2, clients_per_round=2, rounds=2, lr=0.5, local_steps=3, batch_size=1,
                    algorithm="apfl", apfl_alpha=0.25, apfl_alpha_lr=alpha_lr)  # fmt: skip
    model = _mlr()  # the reference first: the loop executor trains in the module
    w, v, alpha = _apfl_reference(model, 2, 3, 0.5, 0.25, 0.5 if alpha_lr is None else alpha_lr)
    res = _run(cfg, executor(), model=model)
    st = res.state.extra["apfl"]
    for n in w:
        assert torch.allclose(res.state.global_params[n], w[n], rtol=0, atol=1e-14), n
        for i in range(2):
            assert torch.allclose(st.v[n][i], v[i][n], rtol=0, atol=1e-14), (n, i)
    got = st.alpha["alpha"]
    assert torch.allclose(got, torch.stack(alpha), rtol=0, atol=1e-14)
    assert not torch.allclose(got, torch.full_like(got, 0.25), rtol=0, atol=1e-6)  # alpha learned
    losses = [_loss(model, {n: a * vi[n] + (1 - a) * w[n] for n in w}, x, y) for a, vi, (x, y) in zip(alpha, v, ROWS)]
    assert res.metrics.test_loss.iloc[-1] == pytest.approx(float(sum(losses) / 2), rel=0, abs=1e-13)


def test_apfl_alpha_is_clipped_to_the_unit_interval():
    """A huge step size throws alpha past 0 or 1 at once: it stays inside [0, 1], as the reference's clip."""
    cfg = RunConfig(n_clients=2, clients_per_round=2, rounds=2, lr=0.5, local_steps=3, batch_size=1,
                    algorithm="apfl", apfl_alpha=0.5, apfl_alpha_lr=1e6)  # fmt: skip
    model = _mlr()
    _, _, alpha = _apfl_reference(model, 2, 3, 0.5, 0.5, 1e6)
    got = _run(cfg, StackedExecutor(), model=model).state.extra["apfl"].alpha["alpha"]
    assert torch.equal(got, torch.stack(alpha)) and set(got.tolist()) <= {0.0, 1.0}


@pytest.mark.parametrize("executor", EXECUTORS)
def test_apfl_with_alpha_fixed_at_zero_is_fedavg(executor):
    """alpha = 0 and apfl_alpha_lr = 0: w_i trains as FedAvg's client on the same batches and the personal models are
    the global model, bit for bit, so the accuracies are FedAvg's (gm_* and test_* alike); the test loss too, to the
    last bits in which evaluating every client's copy of a model and the one model sum differently."""
    data = small_synthetic(n_clients=5, rows=80)
    base = RunConfig(n_clients=5, clients_per_round=3, rounds=3, local_steps=4, batch_size=8, model="dnn", lr=0.1)
    model = lambda: build_model("dnn", data.input_shape, 10, (8,), seed=0, dtype=torch.float64)
    fedavg = _run(base, executor(), data, model())
    apfl = _run(base.replace(algorithm="apfl", apfl_alpha=0.0, apfl_alpha_lr=0.0), executor(), data, model())
    for n, t in fedavg.state.global_params.items():
        assert torch.equal(apfl.state.global_params[n], t), n
    personal, per_client = evaluation_params(build_algorithm(base.replace(algorithm="apfl")), apfl.state)
    assert per_client and all(torch.equal(personal[n], t.expand_as(personal[n])) for n, t in
                              apfl.state.global_params.items())  # fmt: skip
    assert np.allclose(apfl.metrics.test_loss, fedavg.metrics.test_loss, rtol=0, atol=1e-14)
    assert np.array_equal(apfl.metrics.test_acc, fedavg.metrics.test_acc)
    assert np.array_equal(apfl.metrics.gm_test_acc, apfl.metrics.test_acc)
    assert torch.equal(apfl.state.extra["apfl"].alpha["alpha"], torch.zeros(5, dtype=torch.float64))
    # with alpha fixed at 1/2 the personal models differ from the global one
    half = _run(base.replace(algorithm="apfl", apfl_alpha=0.5, apfl_alpha_lr=0.0), executor(), data, model())
    assert not np.array_equal(half.metrics.test_loss, fedavg.metrics.test_loss)
    assert torch.equal(half.state.extra["apfl"].alpha["alpha"], torch.full((5,), 0.5, dtype=torch.float64))


def test_apfl_executors_agree_on_v_and_alpha_over_epochs():
    """Unequal clients over local epochs (short last batches, clients idle after their epoch): the loop and stacked
    executors give the same v_i and alpha_i in float64."""
    data = small_synthetic(n_clients=5, rows=80)
    cfg = RunConfig(n_clients=5, clients_per_round=3, rounds=3, local_steps=None, local_epochs=1, batch_size=7,
                    model="dnn", lr=0.1, algorithm="apfl", apfl_alpha=0.3, apfl_alpha_lr=0.5)  # fmt: skip
    runs = [_run(cfg, ex(), data, build_model("dnn", data.input_shape, 10, (8,), seed=0, dtype=torch.float64))
            for ex in EXECUTORS]  # fmt: skip
    a, b = (r.state.extra["apfl"] for r in runs)
    assert torch.allclose(a.alpha["alpha"], b.alpha["alpha"], rtol=0, atol=1e-10)
    assert not torch.allclose(a.alpha["alpha"], torch.full((5,), 0.3, dtype=torch.float64))
    for n in a.v:
        assert torch.allclose(a.v[n], b.v[n], rtol=0, atol=1e-10), n


# -- FedALA --------------------------------------------------------------------------------------------------------
def _ala_reference(model, own, glob, W, x, y, batches, eta, first, top, threshold, window, cap):
    """The authors' ALA for one client whose sample is ``batches`` copies of its one row: per batch the loss of the
    mix, W <- clip(W - eta grad * (glob - own), 0, 1); an epoch's last loss recorded; the start phase until the std of
    the last ``window`` losses is below ``threshold`` (after more than ``window``), or ``cap`` epochs."""
    W = {n: t.clone() for n, t in W.items()}

    def mix():
        return {n: own[n] + (glob[n] - own[n]) * W[n] if n in top else glob[n] for n in glob}

    losses, epochs = [], 0
    while True:
        for _ in range(batches):
            th = {n: t.clone().requires_grad_(True) for n, t in mix().items()}
            loss = _loss(model, th, x, y)
            grads = dict(zip(th, torch.autograd.grad(loss, list(th.values()))))
            W = {n: (W[n] - eta * grads[n] * (glob[n] - own[n])).clamp(0, 1) for n in W}
        losses.append(float(loss.detach()))
        epochs += 1
        if not first or epochs == cap or (len(losses) > window and np.std(losses[-window:]) < threshold):
            return W, mix(), epochs


def _fedala_reference(model, rounds, lr, eta, top, threshold=0.1, window=10, cap=100):
    glob = {n: t.clone() for n, t in model.state_dict().items()}
    own = [{n: t.clone() for n, t in glob.items()} for _ in ROWS]
    W = [{n: torch.ones_like(glob[n]) for n in top} for _ in ROWS]
    batches = [1, 2]  # s = 80%: max(1, floor(0.8)) = 1 row, floor(2.4) = 2 rows, batches of one
    epochs = []
    for t in range(rounds):
        uploads = []
        for i, (x, y) in enumerate(ROWS):
            start = glob
            if t >= 1:
                W[i], start, e = _ala_reference(model, own[i], glob, W[i], x, y, batches[i], eta, t == 1, top,
                                                threshold, window, cap)  # fmt: skip
                epochs.append(e)
            g = _grad(model, start, x, y)
            own[i] = {n: start[n] - lr * g[n] for n in start}
            uploads.append(own[i])
        glob = {n: sum(s * u[n] for s, u in zip(SHARE, uploads)) for n in glob}
    return glob, own, W, epochs


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("layers", [1, 2])
def test_fedala_three_rounds_match_the_reference(executor, layers):
    """Round 1 trains from the global model (no local model yet); round 2 is the start phase (W until the loss
    settles), round 3 one epoch; with p = 1 only the bias is mixed and the weight takes the global values, with
    p = 2 both. The global model, each client's local (personal) model and its W as the transcription computes them."""
    cfg = RunConfig(n_clients=2, clients_per_round=2, rounds=3, lr=0.5, local_steps=1, batch_size=1,
                    algorithm="fedala", ala_layers=layers)  # fmt: skip
    model = _mlr()
    top = ["1.weight", "1.bias"][2 - layers :]
    glob, own, W, epochs = _fedala_reference(model, 3, 0.5, 1.0, top)
    res = _run(cfg, executor(), model=model)
    assert epochs[:2] != [1, 1] and min(epochs[:2]) > 10 and epochs[2:] == [1, 1]  # start phase, then one epoch
    st = res.state.extra["fedala"]
    assert sorted(st.W) == sorted(top) and st.seen["rounds"].tolist() == [3, 3]
    for n in glob:
        assert torch.allclose(res.state.global_params[n], glob[n], rtol=0, atol=1e-13), n
        for i in range(2):
            assert torch.allclose(res.state.client_params[n][i], own[i][n], rtol=0, atol=1e-13), (n, i)
    for n in top:
        for i in range(2):
            assert torch.allclose(st.W[n][i], W[i][n], rtol=0, atol=1e-13), (n, i)
    assert any(bool((W[i][n] < 1).any()) for i in range(2) for n in top)  # W learned
    assert any(bool((W[i][n] > 0).any() & (W[i][n] < 1).any()) for i in range(2) for n in top) or layers == 1


class _Counting(LoopExecutor):
    def __init__(self):
        self.calls = 0

    def train(self, *a, **k):
        self.calls += 1
        return super().train(*a, **k)


def test_fedala_start_phase_stops_at_its_cap():
    """A threshold no loss reaches: the start phase runs ``ala_max_epochs`` epochs of the sample's batches (client
    1's two): round 1 one training call, round 2 four epochs x two probe calls and the training call."""
    cfg = RunConfig(n_clients=2, clients_per_round=2, rounds=2, lr=0.5, local_steps=1, batch_size=1,
                    algorithm="fedala", ala_threshold=1e-300, ala_max_epochs=4)  # fmt: skip
    model = _mlr()
    glob, own, W, epochs = _fedala_reference(model, 2, 0.5, 1.0, ["1.weight", "1.bias"], threshold=1e-300, cap=4)
    spy = _Counting()
    res = _run(cfg, spy, model=model)
    assert spy.calls == 1 + 4 * 2 + 1
    assert epochs == [4, 4]
    for n in glob:
        assert torch.allclose(res.state.global_params[n], glob[n], rtol=0, atol=1e-13), n


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fedala_with_eta_zero_is_fedavg(executor):
    """W stays at ones: every client starts from the global model (lerp at W = 1 is exactly it), trains as FedAvg's
    client and uploads the same model, and no sample is drawn: the global model is FedAvg's bit for bit."""
    data = small_synthetic(n_clients=5, rows=80)
    base = RunConfig(n_clients=5, clients_per_round=3, rounds=4, local_steps=4, batch_size=8, model="dnn", lr=0.1)
    model = lambda: build_model("dnn", data.input_shape, 10, (8,), seed=0, dtype=torch.float64)
    fedavg = _run(base, executor(), data, model())
    ala = _run(base.replace(algorithm="fedala", ala_eta=0.0), executor(), data, model())
    for n, t in fedavg.state.global_params.items():
        assert torch.equal(ala.state.global_params[n], t), n
    assert np.array_equal(ala.metrics.gm_test_acc, fedavg.metrics.test_acc)
    learned = _run(base.replace(algorithm="fedala"), executor(), data, model())
    assert not torch.equal(learned.state.global_params["3.bias"], fedavg.state.global_params["3.bias"])


def test_fedala_executors_agree_on_w_over_epochs():
    """Unequal clients, local epochs and partial participation (clients reaching their start phase in different
    rounds, short ALA batches): the loop and stacked executors learn the same W and models in float64; lower layers
    start from the global model."""
    data = small_synthetic(n_clients=5, rows=80)
    cfg = RunConfig(n_clients=5, clients_per_round=3, rounds=5, local_steps=None, local_epochs=1, batch_size=7,
                    model="dnn", lr=0.1, algorithm="fedala", ala_rand_percent=50.0, ala_max_epochs=15)  # fmt: skip
    runs = [_run(cfg, ex(), data, build_model("dnn", data.input_shape, 10, (8,), seed=0, dtype=torch.float64))
            for ex in EXECUTORS]  # fmt: skip
    a, b = (r.state.extra["fedala"] for r in runs)
    assert sorted(a.W) == ["3.bias", "3.weight"] and torch.equal(a.seen["rounds"], b.seen["rounds"])
    assert int(a.seen["rounds"].max()) >= 3  # some client ran its start phase and a later epoch
    for n in a.W:
        assert torch.allclose(a.W[n], b.W[n], rtol=0, atol=1e-10), n
        assert bool((a.W[n] < 1).any())
    for n, t in runs[0].state.client_params.items():
        assert torch.allclose(t, runs[1].state.client_params[n], rtol=0, atol=1e-10), n


# -- options -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, message",
    [
        (dict(algorithm="apfl", apfl_alpha=1.5), r"apfl_alpha=1.5 must be in \[0, 1\]"),
        (dict(algorithm="apfl", apfl_alpha_lr=-1.0), r"apfl_alpha_lr=-1.0 must be a number >= 0"),
        (dict(algorithm="apfl", momentum=0.9), r"momentum set but algorithm='apfl' takes plain gradient steps"),
        (dict(algorithm="fedala", ala_layers=0), r"ala_layers=0 must be a number >= 1"),
        (dict(algorithm="fedala", ala_rand_percent=0.0), r"ala_rand_percent=0.0 must be in \(0, 100\]"),
        (dict(algorithm="fedala", ala_rand_percent=120.0), r"ala_rand_percent=120.0 must be in \(0, 100\]"),
        (dict(algorithm="fedala", ala_eta=-0.1), r"ala_eta=-0.1 must be a number >= 0"),
        (dict(algorithm="fedala", ala_threshold=0.0), r"ala_threshold=0.0 must be > 0"),
    ],
)
def test_bad_options_are_refused_before_training(change, message):
    with pytest.raises(ValueError, match=message):
        RunConfig(**change).validate()


def test_fedala_sample_is_s_percent_of_each_clients_rows_in_right_aligned_batches():
    """floor(s/100 n_i) distinct rows of client i (at least one), cut into batches of B placed at the epoch's last
    steps, the last batch short (padding weighted 0); with batch statistics a last batch of one row is dropped;
    clients not in ALA have no batch."""
    from fedlib.algorithms.fedala import ALASample

    data = small_synthetic(n_clients=4, rows=80)  # 60 training rows each
    sizes, offsets = data.train.sizes.tolist(), data.train.offsets.tolist()
    which = torch.tensor([True, True, False, True])
    s = ALASample.draw(data.train, torch.arange(4), which, 50.0, 7, torch.Generator().manual_seed(0))
    assert s.steps == 5 and not s.active[:, 2].any()  # 30 rows: 4 batches of 7 and one of 2
    for j in (0, 1, 3):
        real = s.weight[:, j] > 0
        rows = s.index[:, j][real]
        assert len(rows) == len(set(rows.tolist())) == sizes[j] // 2
        assert all(offsets[j] <= r < offsets[j] + sizes[j] for r in rows.tolist())
        assert s.active[:, j].tolist() == [True] * 5 and real.sum(1).tolist() == [7, 7, 7, 7, 2]
    other = ALASample.draw(data.train, torch.arange(4), which, 50.0, 7, torch.Generator().manual_seed(1))
    assert not torch.equal(other.index, s.index)  # drawn, not the first rows
    bn = ALASample.draw(data.train, torch.arange(4), which, 50.0, 29, torch.Generator().manual_seed(0), True)
    assert (bn.weight > 0).sum((0, 2)).tolist() == [29, 29, 0, 29]  # 30 = 29 + 1: the single row dropped
    short = ALASample.draw(data.train, torch.arange(4), which, 0.5, 7, torch.Generator().manual_seed(0))
    assert (short.weight > 0).sum((0, 2)).tolist() == [1, 1, 0, 1] and short.steps == 1  # at least one row
    two = _two_clients()  # 1 and 3 rows: client 0's one batch is the epoch's last step
    aligned = ALASample.draw(two.train, torch.arange(2), torch.tensor([True, True]), 100.0, 1, torch.Generator())
    assert aligned.active.tolist() == [[False, True], [False, True], [True, True]]
