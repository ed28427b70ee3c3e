#!/usr/bin/python3
"""Reference values for tests/test_nn.cpp (the `Torch*` tests), from PyTorch (run with Debian's
python3-torch, PyTorch 1.13: /usr/bin/python3 tests/reference/nn_torch.py).

Inputs are closed-form, so the C++ test rebuilds them without an RNG:
  cross entropy: logits [4, 5], L[i][c] = 2 sin(1.3 i + 0.7 c), labels (2 i + 1) % 5;
  BCE with logits: the 8 logits and targets below;
  BatchNorm2d(2, momentum=0.1, eps=1e-5), training, running stats starting at (0, 1):
    x [3, 2, 2, 2], x.flat[k] = cos(0.5 k) + 0.1 * channel;
  GELU (exact and tanh) at the 6 points below.
The script prints C++ initialisers; the test pastes them.
"""
import math

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)


def show(name, t):
    vals = ", ".join(f"{v:.17g}" for v in torch.as_tensor(t).flatten().tolist())
    print(f"const std::vector<double> {name}{{{vals}}};")


logits = torch.tensor([[2 * math.sin(1.3 * i + 0.7 * c) for c in range(5)] for i in range(4)])
labels = torch.tensor([(2 * i + 1) % 5 for i in range(4)])
show(
    "kTorchCe",
    [F.cross_entropy(logits, labels, label_smoothing=e).item() for e in (0.0, 0.1, 0.25, 1.0)],
)

bce_x = torch.tensor([-100.0, -3.0, -0.5, 0.0, 0.5, 3.0, 100.0, 100.0])
bce_t = torch.tensor([1.0, 0.0, 0.3, 1.0, 0.0, 1.0, 0.0, 1.0])
show("kTorchBce", [F.binary_cross_entropy_with_logits(bce_x, bce_t).item()])

n, c, h, w = 3, 2, 2, 2
x = torch.tensor([math.cos(0.5 * k) for k in range(n * c * h * w)]).reshape(n, c, h, w)
x = x + 0.1 * torch.arange(c).reshape(1, c, 1, 1)
bn = torch.nn.BatchNorm2d(c, momentum=0.1, eps=1e-5)
bn.train()
y = bn(x)
show("kTorchBnY", y.detach())
show("kTorchBnMean", bn.running_mean)
show("kTorchBnVar", bn.running_var)

g = torch.tensor([-3.0, -1.0, -0.5, 0.5, 1.0, 3.0])
show("kTorchGelu", F.gelu(g))
show("kTorchGeluTanh", F.gelu(g, approximate="tanh"))
