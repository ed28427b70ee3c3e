#!/usr/bin/python3
"""Reference values for tests/test_optim.cpp, from PyTorch (run with Debian's python3-torch,
PyTorch 1.13: /usr/bin/python3 tests/reference/optim_torch.py).

Parameters are three float64 tensors w [2, 3], b [3] and e [2] (the test's Net{w, b, extra[0]}),
flattened in that order to 11 values: p0[j] = 0.5 cos(0.3 j + 0.1). Update k (k = 0..4) uses the
fixed gradient g_k[j] = sin(0.7 j + 1.3 k + 0.2) + 0.05 j - 0.1 k. The script prints the 11
parameter values after 5 updates for each configuration, as C++ initialisers.
"""
import math

import torch

torch.set_default_dtype(torch.float64)
N, STEPS = 11, 5
SHAPES = [(2, 3), (3,), (2,)]


def p0(j):
    return 0.5 * math.cos(0.3 * j + 0.1)


def grad(k, j):
    return math.sin(0.7 * j + 1.3 * k + 0.2) + 0.05 * j - 0.1 * k


def split(values):
    out, at = [], 0
    for shape in SHAPES:
        n = math.prod(shape)
        out.append(torch.tensor(values[at : at + n]).reshape(shape))
        at += n
    return out


def run(make_opt, clip=None, scheduler=None):
    params = [t.clone().requires_grad_(True) for t in split([p0(j) for j in range(N)])]
    opt = make_opt(params)
    sched = scheduler(opt) if scheduler else None
    for k in range(STEPS):
        for p, g in zip(params, split([grad(k, j) for j in range(N)])):
            p.grad = g.clone()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        if sched is not None:
            sched.step()
    return torch.cat([p.detach().reshape(-1) for p in params]).tolist()


CONFIGS = {
    "sgd": lambda: run(lambda ps: torch.optim.SGD(ps, lr=0.1)),
    "sgd_momentum": lambda: run(lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)),
    "sgd_nesterov": lambda: run(
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True)
    ),
    "sgd_momentum_dampening_wd": lambda: run(
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)
    ),
    "sgd_nesterov_wd": lambda: run(
        lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1)
    ),
    "sgd_step_lr": lambda: run(
        lambda ps: torch.optim.SGD(ps, lr=0.1),
        scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
    ),
    "adam": lambda: run(lambda ps: torch.optim.Adam(ps, lr=0.01)),
    "adam_l2": lambda: run(
        lambda ps: torch.optim.Adam(ps, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    ),
    "adamw": lambda: run(lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1)),
    "adam_clip": lambda: run(lambda ps: torch.optim.Adam(ps, lr=0.01), clip=1.0),
}

if __name__ == "__main__":
    print(f"// torch {torch.__version__}")
    for name, fn in CONFIGS.items():
        values = ", ".join(f"{v:.17g}" for v in fn())
        print(f'{{"{name}", {{{values}}}}},')
