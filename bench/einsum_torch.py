#!/usr/bin/python3
"""PyTorch 1.13 peer of bench/bench_einsum.cpp: torch.einsum at transformer sizes, float32.

    /usr/bin/python3 bench/einsum_torch.py [--reps 5] [--threads 1] [--target 0.2]

Cases (inputs uniform in [-1, 1), created once):
    torch_bmm        einsum("bij,bjk->bik"), b 64, 256 x 256 x 256
    torch_attention  einsum("bhqd,bhkd->bhqk"), b 8, h 8, q = k 512, d 64
Prints RESULT / TIMES lines per case (bench/side_by_side.py).
"""
import torch

import side_by_side


def main():
    a = side_by_side.parser(__doc__, reps=5, threads=1, target=0.2).parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)

    def u(*s):
        return torch.rand(*s, generator=g) * 2 - 1

    x, y = u(64, 256, 256), u(64, 256, 256)
    q, k = u(8, 8, 512, 64), u(8, 8, 512, 64)
    cases = {
        "torch_bmm": lambda: torch.einsum("bij,bjk->bik", x, y),
        "torch_attention": lambda: torch.einsum("bhqd,bhkd->bhqk", q, k),
    }
    with torch.no_grad():
        side_by_side.report(side_by_side.time_cases(cases, a.reps, a.target))


if __name__ == "__main__":
    main()
