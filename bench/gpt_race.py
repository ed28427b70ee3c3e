#!/usr/bin/python3
"""`make demo-gpt` end to end against the same job in PyTorch 1.13 (bench/gpt_job_torch.py),
side by side in one command: wall time of each whole process (start-up, data, compiling,
training, evaluation) and the validation loss at its last step.

    /usr/bin/python3 bench/gpt_race.py [--build build] [--threads 2] [--repeats 1] [--steps 3000]
                                       [--seed 0] [--torch-init]

Runs, --repeats times in alternating order, BUILD/examples/gpt --sample 0 (its defaults: the
fortunes corpus byte by byte, 4 layers, d_model 128, block 128, batch 16) and
/usr/bin/python3 bench/gpt_job_torch.py with the same recipe and step count, each with
OMP_NUM_THREADS = KILN_NUM_THREADS = --threads (torch.set_num_threads too). PyTorch starts from
Kiln's initial weights (gpt_job_torch.py --kiln-init), so that the validation losses differ by
rounding only; --torch-init lets it draw its own. Prints each run's
evaluation lines, then per side the median wall time and last validation loss, and Kiln's time
as a share of PyTorch's (goal: at most 0.5, with a validation loss no worse).
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VAL = re.compile(r"validation loss ([\d.]+)")


def run(name, cmd, env):
    """Runs cmd, echoing its evaluation lines; returns (wall seconds, last validation loss)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1
    )
    last = None
    for line in p.stdout:
        m = VAL.search(line)
        if m:
            last = float(m.group(1))
            print(f"  {name}: {line.rstrip()}", flush=True)
    if p.wait() != 0:
        sys.exit(f"{name} exited with {p.returncode}: {' '.join(cmd)}")
    return time.perf_counter() - t0, last


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0, help="both jobs' --seed")
    ap.add_argument("--py", default="/usr/bin/python3")
    ap.add_argument("--torch-init", action="store_true", help="PyTorch draws its own weights")
    a = ap.parse_args()
    gpt = os.path.join(a.build, "examples", "gpt")
    if not os.access(gpt, os.X_OK):
        sys.exit(f"no {gpt}: build it first (cmake --build {a.build} --target gpt)")
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), KILN_NUM_THREADS=str(a.threads))
    out = tempfile.mkdtemp(prefix="kiln_gpt_race_")
    steps = ["--steps", str(a.steps), "--seed", str(a.seed)]
    sides = {
        # stdbuf: stdout is a pipe here, and the evaluation lines must arrive as printed.
        "kiln": ["stdbuf", "-oL", gpt, "--sample", "0", "--out", out] + steps,
        "torch": [a.py, os.path.join(HERE, "gpt_job_torch.py"), "--threads", str(a.threads)]
        + steps
        + ([] if a.torch_init else ["--kiln-init"]),
    }
    print(
        f"# GPT race: {a.steps} steps, {a.threads} threads, {a.repeats} repeats; "
        f"load {os.getloadavg()}",
        flush=True,
    )
    results = {n: [] for n in sides}
    try:
        for r in range(a.repeats):
            for n in list(sides)[r % 2 :] + list(sides)[: r % 2]:
                shutil.rmtree(out, ignore_errors=True)
                results[n].append(run(n, sides[n], env))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print(f"\n# load at the end {os.getloadavg()}")
    print(f"{'side':<6} {'runs':>4} {'wall s':>8} {'(min)':>8} {'val loss':>9} {'vs torch':>9}")
    torch_wall = statistics.median(w for w, _ in results["torch"])
    for n, rs in results.items():
        wall = statistics.median(w for w, _ in rs)
        print(
            f"{n:<6} {len(rs):>4} {wall:>8.1f} {min(w for w, _ in rs):>8.1f} "
            f"{statistics.median(v for _, v in rs):>9.4f} {wall / torch_wall:>8.2f}x"
        )


if __name__ == "__main__":
    main()
