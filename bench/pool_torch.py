#!/usr/bin/python3
"""PyTorch 1.13 peer of bench/bench_pool.cpp: float32 max and average pooling of the same
shapes, and the max poolings' gradients.

    /usr/bin/python3 bench/pool_torch.py [--reps 5] [--threads 1] [--target 0.3]

Prints RESULT / TIMES lines (bench/side_by_side.py).
"""
import torch
import torch.nn.functional as F

import side_by_side


def main():
    a = side_by_side.parser(__doc__, reps=5, threads=1, target=0.3).parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 64, 56, 56, generator=g)
    r2, r1 = torch.randn(32, 64, 28, 28, generator=g), torch.randn(32, 64, 56, 56, generator=g)
    xg = x.clone().requires_grad_(True)

    def max_grad(stride, r):
        y = F.max_pool2d(xg, 3, stride=stride, padding=1)
        return torch.autograd.grad((y * r).sum(), xg)

    cases = {
        "torch_max_3x3s2": lambda: F.max_pool2d(x, 3, stride=2, padding=1),
        "torch_max_3x3s2_grad": lambda: max_grad(2, r2),
        "torch_max_3x3s1": lambda: F.max_pool2d(x, 3, stride=1, padding=1),
        "torch_max_3x3s1_grad": lambda: max_grad(1, r1),
        "torch_avg_3x3s1": lambda: F.avg_pool2d(x, 3, stride=1, padding=1),
    }
    side_by_side.report(side_by_side.time_cases(cases, a.reps, a.target))


if __name__ == "__main__":
    main()
