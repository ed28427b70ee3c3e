"""Eager overhead of a small op from Python: `a + b` on 2-element float32 tensors, Kiln against
PyTorch 1.13 eager, at 1 and 2 threads, side by side in one run (docs/PERFORMANCE.md,
"Python: small-op overhead"; goal: Kiln's per-call time <= PyTorch's).

usage: PYTHONPATH=python /usr/bin/python3 bench/python_eager.py [--rounds 15] [--calls 20000]

Each round times `calls` additions for Kiln and for PyTorch, alternating which goes first, and
the medians over the rounds are reported (interleaving spreads machine noise over both). A few
other small ops follow at 1 thread, with fewer rounds, for information.
"""
import argparse
import statistics
import sys
import time

import numpy as np
import torch

import kiln as kl


def per_call_ns(op, a, b, calls):
    start = time.perf_counter_ns()
    for _ in range(calls):
        op(a, b)
    return (time.perf_counter_ns() - start) / calls


def add(a, b):
    return a + b


# Other small ops, reported at 1 thread (no target).
OTHERS = {
    "a < b": lambda a, b: a < b,
    "a * 2.0": lambda a, b: a * 2.0,
    "-a": lambda a, b: -a,
    "a[0]": lambda a, b: a[0],
    "a[:1]": lambda a, b: a[:1],
    "sum(a)": lambda a, b: a.sum(),
}


def bench(op, threads, rounds, calls):
    kl.set_num_threads(threads)
    torch.set_num_threads(threads)
    ka, kb = kl.asarray(np.ones(2, np.float32)), kl.asarray(np.full(2, 2.0, np.float32))
    ta, tb = torch.ones(2), torch.full((2,), 2.0)
    assert np.array_equal(np.asarray(op(ka, kb)), op(ta, tb).numpy())
    per_call_ns(op, ka, kb, calls), per_call_ns(op, ta, tb, calls)  # warm up
    kiln_ns, torch_ns = [], []
    for r in range(rounds):
        order = [(ka, kb, kiln_ns), (ta, tb, torch_ns)]
        for a, b, out in order if r % 2 == 0 else order[::-1]:
            out.append(per_call_ns(op, a, b, calls))
    return statistics.median(kiln_ns), statistics.median(torch_ns)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, numpy {np.__version__}")
    print(f"{'op':9} {'threads':>7} {'kiln ns/call':>13} {'torch ns/call':>14} {'kiln/torch':>11}")
    for threads in (1, 2):
        k, t = bench(add, threads, args.rounds, args.calls)
        print(f"a + b     {threads:>7} {k:>13.0f} {t:>14.0f} {k / t:>11.2f}")
    for name, op in OTHERS.items():
        k, t = bench(op, 1, max(args.rounds // 3, 3), args.calls)
        print(f"{name:9} {1:>7} {k:>13.0f} {t:>14.0f} {k / t:>11.2f}")


if __name__ == "__main__":
    main()
