#!/usr/bin/python3
"""The GPT job's training throughput under each way of spreading it over processes, side by
side in one command: one process against data parallelism, ZeRO stages 1-3 and tensor
parallelism on N processes of one thread each, and the share of a ZeRO-3 step that its
all-gathers and reduce-scatters take (from KILN_PROFILE's per-equation times).

    /usr/bin/python3 bench/gpt_parallel.py [--build build] [--np 2] [--repeats 1]
                                           [--layers 4 --heads 4 --d-model 256 --block 128
                                            --batch 8 --steps 40]

Each run trains --steps steps with an evaluation halfway, so the second evaluation line's
tokens/s covers the second half only: steady-state steps, without compiling. Prints tokens/s
per layout (median of --repeats), its speed-up over one process, and for ZeRO-3 the
collectives' milliseconds per step against the step's. PyTorch 1.13's FSDP is the peer a user
would pick for ZeRO-3, but Debian's build cannot import it on Python 3.11
(torch.distributed.fsdp fails with "mutable default ... TensorProperties ... use
default_factory"), so no PyTorch column.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOKS = re.compile(r"step \d+: .*\| ([\d.]+) tok/s")
PROFILED = re.compile(r"^\s*(\d+)\s+([\d.]+)\s+[\d.]+%.*?(process_\w+)")
STEP = re.compile(r"^@pmap \(\d+\): (\d+) calls, ([\d.]+) ms a call")


def run(cmd, env):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return p.stdout + p.stderr


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args()
    gpt = os.path.join(a.build, "examples", "gpt")
    env = dict(os.environ, OMP_NUM_THREADS="1", KILN_NUM_THREADS="1")
    model = [
        "--layers",
        str(a.layers),
        "--heads",
        str(a.heads),
        "--d-model",
        str(a.d_model),
        "--block-size",
        str(a.block),
        "--batch-size",
        str(a.batch),
        "--steps",
        str(a.steps),
        "--eval-every",
        str(a.steps // 2),
        "--eval-batches",
        "1",
        "--sample",
        "0",
    ]
    mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(a.np)]
    layouts = {
        "1 process": [gpt],
        "data-parallel": mpirun + [gpt, "--data-parallel"],
        "ZeRO-1": mpirun + [gpt, "--data-parallel", "--zero", "1"],
        "ZeRO-2": mpirun + [gpt, "--data-parallel", "--zero", "2"],
        "ZeRO-3": mpirun + [gpt, "--data-parallel", "--zero", "3"],
        f"tensor 1x{a.np}": mpirun + [gpt, "--tensor-parallel", "--mesh", f"data=1,model={a.np}"],
    }
    print(
        f"# GPT ({a.layers} layers, {a.heads} heads, d_model {a.d_model}, block {a.block}, "
        f"batch {a.batch}) on {a.np} processes x 1 thread; load {os.getloadavg()}",
        flush=True,
    )
    results = {}
    with tempfile.TemporaryDirectory(prefix="kiln_gpt_parallel_") as out:
        for r in range(a.repeats):
            for name, cmd in layouts.items():
                text = run(
                    cmd + model + ["--out", os.path.join(out, str(len(results)) + str(r))], env
                )
                toks = [float(m.group(1)) for m in TOKS.finditer(text)]
                results.setdefault(name, []).append(toks[-1])
                print(f"  {name}: {toks[-1]:.0f} tok/s", flush=True)
        # Where a ZeRO-3 step's time goes: process 0's profile of the jitted step.
        text = run(
            layouts["ZeRO-3"] + model + ["--out", os.path.join(out, "profiled")],
            dict(env, KILN_PROFILE="1"),
        )
    step_ms, calls, comm = None, 0, 0.0
    section = False
    for line in text.splitlines():
        m = STEP.match(line)
        if m:
            section = int(m.group(1)) >= a.steps  # the training step, not the small pmaps
            if section:
                calls, step_ms = int(m.group(1)), float(m.group(2))
            continue
        if line.startswith("@"):
            section = False
        p = PROFILED.match(line)
        if section and p:
            comm += float(p.group(2))
    base = statistics.median(results["1 process"])
    print(f"\n{'layout':<16} {'tok/s':>8} {'vs 1 process':>13}")
    for name, rs in results.items():
        t = statistics.median(rs)
        print(f"{name:<16} {t:>8.0f} {t / base:>12.2f}x")
    if step_ms:
        print(
            f"\nZeRO-3 step (process 0, {calls} calls): {step_ms:.1f} ms, of which all-gathers "
            f"and reduce-scatters {comm:.1f} ms ({100 * comm / step_ms:.0f}%), blocking "
            f"calls (bench_overlap: what a non-blocking one would hide here)"
        )


if __name__ == "__main__":
    main()
