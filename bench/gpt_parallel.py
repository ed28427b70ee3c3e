#!/usr/bin/python3
"""The GPT job's training throughput under each way of spreading it over processes, side by
side in one command: one process against data parallelism, ZeRO stages 1-3 and tensor
parallelism on N processes of one thread each, and where a ZeRO-3 step's time goes (from
KILN_PROFILE's per-equation times on every process).

    /usr/bin/python3 bench/gpt_parallel.py [--build build] [--np 2] [--repeats 1]
                                           [--layers 4 --heads 4 --d-model 256 --block 128
                                            --batch 8 --steps 40]

Each run trains --steps steps with an evaluation halfway, so the second evaluation line's
tokens/s covers the second half only: steady-state steps, without compiling. Prints tokens/s
per layout (median of --repeats), its speed-up over one process, and for ZeRO-3, per process,
the collectives' milliseconds per step against the step's; how far apart the processes' times
of the same collective are (a collective where one process waits for another takes long on one
of them only); and the floor of the collectives' copies: Kiln's shared-memory all-gather and
reduce-scatter of P bytes a process over N processes move (2N + 1) P bytes through each
process's memory (its piece in, every piece out; or its whole array in, its block summed from
every one), at best at the copy bandwidth KILN_PROFILE measures in the same run. PyTorch
1.13's FSDP is the peer a user would pick for ZeRO-3, but Debian's build cannot import it on
Python 3.11
(torch.distributed.fsdp fails with "mutable default ... TensorProperties ... use
default_factory"), so no PyTorch column.
"""
import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile

GATHER_SCATTER = ("process_all_gather", "process_reduce_scatter")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOKS = re.compile(r"step \d+: .*\| ([\d.]+) tok/s")
PROFILED = re.compile(
    r"^\s*(\d+)\s+([\d.]+)\s+[\d.]+%.*?(process_\w+) (\w+)\[([\d,]*)\] -> \w+\[([\d,]*)\]"
)
COPY = re.compile(r"copy ([\d.]+) GB/s \(measured now\)")
BYTES = {"f32": 4, "f64": 8, "bf16": 2, "f16": 2}
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
                text = run(cmd + model + ["--out", os.path.join(out, f"{name} {r}")], env)
                toks = [float(m.group(1)) for m in TOKS.finditer(text)]
                results.setdefault(name, []).append(toks[-1])
                print(f"  {name}: {toks[-1]:.0f} tok/s", flush=True)
        # Where a ZeRO-3 step's time goes: every process's profile of the jitted step.
        ranks = os.path.join(out, "ranks")
        run(
            mpirun
            + ["--output-filename", ranks, gpt, "--data-parallel", "--zero", "3"]
            + model
            + ["--out", os.path.join(out, "profiled")],
            dict(env, KILN_PROFILE="1"),
        )
        profiles = [
            step_profile(os.path.join(ranks, "1", f"rank.{r}", "stderr"), a.steps)
            for r in range(a.np)
        ]
    base = statistics.median(results["1 process"])
    print(f"\n{'layout':<16} {'tok/s':>8} {'vs 1 process':>13}")
    for name, rs in results.items():
        t = statistics.median(rs)
        print(f"{name:<16} {t:>8.0f} {t / base:>12.2f}x")
    report_zero3(profiles, results, a.np)


def step_profile(path, steps):
    """(ms a step, {equation: (ms, collective, P bytes a process)}, copy GB/s) of the training
    step's pmap (the one called once a step) in one process's KILN_PROFILE output."""
    with open(path) as f:
        text = f.read()
    step_ms, collectives, section = None, {}, False
    for line in text.splitlines():
        m = STEP.match(line)
        if m:
            section = int(m.group(1)) >= steps
            if section:
                step_ms = float(m.group(2))
            continue
        if line.startswith("@"):
            section = False
        p = PROFILED.match(line)
        if section and p:
            eq, ms, op, dtype = int(p.group(1)), float(p.group(2)), p.group(3), p.group(4)
            dims = [
                int(d)
                for d in (p.group(5) if op == "process_all_gather" else p.group(6)).split(",")
            ]
            piece = BYTES[dtype] * math.prod(dims)  # one process's part
            collectives[eq] = (ms, op, piece)
    copy = COPY.search(text)
    return step_ms, collectives, float(copy.group(1)) if copy else None


def report_zero3(profiles, results, n):
    if any(p[0] is None for p in profiles):
        return
    print("\nZeRO-3 step, per process (KILN_PROFILE):")
    for r, (step_ms, coll, copy) in enumerate(profiles):
        gs = [ms for ms, op, _ in coll.values() if op in GATHER_SCATTER]
        print(
            f"  process {r}: {step_ms:.1f} ms a step, {len(gs)} all-gathers and "
            f"reduce-scatters {sum(gs):.1f} ms ({100 * sum(gs) / step_ms:.0f}%)"
        )
    # The same equation on every process: waiting shows as a long time on some processes only.
    common = set.intersection(*(set(p[1]) for p in profiles))
    spread = [
        max(p[1][eq][0] for p in profiles) - min(p[1][eq][0] for p in profiles)
        for eq in common
        if profiles[0][1][eq][1] in GATHER_SCATTER
    ]
    total = sum(profiles[0][1][eq][0] for eq in common if profiles[0][1][eq][1] in GATHER_SCATTER)
    if spread:
        print(
            f"  the same collective on different processes: {sum(spread):.1f} ms of "
            f"{total:.1f} ms apart in all (the most one process could have waited)"
        )
    _, coll, copy = profiles[0]
    moved = sum((2 * n + 1) * piece for ms, op, piece in coll.values() if op in GATHER_SCATTER)
    if copy:
        floor = moved / (copy * 1e9) * 1e3
        print(
            f"  their copies move {moved / 1e6:.0f} MB a process a step: at least {floor:.1f} ms "
            f"at the copy bandwidth measured now ({copy:.1f} GB/s)"
        )
        one = statistics.median(results["1 process"])
        zero3 = statistics.median(results["ZeRO-3"]) / one
        step_ms = profiles[0][0]
        ceiling = zero3 * step_ms / (step_ms - total + floor)
        print(
            f"  with them at that floor ZeRO-3 would reach {ceiling:.2f}x of one process "
            f"(measured {zero3:.2f}x, data parallelism "
            f"{statistics.median(results['data-parallel']) / one:.2f}x)"
        )


if __name__ == "__main__":
    main()
