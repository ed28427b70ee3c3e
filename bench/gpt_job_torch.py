#!/usr/bin/python3
"""`make demo-gpt`'s job in PyTorch 1.13: the peer of bench/gpt_race.py.

    /usr/bin/python3 bench/gpt_job_torch.py [--threads 2] [--kiln-init] [the job's flags ...]

The same recipe as examples/gpt.cpp's defaults: the fortunes corpus byte by byte, its last
tenth held out, the same training windows for a seed (python/examples/gpt.py's data helpers,
shared so that both sides see the same bytes), GPT-2's architecture (bench/gpt_torch.py's
nanoGPT form) with GPT-2's initialisation (normal 0.02, residual projections 0.02/sqrt(2L),
zero biases), AdamW with weight decay on the matrices and embeddings only, linear warmup then
cosine decay to lr/10, gradient clipping, the validation loss on the same 8 windows every 500
steps. It prints the job's lines ("step N: train loss ... | validation loss ...") and
"done after N of N steps: validation loss L". With --kiln-init it starts from the weights the
Kiln job draws for the seed (python/examples/gpt.py's init, moved by kiln.nn.state_dict), so that
the two runs differ only by rounding; without, from PyTorch's own draw of the same distribution.
"""
import argparse
import importlib.util
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpt_torch  # noqa: E402  (bench/ on the path first)


def load_job_helpers():
    """python/examples/gpt.py, for its corpus, windows and schedule (it imports kiln too)."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))  # the built kiln module
    path = os.path.join(os.path.dirname(HERE), "python", "examples", "gpt.py")
    spec = importlib.util.spec_from_file_location("gpt_job", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def schedule(step, lr, warmup, steps):
    """Linear warmup from 0, then cosine decay to lr / 10 (the job's warmup_cosine_decay)."""
    if step < warmup:
        return lr * step / warmup
    t = min(step - warmup, steps - warmup) / (steps - warmup)
    return (math.cos(math.pi * t) + 1) / 2 * (lr - lr / 10) + lr / 10


def init_gpt2(net, layers):
    with torch.no_grad():
        for name, p in net.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif ".ln_" in name:
                p.fill_(1.0)
            elif name.endswith("c_proj.weight"):
                p.normal_(0.0, 0.02 / math.sqrt(2.0 * layers))
            else:
                p.normal_(0.0, 0.02)


def main():
    # Its own flags; the job's (--steps, --layers, --text, ...) as python/examples/gpt.py parses
    # them, with the same defaults and checks.
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kiln-init", action="store_true", help="start from Kiln's initial weights")
    own, rest = ap.parse_known_args()
    job = load_job_helpers()
    a = job.parse_args(rest)
    if a.tokenizer != "bytes" or a.dtype != "f32" or a.dropout or a.accum != 1:
        sys.exit("gpt_job_torch: the peer runs bytes, f32, no dropout and no accumulation only")
    torch.set_num_threads(own.threads)
    torch.manual_seed(a.seed)
    data = np.frombuffer(job.read_corpus(a.text or job.default_corpus()), np.uint8)
    n_val = len(data) // 10
    train, val = data[: len(data) - n_val], data[len(data) - n_val :]
    b, t = a.batch_size, a.block_size
    net = gpt_torch.Gpt(a.layers, a.heads, a.d_model, t)
    if own.kiln_init:
        kl = job.kl
        model = job.init(a.layers, a.heads, a.d_model, t, kl.random.key(a.seed))
        net.load_state_dict(kl.nn.state_dict(model), strict=False)  # lm_head is wte's
    else:
        init_gpt2(net, a.layers)
    matrices = [p for p in net.parameters() if p.dim() >= 2]
    others = [p for p in net.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": matrices, "weight_decay": a.weight_decay},
            {"params": others, "weight_decay": 0},
        ],
        lr=a.lr,
    )

    def batch(split, count, stream, step):
        x, y = job.windows(split, count, b, t, a.seed, stream, step)
        return torch.from_numpy(np.asarray(x).copy()), torch.from_numpy(np.asarray(y).copy())

    vx, vy = batch(val, a.eval_batches, 1, 0)
    loss_sum, losses, since, val_loss = 0.0, 0, time.perf_counter(), float("nan")
    for step in range(a.steps):
        x, y = batch(train, 1, 0, step)
        for group in opt.param_groups:
            group["lr"] = schedule(step, a.lr, a.warmup, a.steps)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x[0]).reshape(-1, gpt_torch.VOCAB), y[0].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), a.clip)
        opt.step()
        loss_sum, losses = loss_sum + loss.item(), losses + 1
        if (step + 1) % a.eval_every and step + 1 != a.steps:
            continue
        seconds = time.perf_counter() - since
        with torch.no_grad():
            val_loss = (
                sum(
                    F.cross_entropy(
                        net(vx[i]).reshape(-1, gpt_torch.VOCAB), vy[i].reshape(-1)
                    ).item()
                    for i in range(a.eval_batches)
                )
                / a.eval_batches
            )
        print(
            f"step {step + 1}: train loss {loss_sum / losses:.4f} | validation loss {val_loss:.4f} "
            f"| {losses * b * t / seconds:.0f} tok/s",
            flush=True,
        )
        loss_sum, losses, since = 0.0, 0, time.perf_counter()
    print(f"done after {a.steps} of {a.steps} steps: validation loss {val_loss:.4f}")


if __name__ == "__main__":
    main()
