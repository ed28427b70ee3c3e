#!/usr/bin/python3
"""PyTorch DataLoader peer of bench_data: the same Fashion-MNIST pipeline.

Decode IDX (gzip), then per sample: normalise, random crop 28x28 after zero padding by 4, random
horizontal flip; shuffle; batch 128; 20,000 images per run. The per-sample work uses torch tensor
ops (torchvision is not installed; its tensor transforms do the same operations).

Prints one JSON object per configuration on stdout, e.g.
  {"workers": 0, "images_per_s": 12345.6, "runs": [...], "load_s": 0.41}
Usage: bench_data_torch.py [--images N] [--runs R] [--workers 0,2] [--dir DIR]
"""
import argparse
import gzip
import json
import sys
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, SubsetRandomSampler

MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


class FashionMnist(Dataset):
    def __init__(self, images, labels):
        self.images = torch.from_numpy(images.copy())
        self.labels = torch.from_numpy(labels.astype(np.int64))

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        x = self.images[i].float().div_(255.0).sub_(MEAN).div_(STD)
        x = torch.nn.functional.pad(x, (4, 4, 4, 4))
        top, left = torch.randint(0, 9, (2,)).tolist()
        x = x[top : top + 28, left : left + 28]
        if torch.rand(1).item() < 0.5:
            x = torch.flip(x, dims=(1,))
        return x.contiguous(), self.labels[i]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--dir", default="/usr/share/datasets/fashion-mnist")
    args = ap.parse_args()

    t0 = time.perf_counter()
    images = read_idx(args.dir + "/train-images-idx3-ubyte.gz")
    labels = read_idx(args.dir + "/train-labels-idx1-ubyte.gz")
    load_s = time.perf_counter() - t0
    ds = FashionMnist(images, labels)
    g = torch.Generator().manual_seed(0)

    for workers in [int(w) for w in args.workers.split(",")]:
        runs = []
        loader = None
        for r in range(args.runs + 1):  # the first run warms up (and starts persistent workers)
            subset = torch.randperm(len(ds), generator=g)[: args.images].tolist()
            if loader is None or workers == 0:
                loader = DataLoader(
                    ds,
                    batch_size=128,
                    sampler=SubsetRandomSampler(subset),
                    num_workers=workers,
                    persistent_workers=workers > 0,
                )
            else:
                loader.sampler.indices = subset
            t = time.perf_counter()
            n = 0
            for x, y in loader:
                n += x.shape[0]
            dt = time.perf_counter() - t
            assert n == args.images, n
            if r > 0:
                runs.append(n / dt)
        print(
            json.dumps(
                {"workers": workers, "images_per_s": max(runs), "runs": runs, "load_s": load_s}
            ),
            flush=True,
        )
        del loader


if __name__ == "__main__":
    sys.exit(main())
