"""Reference values for tests/test_sort.cpp: numpy's sort, scans, searchsorted, quantile and
std, and PyTorch 1.13's stable descending sort and topk, on inputs generated here (stored too)."""
import sys

import numpy as np
import torch

import reference_file

np.seterr(all="ignore")  # NaN and inf inputs are the point
rng = np.random.default_rng(15)
out = {}


def edgy(shape, dtype):
    """Values with ties, +-0, +-inf and NaN."""
    x = rng.integers(-4, 5, size=shape).astype(dtype) / 2
    flat = x.reshape(-1)
    k = flat.size
    for v in (np.nan, -0.0, 0.0, np.inf, -np.inf, np.nan):
        flat[rng.integers(0, k)] = v
    return x


for name, x in {
    "f32": edgy((5, 33), np.float32),
    "f64": edgy((5, 33), np.float64),
    "i32": rng.integers(-5, 6, size=(5, 33)).astype(np.int32),
    "long": (np.round(rng.normal(size=100_000) * 50) / 8).astype(np.float32),
}.items():
    out[f"sort/{name}/x"] = x
    for axis in (0, -1) if x.ndim > 1 else (-1,):
        out[f"sort/{name}/axis{axis}/values"] = np.sort(x, axis=axis, kind="stable")
        out[f"sort/{name}/axis{axis}/indices"] = np.argsort(x, axis=axis, kind="stable")
        v, i = torch.sort(torch.from_numpy(x), dim=axis, descending=True, stable=True)
        out[f"sort/{name}/axis{axis}/desc_values"] = v.numpy()
        out[f"sort/{name}/axis{axis}/desc_indices"] = i.numpy()

x = rng.permutation(40).astype(np.float32).reshape(4, 10) / 4
out["top_k/x"] = x
v, i = torch.topk(torch.from_numpy(x), 3)
out["top_k/values"], out["top_k/indices"] = v.numpy(), i.numpy()

for name, x in {
    "f32": rng.normal(size=(4, 6, 5)).astype(np.float32),
    "f64": rng.normal(size=(4, 6, 5)),
    "i32": rng.integers(-3, 4, size=(4, 6, 5)).astype(np.int32),
    "edge": edgy((3, 12), np.float64),
    "zeros": rng.choice([-0.0, 0.0, 0.0, -0.0, 1.0], size=(4, 9)),  # ties of signed zeros
}.items():
    out[f"scan/{name}/x"] = x
    for axis in (0, 1):
        out[f"scan/{name}/axis{axis}/cumsum"] = np.cumsum(x, axis=axis, dtype=x.dtype)
        out[f"scan/{name}/axis{axis}/cumprod"] = np.cumprod(x, axis=axis, dtype=x.dtype)
        out[f"scan/{name}/axis{axis}/cummax"] = np.maximum.accumulate(x, axis=axis)
        out[f"scan/{name}/axis{axis}/cummin"] = np.minimum.accumulate(x, axis=axis)
        if x.dtype.kind == "f":
            out[f"scan/{name}/axis{axis}/cumlogsumexp"] = np.logaddexp.accumulate(x, axis=axis)
long = rng.normal(size=200_000)
out["scan/long/x"] = long
out["scan/long/cumsum"] = np.cumsum(long)
out["scan/long/cumlogsumexp"] = np.logaddexp.accumulate(long)
out["scan/long/cummax"] = np.maximum.accumulate(long)

seq = np.array([-1.0, 0.0, 0.0, 0.5, 2.0, 2.0, 2.0, np.inf, np.nan])
vals = np.array([[-2.0, -1.0, 0.0, -0.0, 0.25], [2.0, 3.0, np.inf, np.nan, -np.inf]])
out["searchsorted/sorted"], out["searchsorted/values"] = seq, vals
out["searchsorted/left"] = np.searchsorted(seq, vals, side="left")
out["searchsorted/right"] = np.searchsorted(seq, vals, side="right")

x = rng.normal(size=(5, 9))
x[3, 4] = np.nan
out["quantile/x"] = x
for q in (0.0, 0.25, 0.5, 0.7, 1.0):
    out[f"quantile/axis1/q{q}"] = np.quantile(x, q, axis=1)
    out[f"quantile/axis0/q{q}"] = np.quantile(x, q, axis=0)
xi = rng.integers(-9, 9, size=(4, 6)).astype(np.int32)
out["median/i32/x"] = xi
out["median/i32/all"] = np.array(np.median(xi))
out["median/i32/axis0"] = np.median(xi, axis=0)
x = rng.normal(size=(4, 7)).astype(np.float32)
out["std/x"] = x
out["std/all"] = np.array(np.std(x.astype(np.float64)))
out["std/axis1_ddof1"] = np.std(x.astype(np.float64), axis=1, ddof=1)

reference_file.write(sys.argv[1], out)
