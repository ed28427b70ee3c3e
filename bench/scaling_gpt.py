#!/usr/bin/python3
"""Scaling on paper for the GPT: step time and memory per process of data parallelism, ZeRO
stages 1-3 and a 2-D mesh (tensor parallelism inside a node, data parallelism across), at 8, 64
and 512 processes, on two assumed networks, from the alpha-beta-gamma model of
docs/DISTRIBUTED.md ("Scaling on paper"). A model, not a measurement: this machine has 2 cores.

    /usr/bin/python3 bench/scaling_gpt.py [--node-tflops 2] [--node-gb 256] [--tokens 524288]

One process per node. Per step, for a GPT of N parameters (float32 weights, AdamW) trained on
--tokens tokens per step (global batch) of context T = 1024, d_model C, L layers:
  compute   6 N tokens / P / node-tflops (the matrices; only ZeRO-3 overlapped hides
            communication behind it)
  DP        all-reduce of the gradients, 4N bytes (Rabenseifner: reduce-scatter then
            all-gather); memory 16N (weights, gradients, two moments)
  ZeRO-1    all-reduce of the gradients, then all-gather of the updated weights (as Kiln runs
            it); memory 8N + 8N/P
  ZeRO-2    reduce-scatter of the gradients, all-gather of the weights: one all-reduce's bytes;
            memory 4N + 4N + 8N/P (the local gradients exist whole before the reduce-scatter in
            Kiln's compiled step)
  ZeRO-3    all-gather of the weights in the forward and again in the backward pass, reduce-
            scatter of the gradients; memory 16N/P + 2 layers' weights gathered
  ZeRO-3 overlapped  the same collectives, each layer's while a neighbouring layer computes
            (Kiln's default; where a network card moves the bytes): the slower of the compute
            and the collectives, plus one layer's collectives unhidden; memory 16N/P + 2
            layers' weights gathered + 3 layers' whole gradients
  2-D M x D tensor parallelism over M = 8 processes of a node's line, data parallelism over
            D = P / M: per layer 4 all-reduces of the activations (tokens/D x C x 4 bytes) over
            M, plus the data-parallel all-reduce of 4N/M bytes over D; memory 16N/M + the
            activations
with, for n bytes over p processes (log2 p rounds; alpha latency, beta s/byte, gamma s/byte
reduced):
  all-gather      log2(p) alpha + (p-1)/p n beta
  reduce-scatter  log2(p) alpha + (p-1)/p n (beta + gamma)
  all-reduce      the two together
Each collective also pays Kiln's rendezvous, an MPI_Iallgather of a 320-byte header over all P
processes (linear: (P-1) (o + 320 beta)). Activation memory is not counted except for the 2-D
mesh's per-layer buffers.
"""
import argparse
import math

from scaling_model import rendezvous  # the header exchange every collective starts with

NETWORKS = {
    "25 Gb/s Ethernet": (10e-6, 8 / 25e9, 3e-6),
    "100 Gb/s InfiniBand": (2e-6, 8 / 100e9, 0.5e-6),
}
GAMMA = 1 / 12.7e9  # s per byte reduced: MPI_Reduce_local measured here (docs/DISTRIBUTED.md)
# name: (parameters, layers, d_model)
MODELS = {
    "GPT-2 124M": (124e6, 12, 768),
    "GPT 1.3B": (1.3e9, 24, 2048),
    "GPT 13B": (13e9, 40, 5120),
}


def gather(n, p, alpha, beta):
    return 0.0 if p == 1 else math.log2(p) * alpha + (p - 1) / p * n * beta


def scatter(n, p, alpha, beta):
    return 0.0 if p == 1 else math.log2(p) * alpha + (p - 1) / p * n * (beta + GAMMA)


def layouts(n_params, layers, c, tokens, p, net, tflops):
    alpha, beta, o = net
    w = 4 * n_params
    compute = 6 * n_params * tokens / p / (tflops * 1e12)
    rdv = rendezvous(p, alpha, beta, o)
    ar = gather(w, p, alpha, beta) + scatter(w, p, alpha, beta)
    # per layer a gather forward and backward and a reduce-scatter: the latency 3L times
    zero3_comm = (
        2 * gather(w, p, alpha, beta)
        + scatter(w, p, alpha, beta)
        + 3 * layers * (math.log2(p) * alpha + rdv)
    )
    out = {
        "DP": (compute + ar + 2 * rdv, 16 * n_params),
        "ZeRO-1": (
            compute + ar + gather(w, p, alpha, beta) + 3 * rdv,
            8 * n_params + 8 * n_params / p,
        ),
        "ZeRO-2": (compute + ar + 2 * rdv, 8 * n_params + 8 * n_params / p),
        "ZeRO-3": (compute + zero3_comm, 16 * n_params / p + 2 * w / layers),
        # each layer's collectives run while a neighbouring layer computes: the slower of the
        # two, plus what nothing hides (the first gather and the last reduce-scatter, about a
        # layer's collectives); two layers' weights gathered and three whole gradients (one
        # being computed, two waiting for their reduce-scatters)
        "ZeRO-3 overlapped": (
            max(compute, zero3_comm) + zero3_comm / layers,
            16 * n_params / p + 5 * w / layers,
        ),
    }
    m = min(8, p)
    d = p // m
    act = tokens / d * c * 4  # bytes of one layer's activations per data-parallel group
    tp = 4 * layers * (gather(act, m, alpha, beta) + scatter(act, m, alpha, beta) + rdv)
    dp = gather(w / m, d, alpha, beta) + scatter(w / m, d, alpha, beta) + rdv
    out[f"2-D {m}x{d}"] = (compute + tp + dp, 16 * n_params / m + 2 * act)
    return out


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--node-tflops",
        type=float,
        default=2.0,
        help="sustained float32 TFLOP/s of one node's training step",
    )
    ap.add_argument("--node-gb", type=float, default=128.0, help="memory of a node, GB")
    ap.add_argument("--tokens", type=int, default=512 * 1024, help="tokens per step (global)")
    ap.add_argument("--procs", default="8,64,512")
    a = ap.parse_args()
    procs = [int(x) for x in a.procs.split(",")]
    for model, (n, layers, c) in MODELS.items():
        print(
            f"\n### {model}: step time in s (memory per process in GB); "
            f"{a.tokens} tokens a step, {a.node_tflops} TFLOP/s and {a.node_gb:.0f} GB a node\n"
        )
        for net_name, net in NETWORKS.items():
            rows = {p: layouts(n, layers, c, a.tokens, p, net, a.node_tflops) for p in procs}
            names = list(rows[procs[0]])
            print(f"| {net_name} | " + " | ".join(f"P = {p}" for p in procs) + " |")
            print("|---|" + "---|" * len(procs))
            for name in names:
                cells = []
                for p in procs:
                    key = (
                        name if name in rows[p] else next(k for k in rows[p] if k.startswith("2-D"))
                    )
                    t, mem = rows[p][key]
                    fits = mem / 1e9 <= a.node_gb
                    cells.append(f"{t:.2f} ({mem / 1e9:.1f}){'' if fits else ' ✗'}")
                print(
                    f"| {name.split(' ')[0] if name.startswith('2-D') else name} | "
                    + " | ".join(cells)
                    + " |"
                )
            best = []
            for p in procs:
                fitting = {k: v for k, v in rows[p].items() if v[1] / 1e9 <= a.node_gb}
                best.append(min(fitting, key=lambda k: fitting[k][0]) if fitting else "none fits")
            print("| fastest that fits | " + " | ".join(best) + " |\n")


if __name__ == "__main__":
    main()
