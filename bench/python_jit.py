#!/usr/bin/python3
"""Transformations from Python: what a cached jit call costs, and per-example gradients.

    PYTHONPATH=python /usr/bin/python3 bench/python_jit.py [--reps 9] \
        [--bench-jit build/bench/bench_jit]

(a) A cached kiln.jit call from Python of small(a, b, c) = a * b + c - a on 2-element float32
    tensors, against the same jitted function called from C++ (bench_jit's BM_small_jit: the
    same function, the same cache lookup and the same compiled kernels, without Python), and
    against the same three ops run eagerly by PyTorch from Python. The kernels take well under a
    microsecond, so the whole Python call time bounds what Python adds; Python minus C++ is the
    cost of the Python binding itself (argument parsing, flattening the Python tuple, wrapping
    the result).
(b) Per-example gradients of an MLP 784-128-10 (relu) with the loss -sum(y * log_softmax(logits))
    (y one-hot), batch 64, float32: kiln.jit(kiln.vmap(kiln.grad(loss), in_axes=(None, 0, 0)))
    against functorch.vmap(functorch.grad(loss), in_dims=(None, 0, 0)) in PyTorch 1.13.
Each thread count (1, 2) runs in its own process (OMP_NUM_THREADS set before Kiln's OpenMP
starts; torch.set_num_threads too); within it the Kiln and PyTorch sides alternate, repetition
by repetition, and the median is reported.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

B, D, H, C = 64, 784, 128, 10


def timed(fn, n):
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def worker(threads, reps):
    import numpy as np
    import torch
    import functorch

    import kiln as kl

    torch.set_num_threads(threads)
    # The ops inside the traced functions: only the trace calls them, so a cached call's cost
    # does not depend on them.
    o = kl

    def small(a, b, c):
        return o.sub(o.add(o.mul(a, b), c), a)

    a, b, c = (kl.asarray(np.array(v, np.float32)) for v in ([1, 2], [3, 4], [5, 6]))
    ta, tb, tc = (torch.tensor(v, dtype=torch.float32) for v in ([1, 2], [3, 4], [5, 6]))
    small_jit = kl.jit(small)
    small_jit(a, b, c)

    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((D, H)) / D**0.5).astype(np.float32)
    w2 = (rng.standard_normal((H, C)) / H**0.5).astype(np.float32)
    b1, b2 = np.zeros(H, np.float32), np.zeros(C, np.float32)
    x = rng.standard_normal((B, D)).astype(np.float32)
    y = np.eye(C, dtype=np.float32)[rng.integers(0, C, B)]

    def loss(p, x, y):  # one example
        h = o.maximum(o.add(o.matmul(x, p["w1"]), p["b1"]), 0.0)
        logits = o.add(o.matmul(h, p["w2"]), p["b2"])
        log_softmax = o.sub(logits, o.log(o.sum(o.exp(logits))))
        return o.neg(o.sum(o.mul(y, log_softmax)))

    params = {k: kl.asarray(v) for k, v in dict(w1=w1, b1=b1, w2=w2, b2=b2).items()}
    kx, ky = kl.asarray(x), kl.asarray(y)
    per_example = kl.jit(kl.vmap(kl.grad(loss), in_axes=(None, 0, 0)))

    def torch_loss(p, x, y):
        h = torch.relu(x @ p["w1"] + p["b1"])
        logits = h @ p["w2"] + p["b2"]
        return -(y * torch.log_softmax(logits, -1)).sum()

    tparams = {k: torch.from_numpy(v) for k, v in dict(w1=w1, b1=b1, w2=w2, b2=b2).items()}
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    ft = functorch.vmap(functorch.grad(torch_loss), in_dims=(None, 0, 0))

    # Both sides compute the same gradients.
    gk, gt = per_example(params, kx, ky), ft(tparams, tx, ty)
    for k in gk:
        np.testing.assert_allclose(np.asarray(gk[k]), gt[k].numpy(), rtol=1e-4, atol=1e-5)

    results = {"jit_call_us": [], "torch_eager_us": [], "kiln_ms": [], "functorch_ms": []}
    for _ in range(reps):
        results["jit_call_us"].append(timed(lambda: small_jit(a, b, c), 20000) * 1e6)
        results["torch_eager_us"].append(timed(lambda: ta * tb + tc - ta, 20000) * 1e6)
        results["kiln_ms"].append(timed(lambda: per_example(params, kx, ky), 20) * 1e3)
        results["functorch_ms"].append(timed(lambda: ft(tparams, tx, ty), 20) * 1e3)
    print(json.dumps({k: statistics.median(v) for k, v in results.items()}))


def cpp_jit_call_us(bench_jit, threads):
    """BM_small_jit's median per-call time from bench_jit, or None when it is not built."""
    if not os.path.exists(bench_jit):
        return None
    out = subprocess.run(
        [
            bench_jit,
            "--benchmark_filter=BM_small_jit$",
            "--benchmark_repetitions=5",
            "--benchmark_report_aggregates_only=true",
        ],
        env=dict(os.environ, OMP_NUM_THREADS=str(threads)),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    m = re.search(r"BM_small_jit_median\s+([\d.]+) ns", out)
    return float(m.group(1)) / 1e3 if m else None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--bench-jit", default="build/bench/bench_jit")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.reps)
        return
    print(
        "threads | py jit call | C++ jit call | py - C++ | torch eager (3 ops) | "
        "per-example grads: Kiln | functorch | Kiln/functorch"
    )
    for threads in (1, 2):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
        out = subprocess.run(
            [sys.executable, __file__, "--worker", str(threads), "--reps", str(args.reps)],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        r = json.loads(out.strip().splitlines()[-1])
        cpp = cpp_jit_call_us(args.bench_jit, threads)
        cpp_text = f"{cpp:.2f} us" if cpp is not None else "(bench_jit not built)"
        diff = f"{r['jit_call_us'] - cpp:.2f} us" if cpp is not None else "-"
        print(
            f"{threads} | {r['jit_call_us']:.2f} us | {cpp_text} | {diff} | "
            f"{r['torch_eager_us']:.2f} us | {r['kiln_ms']:.3f} ms | {r['functorch_ms']:.3f} ms | "
            f"{r['kiln_ms'] / r['functorch_ms']:.2f}x"
        )


if __name__ == "__main__":
    main()
