#!/usr/bin/python3
"""PyTorch 1.13 peers of bench/bench_vmap.cpp: per-example gradients.

    /usr/bin/python3 bench/vmap_torch.py [--reps 7] [--threads 2] [--target 0.2]

Per-example gradients of the cross-entropy loss -sum(one_hot(y, 10) * log_softmax(logits)) of
an MLP 784-128-10 (relu), batch 64, float32, with respect to every parameter:
  functorch   functorch.vmap(functorch.grad(loss), in_dims=(None, 0, 0))(params, x, y)
  loop        for each example: torch.autograd.grad of its loss, then torch.stack per parameter
Same parameters, shapes and loss as the Kiln side (bench_vmap.cpp). Each case is warmed up,
then timed in R repetitions of a batch of calls sized to take ~target seconds; cases are
interleaved repetition by repetition. Prints two lines per case:
    RESULT <name> <median ms> <min ms>
    TIMES <name> <ms of each repetition ...>      (what bench_vmap reads)
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F
import functorch

B, D, H, C = 64, 784, 128, 10


def make():
    g = torch.Generator().manual_seed(0)
    w1 = torch.randn(D, H, generator=g) / D ** 0.5
    b1 = torch.zeros(H)
    w2 = torch.randn(H, C, generator=g) / H ** 0.5
    b2 = torch.zeros(C)
    x = torch.randn(B, D, generator=g)
    y = torch.randint(0, C, (B,), generator=g)
    return (w1, b1, w2, b2), x, y


def loss(p, x, y):  # one example: x [784], y [] (int64)
    w1, b1, w2, b2 = p
    h = torch.relu(x @ w1 + b1)
    logits = h @ w2 + b2
    # one_hot as arange == y: F.one_hot calls .item() (a range check), which vmap refuses.
    one_hot = (torch.arange(C) == y).float()
    return -(one_hot * F.log_softmax(logits, -1)).sum()


def cases():
    p, x, y = make()
    per_example = functorch.vmap(functorch.grad(loss), in_dims=(None, 0, 0))

    def fn_functorch():
        return per_example(p, x, y)

    pr = tuple(t.clone().requires_grad_() for t in p)

    def fn_loop():
        grads = [torch.autograd.grad(loss(pr, x[i], y[i]), pr) for i in range(B)]
        return tuple(torch.stack([g[k] for g in grads]) for k in range(4))

    # The two agree (and give what Kiln checks against: shapes [64, ...] per parameter).
    a, b = fn_functorch(), fn_loop()
    for u, v in zip(a, b):
        assert u.shape == v.shape and torch.allclose(u, v, atol=1e-5), (u.shape, v.shape)
    return {"torch_functorch_vmap_grad": fn_functorch, "torch_loop_grad": fn_loop}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--target", type=float, default=0.2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    fns = cases()
    calls = {}
    for name, fn in fns.items():
        for _ in range(3):
            fn()
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        calls[name] = max(1, int(args.target / max(dt, 1e-6)))
    times = {name: [] for name in fns}
    for _ in range(args.reps):
        for name, fn in fns.items():
            n = calls[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - t0) / n * 1e3)
    for name, ts in times.items():
        print(f"RESULT {name} {statistics.median(ts):.4f} {min(ts):.4f}", flush=True)
        print(f"TIMES {name} " + " ".join(f"{t:.4f}" for t in ts), flush=True)


if __name__ == "__main__":
    main()
