"""PyTorch 1.13 values for tests/test_recurrent.cpp: LSTM / GRU cells and layers.

Weights and inputs are drawn here (float64) and stored with the outputs under PyTorch's
parameter names, so the C++ tests load the same weights into Kiln's layers; the input gradient
is that of sum(y * cot) with a stored cotangent `cot`.
"""
import sys

import numpy as np
import torch

import reference_file

torch.manual_seed(15)
torch.set_default_dtype(torch.float64)
out = {}


def put(name, t):
    out[name] = t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def rnn_case(
    name,
    cls,
    I,
    H,
    T,
    N,
    num_layers=1,
    bidirectional=False,
    batch_first=False,
    with_state=True,
    bias=True,
):
    m = cls(
        I, H, num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first, bias=bias
    )
    for pname, p in m.named_parameters():
        put(f"{name}/param/{pname}", p)
    D = 2 if bidirectional else 1
    x = torch.randn((N, T, I) if batch_first else (T, N, I)).requires_grad_()
    put(f"{name}/x", x)
    args = ()
    if with_state:
        h0 = torch.randn(num_layers * D, N, H)
        put(f"{name}/h0", h0)
        if cls is torch.nn.LSTM:
            c0 = torch.randn(num_layers * D, N, H)
            put(f"{name}/c0", c0)
            args = ((h0, c0),)
        else:
            args = (h0,)
    y, state = m(x, *args)
    put(f"{name}/y", y)
    if cls is torch.nn.LSTM:
        put(f"{name}/h", state[0]), put(f"{name}/c", state[1])
    else:
        put(f"{name}/h", state)
    cot = torch.randn(y.shape)
    (y * cot).sum().backward()
    put(f"{name}/cot", cot), put(f"{name}/grad_x", x.grad)


rnn_case("lstm_1", torch.nn.LSTM, 3, 4, 5, 2)
rnn_case("lstm_2bi", torch.nn.LSTM, 3, 4, 5, 2, num_layers=2, bidirectional=True)
rnn_case("lstm_bf", torch.nn.LSTM, 3, 2, 4, 3, batch_first=True, with_state=False, bias=False)
rnn_case("gru_1", torch.nn.GRU, 3, 4, 5, 2)
rnn_case("gru_2bi", torch.nn.GRU, 3, 4, 5, 2, num_layers=2, bidirectional=True)
rnn_case("gru_bf", torch.nn.GRU, 3, 2, 4, 3, batch_first=True, with_state=False)


def cell_case(name, cls, n_in, H, N):
    m = cls(n_in, H)
    for pname, p in m.named_parameters():
        put(f"{name}/param/{pname}", p)
    x, h = torch.randn(N, n_in), torch.randn(N, H)
    put(f"{name}/x", x), put(f"{name}/h0", h)
    if cls is torch.nn.LSTMCell:
        c = torch.randn(N, H)
        put(f"{name}/c0", c)
        h1, c1 = m(x, (h, c))
        put(f"{name}/h", h1), put(f"{name}/c", c1)
    else:
        put(f"{name}/h", m(x, h))


cell_case("lstm_cell", torch.nn.LSTMCell, 3, 4, 2)
cell_case("gru_cell", torch.nn.GRUCell, 3, 4, 2)

reference_file.write(sys.argv[1], out)
