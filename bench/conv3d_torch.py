#!/usr/bin/python3
"""PyTorch 1.13 peer of bench/bench_conv3d.cpp: float32 conv1d, conv3d (and its gradient) and
conv_transpose2d of the same shapes.

    /usr/bin/python3 bench/conv3d_torch.py [--reps 5] [--threads 1] [--target 0.5]

Prints RESULT / TIMES lines (bench/side_by_side.py).
"""
import torch
import torch.nn.functional as F

import side_by_side


def main():
    a = side_by_side.parser(__doc__, reps=5, threads=1, target=0.5).parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    x1, w1 = torch.randn(32, 64, 512, generator=g), torch.randn(64, 64, 5, generator=g)
    x3, w3 = torch.randn(2, 16, 16, 32, 32, generator=g), torch.randn(32, 16, 3, 3, 3, generator=g)
    r3 = torch.randn(2, 32, 16, 32, 32, generator=g)
    xt, wt = torch.randn(16, 64, 16, 16, generator=g), torch.randn(64, 32, 4, 4, generator=g)
    x3g, w3g = x3.clone().requires_grad_(True), w3.clone().requires_grad_(True)

    def conv3d_grad():
        return torch.autograd.grad((F.conv3d(x3g, w3g, padding=1) * r3).sum(), (x3g, w3g))

    cases = {
        "torch_conv1d": lambda: F.conv1d(x1, w1, padding=2),
        "torch_conv3d": lambda: F.conv3d(x3, w3, padding=1),
        "torch_conv3d_grad": conv3d_grad,
        "torch_conv_transpose2d": lambda: F.conv_transpose2d(xt, wt, stride=2, padding=1),
    }
    side_by_side.report(side_by_side.time_cases(cases, a.reps, a.target))


if __name__ == "__main__":
    main()
