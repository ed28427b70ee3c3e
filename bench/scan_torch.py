#!/usr/bin/python3
"""PyTorch 1.13 eager peer of bench/bench_scan.cpp: an RNN with a Python loop, fwd + bwd.

    /usr/bin/python3 bench/scan_torch.py [--reps 7] [--threads 1] [--target 0.3]

h = tanh(h @ Wh + x_t @ Wx + b), hidden 256, input 256, batch 32, 100 steps, float32, h0 = 0;
loss = sum of the final h; loss.backward() gives the gradients of Wh, Wx, b. Warmed up, then
timed in R repetitions of a batch of calls sized to ~target seconds. Prints
    RESULT torch_eager_loop <median ms> <min ms>
"""
import argparse
import statistics
import time

import torch

B, H, D, T = 32, 256, 256, 100


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--target", type=float, default=0.3)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    wh = (torch.randn(H, H, generator=g) / 16).requires_grad_()
    wx = (torch.randn(D, H, generator=g) / 16).requires_grad_()
    b = torch.zeros(H, requires_grad=True)
    xs = torch.randn(T, B, D, generator=g)

    def step():
        for p in (wh, wx, b):
            p.grad = None
        h = torch.zeros(B, H)
        for t in range(T):
            h = torch.tanh(h @ wh + xs[t] @ wx + b)
        h.sum().backward()

    for _ in range(3):
        step()
    t0 = time.perf_counter()
    step()
    n = max(1, int(a.target / max(time.perf_counter() - t0, 1e-6)))
    v = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        v.append((time.perf_counter() - t0) * 1e3 / n)
    print("RESULT torch_eager_loop %.4f %.4f" % (statistics.median(v), min(v)), flush=True)


if __name__ == "__main__":
    main()
