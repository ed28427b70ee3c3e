#!/usr/bin/python3
"""PyTorch 1.13 eager peer of bench/bench_linalg.cpp: Cholesky and solve of a batch of SPD
matrices, forward and forward + backward, float64.

    /usr/bin/python3 bench/linalg_torch.py [--reps 7] [--threads 1] [--target 0.2]

A [64, 128, 128] SPD (M M^T / 128 + I), b [64, 128, 8]. Forward: L = cholesky(A),
x = solve(A, b). Backward: loss = sum(L * W) + sum(x * V), loss.backward() (grads of A and b).
Prints RESULT / TIMES lines per case (bench/side_by_side.py).
"""
import torch

import side_by_side

B, N, K = 64, 128, 8


def main():
    a = side_by_side.parser(__doc__, reps=7, threads=1, target=0.2).parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    m = torch.randn(B, N, N, generator=g, dtype=torch.float64)
    A0 = m @ m.transpose(-1, -2) / N + torch.eye(N, dtype=torch.float64)
    b0 = torch.randn(B, N, K, generator=g, dtype=torch.float64)
    W = torch.randn(B, N, N, generator=g, dtype=torch.float64)
    V = torch.randn(B, N, K, generator=g, dtype=torch.float64)

    def forward():
        with torch.no_grad():
            torch.linalg.cholesky(A0)
            torch.linalg.solve(A0, b0)

    A = A0.clone().requires_grad_()
    b = b0.clone().requires_grad_()

    def backward():
        A.grad = None
        b.grad = None
        loss = (torch.linalg.cholesky(A) * W).sum() + (torch.linalg.solve(A, b) * V).sum()
        loss.backward()

    side_by_side.report(
        side_by_side.time_cases(
            {"torch_forward": forward, "torch_forward_backward": backward}, a.reps, a.target
        )
    )


if __name__ == "__main__":
    main()
