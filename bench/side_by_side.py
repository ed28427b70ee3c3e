"""The timing harness of the PyTorch peers (bench/*_torch.py), the Python half of
bench/side_by_side.h: the C++ benchmark runs a peer script between its own rounds and reads
the TIMES lines it prints.

Each case is warmed up, then timed in R repetitions of a batch of calls sized to take ~target
seconds; cases are interleaved repetition by repetition. Per case, report() prints
    RESULT <name> <median ms> <min ms>
    TIMES <name> <ms of each repetition ...>      (what the C++ side reads)
"""
import argparse
import statistics
import time


def parser(doc, reps=7, threads=2, target=0.2):
    """The flags every peer takes (--reps, --threads, --target); add a script's own to it."""
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--threads", type=int, default=threads)
    ap.add_argument("--target", type=float, default=target)
    return ap


def time_cases(fns, reps, target, warmups=3):
    """{name: fn} -> {name: [ms per call of each repetition]}."""
    calls = {}
    for name, fn in fns.items():
        for _ in range(warmups):
            fn()
        t0 = time.perf_counter()
        fn()
        calls[name] = max(1, int(target / max(time.perf_counter() - t0, 1e-6)))
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            n = calls[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - t0) / n * 1e3)
    return times


def report(times):
    for name, ts in times.items():
        print(f"RESULT {name} {statistics.median(ts):.4f} {min(ts):.4f}", flush=True)
        print(f"TIMES {name} " + " ".join(f"{t:.4f}" for t in ts), flush=True)


def read_raw(path, dtype, shape):
    """A tensor of `shape` from a file of raw little-endian elements (what the C++ side writes
    for the peer: the initial parameters and the batch), checked to hold exactly that many."""
    import torch

    with open(path, "rb") as f:
        t = torch.frombuffer(bytearray(f.read()), dtype=dtype)
    assert t.numel() == torch.Size(shape).numel(), (path, t.numel(), shape)
    return t.reshape(shape).clone()


def training_args(doc, problems):
    """The flags of a training peer (the Python half of side_by_side.h's run_training_rounds):
    parser()'s, plus --init DIR (the C++ side's initial parameters and batch), --steps K and
    --only P; sets PyTorch's thread count."""
    import torch

    ap = parser(doc, reps=7, threads=2, target=0.2)
    ap.add_argument("--init", default="")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--only", choices=sorted(problems))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    return args


def print_losses(name, step, steps):
    """Runs `step` (which returns the loss) `steps` times and prints
    LOSSES <name> l0 l1 ...   (what run_training_rounds reads)."""
    losses = [step().item() for _ in range(steps)]
    print(f"LOSSES {name} " + " ".join(f"{v:.8g}" for v in losses), flush=True)
