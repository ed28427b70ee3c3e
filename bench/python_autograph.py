"""Python control flow compiled: kiln.jit (autograph) against torch.jit.script, side by side.

Both compile a Python function whose `while`/`if`/`for` depend on tensor values. Interleaved
repeats, median per call; OMP_NUM_THREADS / torch.set_num_threads at 1, then 2 (a child process
each). Also the one-time cost of converting a function.

usage: /usr/bin/python3 bench/python_autograph.py   (PYTHONPATH=python)
"""
import os
import statistics
import subprocess
import sys
import time


def run(threads):
    import numpy as np
    import torch

    import kiln as kl

    torch.set_num_threads(threads)
    kl.set_num_threads(threads)

    @kl.jit
    def collatz(n):
        steps = kl.zeros((), kl.int32)
        while n != 1:
            if n % 2 == 0:
                n = n // 2
            else:
                n = 3 * n + 1
            steps += 1
        return steps

    @torch.jit.script
    def collatz_torch(n: torch.Tensor):
        steps = torch.zeros((), dtype=torch.int32)
        while bool(n != 1):
            if bool(n % 2 == 0):
                n = torch.div(n, 2, rounding_mode="floor")
            else:
                n = 3 * n + 1
            steps += 1
        return steps

    @kl.jit
    def newton(a, iters):
        x = a
        for _ in range(iters):
            if kl.max(kl.abs(x * x - a)) > 1e-12:
                x = 0.5 * (x + a / x)
        return x

    @torch.jit.script
    def newton_torch(a: torch.Tensor, iters: torch.Tensor):
        x = a
        for _ in range(int(iters)):
            if bool(torch.max(torch.abs(x * x - a)) > 1e-12):
                x = 0.5 * (x + a / x)
        return x

    a = np.linspace(1.0, 100.0, 256)
    cases = [
        (
            "collatz(27): while + if on a scalar, 111 steps",
            lambda: collatz(kl.asarray(np.int32(27))),
            lambda: collatz_torch(torch.tensor(27, dtype=torch.int32)),
        ),
        (
            "newton sqrt, 256 f64, for range(tensor) + if, 30 steps",
            lambda: newton(kl.asarray(a), kl.asarray(np.int32(30))),
            lambda: newton_torch(torch.from_numpy(a), torch.tensor(30)),
        ),
    ]
    assert int(np.asarray(cases[0][1]())) == int(cases[0][2]()) == 111
    np.testing.assert_allclose(np.asarray(cases[1][1]()), cases[1][2]().numpy(), rtol=1e-12)
    for name, kiln_call, torch_call in cases:
        times = {"kiln": [], "torch": []}
        for _ in range(15):
            for side, call in (("kiln", kiln_call), ("torch", torch_call)):
                start = time.perf_counter()
                for _ in range(20):
                    call()
                times[side].append((time.perf_counter() - start) / 20 * 1e6)
        k, t = statistics.median(times["kiln"]), statistics.median(times["torch"])
        print(
            f"  {name}: kiln.jit {k:8.1f} us, torch.jit.script {t:8.1f} us, "
            f"ratio kiln/torch {k / t:.2f}"
        )

    def fresh():
        def f(x, n):
            total = x * 0.0
            for i in range(n):
                if total > 10.0:
                    total = total - x
                else:
                    total = total + x * i
            return total

        return f

    kl.autograph.convert(fresh())  # the file's parse, shared by every function in it
    costs = []
    for _ in range(20):
        kl.autograph.conversion._conversions.clear()
        kl.autograph.conversion._converted.clear()
        start = time.perf_counter()
        kl.autograph.convert(fresh())
        costs.append((time.perf_counter() - start) * 1e3)
    print(
        f"  conversion of a 9-line function (rewrite + compile): "
        f"{statistics.median(costs):.2f} ms, once per function"
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        run(int(sys.argv[1]))
    else:
        for threads in (1, 2):
            print(f"threads = {threads}")
            env = dict(os.environ, OMP_NUM_THREADS=str(threads))
            subprocess.run([sys.executable, __file__, str(threads)], env=env, check=True)
