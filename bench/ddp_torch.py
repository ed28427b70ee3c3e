#!/usr/bin/python3
"""PyTorch 1.13 peer of `demo --data-parallel`: the demo's CNN trained with
DistributedDataParallel (gloo backend) on P processes, or plainly on one process, timing each
training step.

    /usr/bin/python3 bench/ddp_torch.py [--procs 2] [--threads 1] [--batch-size 64]
        [--steps 200] [--warmup 20] [--data /usr/share/datasets/fashion-mnist | synthetic]
        [--limit N] [--seed 0]

Model and recipe as bench/demo_torch.py (whose model() and load() this reuses): conv 1->32 3x3
padding 1, relu, maxpool 2, conv 32->64 3x3 padding 1, relu, maxpool 2, flatten, linear
3136->128, relu, linear 128->10; F.cross_entropy; Adam lr 1e-3 (constant: the demo's cosine
decay does not change the time of a step). --batch-size is the global batch: each of the P
processes takes its 1/P of every batch of a shuffle shared by all, so P processes see the same
images per step as one. With P > 1 the processes are started here (torch.multiprocessing,
gloo over TCP on 127.0.0.1) and the model is wrapped in DistributedDataParallel (default
25 MB buckets: the 1.7 MB of gradients are one all-reduce, overlapped with the backward pass);
with P = 1 the model runs without DDP. Each process runs torch.set_num_threads(--threads).

A step (timed on process 0): zero_grad, forward, loss, backward (with DDP's all-reduce),
Adam, loss.item() and the batch accuracy, as demo_torch.py's loop. After --warmup steps,
--steps are timed; prints per-step milliseconds and then
    RESULT torch_p<P> <median step ms> <mean step ms> <images/s>
images/s = global batch / mean step (the epoch-style rate the demo prints).
"""
import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from demo_torch import load, model  # noqa: E402  (the demo's model and data, one definition)


def data(a):
    """(images [N, 1, 28, 28] normalised, labels [N]): Fashion-MNIST or random."""
    if a.data != "synthetic":
        return load(a.data, "train", a.limit)
    g = torch.Generator().manual_seed(a.seed)
    n = a.limit or 60000
    return torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def train(rank, a, port):
    torch.set_num_threads(a.threads)
    procs = a.procs
    if procs > 1:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=procs
        )
    torch.manual_seed(a.seed)  # the same initial parameters everywhere (DDP also broadcasts)
    net = model()
    params = sum(p.numel() for p in net.parameters())
    if procs > 1:
        net = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    x, y = data(a)
    local = a.batch_size // procs
    order = torch.Generator().manual_seed(a.seed)  # one shuffle, shared by the processes
    perm, at = torch.randperm(len(x), generator=order), 0
    times = []
    for step in range(a.warmup + a.steps):
        if at + a.batch_size > len(x):
            perm, at = torch.randperm(len(x), generator=order), 0
        idx = perm[at + rank * local : at + (rank + 1) * local]
        at += a.batch_size
        t0 = time.perf_counter()
        xb, yb = x[idx], y[idx]
        opt.zero_grad(set_to_none=True)
        logits = net(xb)
        loss = F.cross_entropy(logits, yb)
        loss.backward()
        opt.step()
        loss.item()
        (logits.argmax(1) == yb).float().mean().item()
        if step >= a.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    if rank == 0:
        med, mean = statistics.median(times), statistics.fmean(times)
        print(
            f"# ddp_torch: PyTorch {torch.__version__}, {procs} process(es) x {a.threads} "
            f"thread(s){', DDP gloo' if procs > 1 else ', no DDP'}, global batch "
            f"{a.batch_size} ({local} per process), {params} parameters, data {a.data}, "
            f"{a.warmup} warm-up + {a.steps} timed steps",
            flush=True,
        )
        print(f"TIMES torch_p{procs} " + " ".join(f"{t:.3f}" for t in times), flush=True)
        print(
            f"RESULT torch_p{procs} {med:.3f} {mean:.3f} {a.batch_size / mean * 1e3:.1f}",
            flush=True,
        )
    if procs > 1:
        dist.barrier()
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument(
        "--data",
        default="/usr/share/datasets/fashion-mnist",
        help="the IDX directory, or 'synthetic' for random images",
    )
    ap.add_argument("--limit", type=int, default=0, help="images used (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.procs < 1 or a.batch_size % a.procs:
        sys.exit(f"--batch-size {a.batch_size} must be a multiple of --procs {a.procs}")
    if a.procs == 1:
        train(0, a, None)
        return
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(train, args=(a, port), nprocs=a.procs)


if __name__ == "__main__":
    main()
