#!/usr/bin/python3
"""Scaling on paper: the expected step time of `demo --data-parallel` (the CNN) on
many processes, from an alpha-beta-gamma model of the MPI calls each step makes, the compute
time of a step measured on one process, and assumed networks. docs/DISTRIBUTED.md ("Scaling on
paper") explains the model and prints these tables.

    /usr/bin/python3 bench/scaling_model.py [--bytes 1686576] [--gamma-gbs 12.7]
        [--compute 1:1.44,8:5.3,32:18.3,64:39.0] [--compute-speedup 1] [--procs 8,64,512]

Per step, one process per node, P a power of two (the figures in docs/DISTRIBUTED.md):
  * the gradient all-reduce, one bucket of --bytes n (parameters x 4, plus loss and accuracy),
    which OpenMPI 4.1's tuned component runs as Rabenseifner's algorithm at this size for every
    P (reduce-scatter by recursive halving, all-gather by recursive doubling):
        T_ar = 2 log2(P) alpha + 2 (P-1)/P n beta + (P-1)/P n gamma
  * two rendezvous (pmap's size exchange, the bucket's header check), each an MPI_Iallgather of
    a 320-byte header, which libnbc runs linearly (P-1 sends and receives per process):
        T_rdv = alpha + (P-1) (o + 320 beta)
  * the compute of the local batch b, measured (--compute, ms per step, 1 thread; divided by
    --compute-speedup for a node that many times faster), with no overlap: the all-reduce runs
    after the backward pass, inside the compiled step.
Weak scaling keeps b = 32 per process (global batch 32 P); strong scaling keeps the global
batch at 64 (b = 64 / P, impossible beyond 64 processes).
"""
import argparse
import math

# name: (alpha s, beta s/byte, o s): latency, inverse bandwidth, per-message CPU overhead.
NETWORKS = {
    "25 Gb/s Ethernet (TCP)": (10e-6, 8 / 25e9, 3e-6),
    "100 Gb/s InfiniBand EDR": (2e-6, 8 / 100e9, 0.5e-6),
}
HEADER = 320  # bytes: the rendezvous header (src/distributed/runtime.cpp)


def allreduce(p, n, alpha, beta, gamma):
    if p == 1:
        return 0.0
    return 2 * math.log2(p) * alpha + 2 * (p - 1) / p * n * beta + (p - 1) / p * n * gamma


def rendezvous(p, alpha, beta, o):
    return 0.0 if p == 1 else alpha + (p - 1) * (o + HEADER * beta)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--bytes",
        type=int,
        default=1686576,
        help="bytes all-reduced per step (421,642 parameters x 4 + loss, accuracy)",
    )
    ap.add_argument(
        "--gamma-gbs",
        type=float,
        default=12.7,
        help="rate of the reduction's additions, GB/s (MPI_Reduce_local, measured)",
    )
    ap.add_argument(
        "--compute",
        default="1:1.44,8:5.3,32:18.3,64:39.0",
        help="batch:ms per step on one process, one thread (measured)",
    )
    ap.add_argument(
        "--compute-speedup",
        type=float,
        default=1.0,
        help="divide the compute times by this (a node with more cores or a GPU)",
    )
    ap.add_argument("--procs", default="8,64,512")
    a = ap.parse_args()
    compute = {
        int(b): float(ms) * 1e-3 / a.compute_speedup
        for b, ms in (kv.split(":") for kv in a.compute.split(","))
    }
    procs = [int(p) for p in a.procs.split(",")]
    gamma = 1 / (a.gamma_gbs * 1e9)
    n = a.bytes

    print(
        f"# n = {n} bytes per step; gamma = {a.gamma_gbs} GB/s; compute (ms per step, "
        f"1 thread / {a.compute_speedup:g}): "
        + ", ".join(f"b={b}: {t * 1e3:g}" for b, t in sorted(compute.items()))
    )
    for net, (alpha, beta, o) in NETWORKS.items():
        print(
            f"\n## {net}: alpha {alpha * 1e6:g} us, beta {1 / beta / 1e9:g} GB/s, "
            f"o {o * 1e6:g} us per message"
        )
        print(
            "| scaling | P | local batch | compute ms | all-reduce ms | 2 rendezvous ms | "
            "step ms | images/s | speedup vs 1 process | efficiency |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for scaling, batch_of, global_of in (
            ("weak", lambda p: 32, lambda p: 32 * p),
            ("strong", lambda p: 64 // p, lambda p: 64),
        ):
            base = compute[batch_of(1)] if scaling == "strong" else compute[32]
            for p in procs:
                b = batch_of(p)
                if b < 1 or b not in compute or 64 % p and scaling == "strong":
                    print(
                        f"| {scaling} | {p} | {64 / p:g} | - | - | - | - | - | - | "
                        f"(fewer than one image per process) |"
                    )
                    continue
                ar = allreduce(p, n, alpha, beta, gamma)
                rdv = 2 * rendezvous(p, alpha, beta, o)
                step = compute[b] + ar + rdv
                # Speedup over one process doing the same global batch in b-sized steps
                # (weak) or in one step of 64 (strong); efficiency = speedup / P.
                one = base * global_of(p) / (32 if scaling == "weak" else 64)
                speedup = one / step
                print(
                    f"| {scaling} | {p} | {b} | {compute[b] * 1e3:.1f} | {ar * 1e3:.2f} | "
                    f"{rdv * 1e3:.2f} | {step * 1e3:.1f} | {global_of(p) / step:,.0f} | "
                    f"{speedup:.1f}x | {speedup / p:.0%} |"
                )


if __name__ == "__main__":
    main()
