"""kiln.nn.RNN, LSTM (dropout, proj_size) and GRU against PyTorch 1.13 with the same weights:
outputs, final states and the gradients w.r.t. the input, the initial state and every
parameter; dropout between layers; errors."""
import numpy as np
import pytest
import torch

import kiln as kl
from torch_testing import close

torch.set_num_threads(1)
rng = np.random.default_rng(0)


def key(i):
    return kl.random.key(i)


def randn(*shape):
    return rng.standard_normal(shape)


def torch_name(name, directions):
    """cells.{i}.weight_ih -> weight_ih_l{i // D}{_reverse}: PyTorch's name of a kiln leaf."""
    _, i, param = name.split(".")
    i = int(i)
    return f"{param}_l{i // directions}" + ("_reverse" if i % directions else "")


def torch_copy(layer, ref):
    """Copies the kiln layer's parameters into the torch module (every one of them)."""
    d = 2 if layer.bidirectional else 1
    names = kl.nn.named_parameters(layer)
    assert sorted(torch_name(n, d) for n, _ in names) == sorted(
        n for n, _ in ref.named_parameters()
    )
    with torch.no_grad():
        for n, t in names:
            getattr(ref, torch_name(n, d)).copy_(torch.from_numpy(np.asarray(t)))


KINDS = {"RNN": torch.nn.RNN, "LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU}

CASES = [
    ("RNN", dict()),
    ("RNN", dict(nonlinearity="relu", num_layers=2, bidirectional=True)),
    ("RNN", dict(bias=False, batch_first=True, num_layers=3)),
    ("LSTM", dict(num_layers=2, bidirectional=True)),
    ("LSTM", dict(proj_size=2)),
    ("LSTM", dict(proj_size=3, num_layers=2, bidirectional=True, batch_first=True)),
    ("LSTM", dict(proj_size=1, bias=False, num_layers=2)),
    ("GRU", dict(num_layers=2, batch_first=True, bidirectional=True)),
]


@pytest.mark.parametrize("kind,options", CASES)
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_state", [True, False])
def test_sequence_layers_match_torch(kind, options, batched, with_state):
    layer = getattr(kl.nn, kind)(3, 4, key(1), dtype=kl.float64, **options)
    ref = KINDS[kind](3, 4, **options).double()
    torch_copy(layer, ref)
    T, N = 5, 2
    layers = options.get("num_layers", 1) * (2 if options.get("bidirectional") else 1)
    h_size = options.get("proj_size", 0) or 4
    x = randn(*((N, T, 3) if options.get("batch_first") else (T, N, 3))) if batched else randn(T, 3)
    batch = (N,) if batched else ()
    state = None
    if with_state:
        h0 = randn(layers, *batch, h_size)
        state = (h0, randn(layers, *batch, 4)) if kind == "LSTM" else h0
    wy = randn(*ref(torch.from_numpy(x))[0].shape)

    def flat(s):
        return list(s) if kind == "LSTM" else [s]

    final_weights = [randn(*np.shape(s)) for s in flat(layer(x, state)[1])]

    def loss(layer, x, state):
        y, last = layer(x, state)
        total = (y * wy).sum()
        for s, w in zip(flat(last), final_weights):
            total = total + (s * w).sum()
        return total

    y, last = layer(x, state)
    tx = torch.from_numpy(x).requires_grad_()
    tstate = None
    if with_state:
        tstate = (
            tuple(torch.from_numpy(s).requires_grad_() for s in state)
            if kind == "LSTM"
            else torch.from_numpy(state).requires_grad_()
        )
    ty, tlast = ref(tx, tstate)
    close(y, ty)
    for got, want in zip(flat(last), flat(tlast)):
        close(got, want)
    total = (ty * torch.from_numpy(wy)).sum()
    for s, w in zip(flat(tlast), final_weights):
        total = total + (s * torch.from_numpy(w)).sum()
    total.backward()

    argnums = (0, 1, 2) if with_state else (0, 1)
    grads = kl.grad(loss, argnums=argnums)(layer, x, state)
    d = 2 if layer.bidirectional else 1
    tparams = dict(ref.named_parameters())
    for n, g in kl.nn.named_parameters(grads[0]):
        close(g, tparams[torch_name(n, d)].grad)
    close(grads[1], tx.grad)
    if with_state:
        for got, want in zip(flat(grads[2]), flat(tstate)):
            close(got, want.grad)


def test_jit_matches_eager():
    lstm = kl.nn.LSTM(3, 5, key(2), num_layers=2, proj_size=2, bidirectional=True)
    x = randn(4, 2, 3).astype(np.float32)
    y, s = lstm(x)
    jy, js = kl.jit(lambda m, x: m(x))(lstm, x)
    close(jy, np.asarray(y), 1e-5)
    close(js.c, np.asarray(s.c), 1e-5)


def test_rnn_cell_matches_torch():
    for nonlinearity in ("tanh", "relu"):
        cell = kl.nn.RNNCell(3, 4, key(3), nonlinearity=nonlinearity, dtype=kl.float64)
        ref = torch.nn.RNNCell(3, 4, nonlinearity=nonlinearity).double()
        with torch.no_grad():
            for n, t in kl.nn.named_parameters(cell):
                getattr(ref, n).copy_(torch.from_numpy(np.asarray(t)))
        x, h = randn(2, 3), randn(2, 4)
        close(cell(x), ref(torch.from_numpy(x)))
        close(cell(x, h), ref(torch.from_numpy(x), torch.from_numpy(h)))
        close(cell(x[0], h[0]), ref(torch.from_numpy(x[0]), torch.from_numpy(h[0])))


def test_initialisation_and_parameters_are_torch_s():
    lstm = kl.nn.LSTM(3, 6, key(4), num_layers=2, proj_size=2, bidirectional=True)
    ref = torch.nn.LSTM(3, 6, num_layers=2, proj_size=2, bidirectional=True)
    d = 2
    for n, t in kl.nn.named_parameters(lstm):
        want = getattr(ref, torch_name(n, d))
        assert tuple(t.shape) == tuple(want.shape), n
        bound = 1 / np.sqrt(6)  # uniform(-1/sqrt(H), 1/sqrt(H)) for every parameter
        assert np.abs(np.asarray(t)).max() <= bound
    rnn = kl.nn.RNN(3, 4, key(5))
    assert rnn.dropout == 0.0 and not rnn.batch_first and rnn.cells[0].nonlinearity == "tanh"
    assert repr(rnn).startswith("RNN(3, 4, num_layers=1, nonlinearity=tanh")
    assert "proj_size=2" in repr(lstm)
    # PyTorch's (h, c) tuple is a state, and an LSTMState unpacks like one.
    h, c = lstm(randn(4, 3).astype(np.float32))[1]
    y, s = lstm(randn(4, 3).astype(np.float32), (h, c))
    assert tuple(s.h.shape) == (4, 2) and tuple(s.c.shape) == (4, 6)


@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU"])
def test_dropout_between_layers(kind):
    layer = getattr(kl.nn, kind)(4, 8, key(6), num_layers=2, dropout=0.5)
    x = randn(3, 2, 4).astype(np.float32)
    y_eval = np.asarray(layer(x)[0])
    close(layer(x, ctx=kl.nn.Context.eval())[0], y_eval, 0)
    y1 = np.asarray(layer(x, ctx=kl.nn.Context.train(key(7)))[0])
    y2 = np.asarray(layer(x, ctx=kl.nn.Context.train(key(7)))[0])
    y3 = np.asarray(layer(x, ctx=kl.nn.Context.train(key(8)))[0])
    np.testing.assert_array_equal(y1, y2)  # deterministic given the key
    assert not np.array_equal(y1, y3) and not np.allclose(y1, y_eval)
    # The first layer's outputs never see dropout: with one layer training is evaluation.
    single = getattr(kl.nn, kind)(4, 8, key(6), dropout=0.5)
    close(single(x, ctx=kl.nn.Context.train(key(7)))[0], np.asarray(single(x)[0]), 0)


def test_dropout_keep_rate():
    # An RNN whose second layer passes its input through (identity weights, relu, no
    # recurrence) shows the dropout mask itself: zeros at the rate, the rest scaled 1 / (1 - p).
    rate = 0.3
    rnn = kl.nn.RNN(1, 400, key(9), num_layers=2, nonlinearity="relu", bias=False, dropout=rate)
    rnn.cells[0].weight_ih = np.ones((400, 1), np.float32)
    rnn.cells[0].weight_hh = np.zeros((400, 400), np.float32)
    rnn.cells[1].weight_ih = np.eye(400, dtype=np.float32)
    rnn.cells[1].weight_hh = np.zeros((400, 400), np.float32)
    x = np.ones((50, 1, 1), np.float32)
    y = np.asarray(rnn(x, ctx=kl.nn.Context.train(key(10)))[0])
    assert set(np.unique(y)) <= {0.0, np.float32(1 / (1 - rate))}
    assert abs((y == 0).mean() - rate) < 0.01  # 20,000 draws: 4 standard deviations
    close(rnn(x)[0], np.ones_like(y), 0)


def test_errors():
    with pytest.raises(kl.Error, match=r"\[nn.RNN\] unknown nonlinearity"):
        kl.nn.RNN(3, 4, key(0), nonlinearity="sigmoid")
    with pytest.raises(kl.Error, match=r"\[nn.RNNCell\] unknown nonlinearity"):
        kl.nn.RNNCell(3, 4, key(0), nonlinearity="gelu")
    with pytest.raises(kl.Error, match=r"\[nn.LSTM\] proj_size out of range"):
        kl.nn.LSTM(3, 4, key(0), proj_size=4)
    with pytest.raises(kl.Error, match=r"\[nn.LSTM\] proj_size out of range"):
        kl.nn.LSTM(3, 4, key(0), proj_size=-1)
    with pytest.raises(kl.Error, match=r"\[nn.GRU\] dropout out of range"):
        kl.nn.GRU(3, 4, key(0), dropout=1.0)
    lstm = kl.nn.LSTM(3, 4, key(0), proj_size=2)
    x = np.zeros((5, 1, 3), np.float32)
    with pytest.raises(
        kl.Error,
        match=r"\[nn.LSTM\] state does not match: got f32\[1,1,4\], " r"expected shape \[1, 1, 2\]",
    ):
        lstm(x, (np.zeros((1, 1, 4), np.float32), np.zeros((1, 1, 4), np.float32)))
    rnn = kl.nn.RNN(3, 4, key(0), num_layers=2, dropout=0.5)
    rnn.cells[1].nonlinearity = "softsign"
    with pytest.raises(kl.Error, match=r"\[nn.RNN\] unknown nonlinearity"):
        rnn(x)
