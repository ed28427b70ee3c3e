"""The MLP training step from Python: Kiln (jit(value_and_grad(loss)) and the optimiser update in
one jitted step) against PyTorch 1.13 eager (forward, backward, optimizer.step), side by side.

MLP 784-256-256-10 with ReLU, cross-entropy, SGD with momentum 0.9, batch 128, float32. Each
thread count runs in a child process (OpenMP reads OMP_NUM_THREADS at start-up) where Kiln and
PyTorch alternate in interleaved repeats; the median time per step is reported.

    PYTHONPATH=python /usr/bin/python3 bench/python_mlp.py [--steps 200] [--repeats 7]

Also timed, in the same repeats: the step's eight matmuls alone (three forward; two per layer
backward, none for the input) through torch.matmul at the same shapes, a floor for any
implementation that hands its matmuls to this machine's BLAS ("matmuls / torch" column).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np


def child(steps, repeats, batch):
    import torch

    import kiln as kl

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((batch, 784)).astype(np.float32)
    y_np = rng.integers(0, 10, batch).astype(np.int64)

    # Kiln
    keys = [kl.asarray(np.array([0, i], np.uint32)) for i in range(3)]
    model = kl.nn.Sequential(
        [
            kl.nn.Linear(784, 256, keys[0]),
            kl.nn.ReLU(),
            kl.nn.Linear(256, 256, keys[1]),
            kl.nn.ReLU(),
            kl.nn.Linear(256, 10, keys[2]),
        ]
    )
    opt = kl.optim.sgd(0.01, momentum=0.9)
    state = opt.init(model)
    x, y = kl.asarray(x_np), kl.asarray(y_np)

    def loss(m, x, y):
        return kl.nn.cross_entropy(m(x), y)

    @kl.jit
    def step(m, s, x, y):
        value, grads = kl.value_and_grad(loss)(m, x, y)
        m, s = opt.update(m, grads, s)
        return m, s, value

    # PyTorch, with the same initial weights
    tmodel = torch.nn.Sequential(
        torch.nn.Linear(784, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    )
    with torch.no_grad():
        for i in (0, 2, 4):
            tmodel[i].weight.copy_(torch.from_numpy(np.array(model[i].weight)))
            tmodel[i].bias.copy_(torch.from_numpy(np.array(model[i].bias)))
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.01, momentum=0.9)
    tx, ty = torch.from_numpy(x_np), torch.from_numpy(y_np)
    lossf = torch.nn.CrossEntropyLoss()

    def torch_step():
        topt.zero_grad(set_to_none=True)
        out = lossf(tmodel(tx), ty)
        out.backward()
        topt.step()
        return out

    # Warm up (compiles Kiln's step) and check that both train the same way.
    first_k = float(np.asarray(step(model, state, x, y)[2]))
    first_t = float(torch_step())
    assert abs(first_k - first_t) < 1e-4 * max(1.0, abs(first_t)), (first_k, first_t)
    for _ in range(5):
        model, state, _ = step(model, state, x, y)
        torch_step()

    # The step's matmuls alone: forward x W1, h1 W2, h2 W3; backward dW3, dh2, dW2, dh1, dW1.
    mats = {
        n: torch.randn(*shape)
        for n, shape in dict(
            x=(batch, 784),
            w1=(784, 256),
            w2=(256, 256),
            w3=(256, 10),
            h=(batch, 256),
            g=(batch, 10),
        ).items()
    }

    def matmuls():
        m = mats
        m["x"] @ m["w1"], m["h"] @ m["w2"], m["h"] @ m["w3"]
        m["h"].T @ m["g"], m["g"] @ m["w3"].T, m["h"].T @ m["h"], m["h"] @ m["w2"].T
        m["x"].T @ m["h"]

    kiln_times, torch_times, matmul_times = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            model, state, value = step(model, state, x, y)
        np.asarray(value)
        kiln_times.append((time.perf_counter() - t0) / steps)
        t0 = time.perf_counter()
        for _ in range(steps):
            torch_step()
        torch_times.append((time.perf_counter() - t0) / steps)
        t0 = time.perf_counter()
        for _ in range(steps):
            matmuls()
        matmul_times.append((time.perf_counter() - t0) / steps)
    print(
        statistics.median(kiln_times),
        statistics.median(torch_times),
        statistics.median(matmul_times),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.steps, args.repeats, args.batch)
        return
    print(
        f"MLP 784-256-256-10, batch {args.batch}, SGD momentum, {args.steps} steps x "
        f"{args.repeats} interleaved repeats, median ms/step"
    )
    print(
        f"{'threads':>7} {'kiln':>9} {'torch':>9} {'matmuls':>9} {'kiln/torch':>10} "
        f"{'matmuls/torch':>13}"
    )
    for threads in (1, 2):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                "--steps",
                str(args.steps),
                "--repeats",
                str(args.repeats),
                "--batch",
                str(args.batch),
            ],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        kiln_s, torch_s, mm_s = map(float, out.split()[-3:])
        print(
            f"{threads:>7} {kiln_s * 1e3:>9.3f} {torch_s * 1e3:>9.3f} {mm_s * 1e3:>9.3f} "
            f"{kiln_s / torch_s:>9.2f}x {mm_s / torch_s:>12.2f}x"
        )


if __name__ == "__main__":
    main()
