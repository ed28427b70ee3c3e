#!/usr/bin/python3
"""PyTorch 1.13 peer of `make demo` (examples/demo.cpp): the same model and recipe on
Fashion-MNIST, printing the same per-epoch lines, for bench/demo_race.py.

    /usr/bin/python3 bench/demo_torch.py [--epochs 5] [--batch-size 64] [--lr 1e-3] [--seed 0]
        [--threads 2] [--data /usr/share/datasets/fashion-mnist] [--limit N] [--stop-at ACC]

Recipe, as the demo's: CNN conv 1->32 3x3 padding 1, relu, maxpool 2, conv 32->64 3x3 padding
1, relu, maxpool 2, flatten, linear 3136->128, relu, linear 128->10, PyTorch's default
initialisation (Kiln's nn layers use the same bounds: uniform +-1/sqrt(fan_in) for weights and
biases); images scaled to [0, 1] and normalised with mean 0.2860, std 0.3530; every epoch a
fresh shuffle of the 60,000 training images, batches of 64 (the last partial batch dropped);
F.cross_entropy; Adam (betas 0.9, 0.999, eps 1e-8) with the learning rate cosine-decayed from
lr to 0 over all the steps of the run, per step (optax.cosine_decay_schedule, as
optim::cosine_decay); after every epoch, test loss and accuracy over the 10,000 test images in
batches of 1,000; denormals flushed to zero (torch.set_flush_denormal, as the demo's
kiln::set_flush_denormal). The data are decoded and normalised once, up front (the demo's pipeline
does that per epoch in background threads); "s" in the epoch line counts the training loop
only, as the demo's does. Prints, per epoch,
    epoch N: train loss L acc A% | test loss L acc A% | S s, R img/s
With --stop-at ACC it stops after the first epoch whose test accuracy reaches ACC (0.91).
"""
import argparse
import gzip
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(data_dir, split, limit):
    images = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))
    if limit:
        images, labels = images[:limit], labels[:limit]
    x = (torch.from_numpy(images.astype(np.float32)) / 255 - MEAN) / STD
    return x.unsqueeze(1).contiguous(), torch.from_numpy(labels.astype(np.int64))


def model():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--stop-at", type=float, default=0.0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.set_flush_denormal(True)  # as the demo: Adam's decaying moments pass through denormals
    torch.manual_seed(a.seed)

    x_train, y_train = load(a.data, "train", a.limit)
    x_test, y_test = load(a.data, "t10k", a.limit)
    net = model()
    steps_per_epoch = len(x_train) // a.batch_size
    total = a.epochs * steps_per_epoch
    opt = torch.optim.Adam(net.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: 0.5 * (1 + math.cos(math.pi * min(step, total) / total))
    )
    order = torch.Generator().manual_seed(a.seed)
    print(
        f"cnn on Fashion-MNIST (PyTorch {torch.__version__}, {a.threads} threads): "
        f"{sum(p.numel() for p in net.parameters())} parameters, {steps_per_epoch} steps of "
        f"{a.batch_size} images per epoch",
        flush=True,
    )

    for epoch in range(1, a.epochs + 1):
        net.train()
        perm = torch.randperm(len(x_train), generator=order)
        loss_sum = acc_sum = 0.0
        t0 = time.perf_counter()
        for i in range(steps_per_epoch):
            idx = perm[i * a.batch_size : (i + 1) * a.batch_size]
            xb, yb = x_train[idx], y_train[idx]
            opt.zero_grad(set_to_none=True)
            logits = net(xb)
            loss = F.cross_entropy(logits, yb)
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.item()
            acc_sum += (logits.argmax(1) == yb).float().mean().item()
        seconds = time.perf_counter() - t0

        net.eval()
        test_loss = test_acc = 0.0
        with torch.no_grad():
            for i in range(0, len(x_test), 1000):
                logits = net(x_test[i : i + 1000])
                yb = y_test[i : i + 1000]
                test_loss += F.cross_entropy(logits, yb, reduction="sum").item()
                test_acc += (logits.argmax(1) == yb).sum().item()
        test_loss /= len(x_test)
        test_acc /= len(x_test)
        print(
            f"epoch {epoch}: train loss {loss_sum / steps_per_epoch:.4f} acc "
            f"{100 * acc_sum / steps_per_epoch:.2f}% | test loss {test_loss:.4f} acc "
            f"{100 * test_acc:.2f}% | {seconds:.1f} s, "
            f"{steps_per_epoch * a.batch_size / seconds:.0f} img/s",
            flush=True,
        )
        if a.stop_at and test_acc >= a.stop_at:
            break


if __name__ == "__main__":
    main()
