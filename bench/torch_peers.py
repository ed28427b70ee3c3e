#!/usr/bin/python3
"""PyTorch (Python, eager) peers of bench/bench_ad.cpp.

    /usr/bin/python3 bench/torch_peers.py [--reps 7] [--only step,hvp] [--threads 2]

Same problems, shapes and dtypes as bench_ad.cpp:
  step     one SGD training step (forward, loss.backward(), p -= 0.01 * p.grad under no_grad) of
           an MLP 784-512-512-10 (relu; cross-entropy as -mean(sum(one_hot * log_softmax))),
           batch 128, float32. "manual": x @ W + b with addmm, as Kiln's MLP is written;
           "nn.Linear": the usual nn.Module form (nn.Linear, F.cross_entropy).
  hvp      Hessian-vector product of f(x) = sum(tanh(W x)), W 1000x1000: double backward
           (torch.autograd.grad with create_graph=True, then grad of g . v).

Timing: torch.set_num_threads(2) (--threads); each case is warmed up, then timed in R repetitions
of a batch of calls sized to take ~0.2 s; the cases are interleaved repetition by repetition, and
the table gives the median and the minimum per call.
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

torch.manual_seed(0)
LR = 0.01


def step_manual():
    g = torch.Generator().manual_seed(0)
    ws = []
    for fan_in, fan_out in [(784, 512), (512, 512), (512, 10)]:
        w = torch.randn(fan_in, fan_out, generator=g) / fan_in**0.5
        ws += [w.requires_grad_(), torch.zeros(fan_out, requires_grad=True)]
    x = torch.randn(128, 784, generator=g)
    y = torch.randint(0, 10, (128,), generator=g)

    def run():
        w1, b1, w2, b2, w3, b3 = ws
        h1 = torch.relu(torch.addmm(b1, x, w1))
        h2 = torch.relu(torch.addmm(b2, h1, w2))
        logits = torch.addmm(b3, h2, w3)
        loss = -(F.one_hot(y, 10).float() * F.log_softmax(logits, -1)).sum(-1).mean()
        loss.backward()
        with torch.no_grad():
            for p in ws:
                p.sub_(p.grad, alpha=LR)
                p.grad = None
        return loss

    return run


def step_nn():
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    x = torch.randn(128, 784, generator=g)
    y = torch.randint(0, 10, (128,), generator=g)
    params = list(model.parameters())

    def run():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p in params:
                p.sub_(p.grad, alpha=LR)
                p.grad = None
        return loss

    return run


def hvp_double_backward():
    g = torch.Generator().manual_seed(0)
    n = 1000
    w = torch.randn(n, n, generator=g) / n**0.5
    x0 = torch.randn(n, generator=g)
    v = torch.randn(n, generator=g)

    def run():
        x = x0.detach().requires_grad_()
        f = torch.tanh(w @ x).sum()
        (gx,) = torch.autograd.grad(f, x, create_graph=True)
        (hv,) = torch.autograd.grad(gx @ v, x)
        return hv

    # Check against the closed form W^T (s * (W v)), s = -2 t (1 - t^2).
    t = torch.tanh(w @ x0)
    ref = w.t() @ (-2 * t * (1 - t * t) * (w @ v))
    err = (run() - ref).abs().max().item()
    assert err < 1e-4, err
    return run


CASES = {
    "step": [
        ("MLP step, PyTorch eager (manual addmm)", step_manual),
        ("MLP step, PyTorch eager (nn.Linear)", step_nn),
    ],
    "hvp": [("HVP 1000, PyTorch double backward", hvp_double_backward)],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--only", default="step,hvp")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cases = [(name, make()) for key in args.only.split(",") for name, make in CASES[key]]

    # Warm up, then size each case's batch of calls to ~0.2 s.
    batch = {}
    for name, run in cases:
        for _ in range(5):
            run()
        t0 = time.perf_counter()
        k = 0
        while time.perf_counter() - t0 < 0.05:
            run()
            k += 1
        per = (time.perf_counter() - t0) / k
        batch[name] = max(1, int(0.2 / per))

    times = {name: [] for name, _ in cases}
    for _ in range(args.reps):
        for name, run in cases:  # interleaved: each repetition visits every case
            n = batch[name]
            t0 = time.perf_counter()
            for _ in range(n):
                run()
            times[name].append((time.perf_counter() - t0) / n)

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, reps {args.reps}")
    print(f"{'case':<44} {'median':>12} {'min':>12} {'calls/rep':>10}")
    for name, _ in cases:
        ts = times[name]
        med, lo = statistics.median(ts), min(ts)
        unit, scale = ("ms", 1e3) if med > 1e-3 else ("us", 1e6)
        print(f"{name:<44} {med * scale:>9.3f} {unit} {lo * scale:>9.3f} {unit} {batch[name]:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
