#!/usr/bin/python3
"""PyTorch 1.13 eager peer of bench/bench_scan.cpp: an RNN with a Python loop, fwd + bwd.

    /usr/bin/python3 bench/scan_torch.py [--reps 7] [--threads 1] [--target 0.3]

h = tanh(h @ Wh + x_t @ Wx + b), hidden 256, input 256, batch 32, 100 steps, float32, h0 = 0;
loss = sum of the final h; loss.backward() gives the gradients of Wh, Wx, b. Warmed up, then
timed in R repetitions of a batch of calls sized to ~target seconds (bench/side_by_side.py).
Prints
    RESULT torch_eager_loop <median ms> <min ms>
    TIMES torch_eager_loop <ms of each repetition ...>      (what bench_scan reads)
"""
import torch

import side_by_side

B, H, D, T = 32, 256, 256, 100


def main():
    a = side_by_side.parser(__doc__, reps=7, threads=1, target=0.3).parse_args()
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

    side_by_side.report(side_by_side.time_cases({"torch_eager_loop": step}, a.reps, a.target))


if __name__ == "__main__":
    main()
