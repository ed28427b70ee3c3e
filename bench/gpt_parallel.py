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
every one), at best at the copy bandwidth KILN_PROFILE measures in the same run. ZeRO-3 runs
twice: with its collectives overlapped with computation (the default) and in place
(KILN_GATHER_AHEAD=0 KILN_DEFER_SCATTERS=0); the profiles of both give the share of the
gather/scatter time that overlapping hides: the collectives' milliseconds in place against
the milliseconds the overlapped step still spends starting them and waiting at their dones. PyTorch
1.13's FSDP is the peer a user would pick for ZeRO-3, but Debian's build cannot import it on
Python 3.11 (torch.distributed.fsdp fails with "mutable default ... TensorProperties ... use
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
OVERLAPPED = {  # a collective in place: its start and done when overlapped
    "process_all_gather": ("process_all_gather_start", "process_all_gather_done"),
    "process_reduce_scatter": ("process_reduce_scatter_start", "process_reduce_scatter_done"),
}
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
    zero3 = mpirun + [gpt, "--data-parallel", "--zero", "3"]
    in_place = {"KILN_GATHER_AHEAD": "0", "KILN_DEFER_SCATTERS": "0"}
    layouts = {  # name: (command, environment)
        "1 process": ([gpt], {}),
        "data-parallel": (mpirun + [gpt, "--data-parallel"], {}),
        "ZeRO-1": (mpirun + [gpt, "--data-parallel", "--zero", "1"], {}),
        "ZeRO-2": (mpirun + [gpt, "--data-parallel", "--zero", "2"], {}),
        "ZeRO-3": (zero3, {}),
        "ZeRO-3 in place": (zero3, in_place),
        f"tensor 1x{a.np}": (
            mpirun + [gpt, "--tensor-parallel", "--mesh", f"data=1,model={a.np}"],
            {},
        ),
    }
    print(
        f"# GPT ({a.layers} layers, {a.heads} heads, d_model {a.d_model}, block {a.block}, "
        f"batch {a.batch}) on {a.np} processes x 1 thread; load {os.getloadavg()}",
        flush=True,
    )
    results = {}
    with tempfile.TemporaryDirectory(prefix="kiln_gpt_parallel_") as out:
        for r in range(a.repeats):
            for name, (cmd, extra) in layouts.items():
                text = run(
                    cmd + model + ["--out", os.path.join(out, f"{name} {r}")], dict(env, **extra)
                )
                toks = [float(m.group(1)) for m in TOKS.finditer(text)]
                results.setdefault(name, []).append(toks[-1])
                print(f"  {name}: {toks[-1]:.0f} tok/s", flush=True)
        # Where a ZeRO-3 step's time goes: every process's profile of the jitted step, with
        # the collectives overlapped and in place.
        profiles = {}
        for name, extra in (("overlapped", {}), ("in place", in_place)):
            ranks = os.path.join(out, "ranks " + name)
            run(
                mpirun
                + ["--output-filename", ranks, gpt, "--data-parallel", "--zero", "3"]
                + model
                + ["--out", os.path.join(out, "profiled " + name)],
                dict(env, KILN_PROFILE="1", **extra),
            )
            profiles[name] = [
                step_profile(os.path.join(ranks, "1", f"rank.{r}", "stderr"), a.steps)
                for r in range(a.np)
            ]
    base = statistics.median(results["1 process"])
    print(f"\n{'layout':<16} {'tok/s':>8} {'vs 1 process':>13}")
    for name, rs in results.items():
        t = statistics.median(rs)
        print(f"{name:<16} {t:>8.0f} {t / base:>12.2f}x")
    report_zero3(profiles["in place"], results, a.np)
    report_overlap(profiles["overlapped"], profiles["in place"], results)


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
                if d
            ]
            piece = BYTES[dtype] * math.prod(dims)  # one process's part
            collectives[eq] = (ms, op, piece)
    copy = COPY.search(text)
    return step_ms, collectives, float(copy.group(1)) if copy else None


def report_zero3(profiles, results, n):
    if any(p[0] is None for p in profiles):
        return
    print("\nZeRO-3 step with its collectives in place, per process (KILN_PROFILE):")
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
        zero3 = statistics.median(results["ZeRO-3 in place"]) / one
        step_ms = profiles[0][0]
        ceiling = zero3 * step_ms / (step_ms - total + floor)
        print(
            f"  with them at that floor ZeRO-3 would reach {ceiling:.2f}x of one process "
            f"(measured {zero3:.2f}x, data parallelism "
            f"{statistics.median(results['data-parallel']) / one:.2f}x)"
        )


def report_overlap(overlapped, in_place, results):
    """How much of the all-gathers' and reduce-scatters' time overlapping hides, per process:
    the time of every collective of the step in place against overlapped (where starting the
    gathers and scatters and waiting at their dones count, and so does a collective that runs
    in place and first waits for the queued ones), as a share of the gathers' and scatters'."""
    if any(p[0] is None for p in overlapped + in_place):
        return
    print("\nZeRO-3's collectives overlapped with computation, against in place (KILN_PROFILE):")
    all_saved = all_gather_scatter = 0.0
    for r, ((o_ms, o_coll, _), (p_ms, p_coll, _)) in enumerate(zip(overlapped, in_place)):
        parts = []
        for whole, split in OVERLAPPED.items():
            b = sum(ms for ms, op, _ in p_coll.values() if op == whole)
            a = sum(ms for ms, op, _ in o_coll.values() if op in split)
            parts.append(f"{whole.removeprefix('process_')} {b:.1f} -> {a:.1f} ms")
        gather_scatter = sum(ms for ms, op, _ in p_coll.values() if op in OVERLAPPED)
        saved = sum(ms for ms, _, _ in p_coll.values()) - sum(ms for ms, _, _ in o_coll.values())
        hidden = saved / gather_scatter if gather_scatter else 0
        all_saved, all_gather_scatter = all_saved + saved, all_gather_scatter + gather_scatter
        print(
            f"  process {r}: {', '.join(parts)} a step; all collectives "
            f"{saved:+.1f} ms: {100 * hidden:.0f}% of the gather/scatter time hidden; step "
            f"{p_ms:.1f} ms in place, {o_ms:.1f} ms overlapped"
        )
    # A process that waits for a slower one can only move its waiting: the processes together.
    print(
        f"  all processes: {100 * all_saved / all_gather_scatter:.0f}% of the gather/scatter "
        "time hidden"
    )
    ratio = statistics.median(results["ZeRO-3"]) / statistics.median(results["ZeRO-3 in place"])
    print(f"  throughput overlapped: {ratio:.3f}x of in place (same run, medians)")


if __name__ == "__main__":
    main()
