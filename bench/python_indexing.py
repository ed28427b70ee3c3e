"""Indexing from Python: `x[0]`, `x[1:3]`, `x[0, 1]` and other basic indices of a [4, 4] float32
tensor, Kiln against PyTorch 1.13 eager, at 1 and 2 threads, side by side in one run
(docs/PERFORMANCE.md, "Python: indexing": goal Kiln's time <= PyTorch's for ints, tuples
of ints and simple slices).

usage: PYTHONPATH=python /usr/bin/python3 bench/python_indexing.py [--rounds 9] [--calls 20000]

Each round times `calls` indexings for Kiln and for PyTorch, alternating which goes first; the
medians over the rounds are reported. Both results are checked equal to NumPy's first.
"""
import argparse
import statistics
import sys
import time

import numpy as np
import torch

import kiln as kl

# The targets first; an integer-array index (a gather, through the primitives) follows for
# information. (PyTorch has no negative steps.)
KEYS = {
    "x[0]": 0,
    "x[-1]": -1,
    "x[1:3]": slice(1, 3),
    "x[::2]": slice(None, None, 2),
    "x[0, 1]": (0, 1),
    "x[:, 1]": (slice(None), 1),
    "x[None]": None,
    "x[[0, 2]]": [0, 2],
}


def per_call_ns(x, key, calls):
    start = time.perf_counter_ns()
    for _ in range(calls):
        x[key]
    return (time.perf_counter_ns() - start) / calls


def bench(key, threads, rounds, calls):
    kl.set_num_threads(threads)
    torch.set_num_threads(threads)
    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    kx, tx = kl.asarray(a), torch.from_numpy(a.copy())
    assert np.array_equal(np.asarray(kx[key]), a[key])
    assert np.array_equal(tx[key].numpy(), a[key])
    per_call_ns(kx, key, calls), per_call_ns(tx, key, calls)  # warm up
    kiln_ns, torch_ns = [], []
    for r in range(rounds):
        order = [(kx, kiln_ns), (tx, torch_ns)]
        for x, out in order if r % 2 == 0 else order[::-1]:
            out.append(per_call_ns(x, key, calls))
    return statistics.median(kiln_ns), statistics.median(torch_ns)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, numpy {np.__version__}")
    print(f"{'index':10} {'threads':>7} {'kiln ns':>8} {'torch ns':>9} {'kiln/torch':>11}")
    for threads in (1, 2):
        for name, key in KEYS.items():
            k, t = bench(key, threads, args.rounds, args.calls)
            print(f"{name:10} {threads:>7} {k:>8.0f} {t:>9.0f} {k / t:>11.2f}")


if __name__ == "__main__":
    main()
