#!/usr/bin/python3
"""PyTorch 1.13 peer of bench/bench_sort.cpp: sort and cumsum of 10^7 float32.

    /usr/bin/python3 bench/sort_torch.py [--reps 5] [--threads 1] [--target 0.5]

torch.sort(x) (values and int64 indices, like kiln::sort_with_indices) and torch.cumsum(x, 0)
of x = 10^7 standard normal float32. Prints RESULT / TIMES lines (bench/side_by_side.py).
"""
import torch

import side_by_side

N = 10_000_000


def main():
    a = side_by_side.parser(__doc__, reps=5, threads=1, target=0.5).parse_args()
    torch.set_num_threads(a.threads)
    x = torch.randn(N, generator=torch.Generator().manual_seed(0))
    cases = {"torch_sort": lambda: torch.sort(x), "torch_cumsum": lambda: torch.cumsum(x, 0)}
    side_by_side.report(side_by_side.time_cases(cases, a.reps, a.target))


if __name__ == "__main__":
    main()
