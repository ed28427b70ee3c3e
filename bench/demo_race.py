#!/usr/bin/python3
"""The main job end to end: time to a test accuracy (91%) with `make demo`'s model
and recipe, Kiln against PyTorch 1.13 (bench/demo_torch.py), side by side in one command.

    /usr/bin/python3 bench/demo_race.py [--build build] [--threads 2] [--repeats 1]
        [--target 0.91] [--full] [--backends llvm,interpreter] [--epochs 5] [--limit N]

Runs, --repeats times, in rotating order:
  kiln_<backend>  BUILD/examples/demo --out <temporary folder> with KILN_JIT_BACKEND=<backend>
                  (llvm: the compiler; interpreter: jit's IR interpreter)
  torch           /usr/bin/python3 bench/demo_torch.py (same model, recipe and evaluation)
each with OMP_NUM_THREADS = KILN_NUM_THREADS = --threads (torch.set_num_threads too). Both
print "epoch N: ... | test loss L acc A% | S s, R img/s" per epoch, S the seconds of the
training loop of that epoch (the first one includes Kiln's tracing and compiling). Time to
target = the sum of S up to the first epoch whose test accuracy reaches --target (evaluation
and data loading are not counted, on either side); a run stops there unless --full.
Prints each run's per-epoch seconds and accuracies, then the medians and the ratios of each
Kiln variant's time to target and seconds per epoch to PyTorch's (< 1: Kiln is faster). The
epoch that first reaches 91% can differ between the sides (the last-bit differences of two
libraries move a 90.95% to either side of the line), so the per-epoch ratio is the steadier.
"""
import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EPOCH = re.compile(r"^epoch (\d+): .*\| test loss [\d.]+ acc ([\d.]+)% \| ([\d.]+) s")


def run(name, cmd, env, target, full):
    """Runs cmd, reading its epoch lines; returns {epochs: [(acc, s)], to_target, wall}."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1
    )
    epochs, to_target, wall = [], None, None
    for line in p.stdout:
        m = EPOCH.match(line)
        if not m:
            continue
        acc, s = float(m.group(2)) / 100, float(m.group(3))
        epochs.append((acc, s))
        print(f"  {name}: {line.rstrip()}", flush=True)
        if to_target is None and acc >= target:
            to_target = sum(e[1] for e in epochs)
            wall = time.perf_counter() - t0
            if not full:
                p.send_signal(signal.SIGTERM)
                break
    p.stdout.close()
    rc = p.wait()
    if to_target is None and rc != 0:
        print(f"  {name}: exited with {rc}", flush=True)
    return {"epochs": epochs, "to_target": to_target, "wall": wall}


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--target", type=float, default=0.91)
    ap.add_argument("--full", action="store_true", help="run every epoch, not only to target")
    ap.add_argument("--backends", default="llvm,interpreter")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--limit", type=int, default=0, help="images per split (quick checks)")
    ap.add_argument("--py", default="/usr/bin/python3")
    a = ap.parse_args()

    demo = os.path.join(a.build, "examples", "demo")
    if not os.access(demo, os.X_OK):
        sys.exit(f"no {demo}: build it first (cmake --build {a.build} --target demo)")
    common = ["--epochs", str(a.epochs)] + (["--limit", str(a.limit)] if a.limit else [])
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), KILN_NUM_THREADS=str(a.threads))
    out = tempfile.mkdtemp(prefix="kiln_demo_race_")
    variants = {}
    for b in a.backends.split(","):
        # stdbuf: the demo's stdout is a pipe here, and its epoch lines must arrive as printed.
        variants[f"kiln_{b}"] = (
            ["stdbuf", "-oL", demo, "--out", os.path.join(out, b)] + common,
            dict(env, KILN_JIT_BACKEND=b),
        )
    variants["torch"] = (
        [a.py, os.path.join(HERE, "demo_torch.py"), "--threads", str(a.threads)] + common,
        env,
    )
    names = list(variants)
    print(
        f"# demo race: target {100 * a.target:.0f}% test accuracy, {a.threads} threads, "
        f"{a.repeats} repeats; load {os.getloadavg()}",
        flush=True,
    )
    results = {n: [] for n in names}
    try:
        for r in range(a.repeats):
            order = names[r % len(names) :] + names[: r % len(names)]
            for n in order:
                cmd, e = variants[n]
                if n != "torch":
                    shutil.rmtree(os.path.join(out, n[5:]), ignore_errors=True)
                results[n].append(run(n, cmd, e, a.target, a.full))
    finally:
        shutil.rmtree(out, ignore_errors=True)

    print(f"\n# load at the end {os.getloadavg()}")
    print(
        f"{'variant':<18} {'runs':>4} {'to target s':>12} {'(min)':>8} {'epochs':>7} "
        f"{'wall s':>8} {'vs torch':>9} {'s/epoch med':>12} {'range':>12} {'vs torch':>9}"
    )

    def to_target(n):
        v = [x["to_target"] for x in results[n] if x["to_target"] is not None]
        return statistics.median(v) if v else None

    def per_epoch(n):
        return [s for x in results[n] for _, s in x["epochs"]]

    ref = to_target("torch")
    ref_epoch = statistics.median(per_epoch("torch")) if per_epoch("torch") else None
    for n in names:
        runs = results[n]
        reached = [x for x in runs if x["to_target"] is not None]
        pe = per_epoch(n)
        epoch_cols = (
            f"{statistics.median(pe):>12.1f} {f'{min(pe):.1f}-{max(pe):.1f}':>12} "
            f"{f'{statistics.median(pe) / ref_epoch:.2f}x' if ref_epoch else '-':>9}"
            if pe
            else ""
        )
        tt = to_target(n)
        if tt is None:
            print(
                f"{n:<18} {len(runs):>4} {'not reached':>12} {'':>8} {'':>7} {'':>8} {'':>9} "
                f"{epoch_cols}"
            )
            continue
        ep = statistics.median(len(x["epochs"]) for x in reached)
        wall = statistics.median(x["wall"] for x in reached)
        ratio = f"{tt / ref:.2f}x" if ref else "-"
        print(
            f"{n:<18} {len(runs):>4} {tt:>12.1f} {min(x['to_target'] for x in reached):>8.1f} "
            f"{ep:>7g} {wall:>8.1f} {ratio:>9} {epoch_cols}"
        )
    print(
        "# to target: seconds of training (sum of the epochs' training loops) until the test "
        "accuracy reaches the target; wall: process start to that epoch's line (loading, "
        "evaluation, compiling included); s/epoch: median and range over all epochs run; "
        "vs torch: ratios of the medians, < 1 means Kiln is faster"
    )


if __name__ == "__main__":
    main()
