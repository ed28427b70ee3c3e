#!/usr/bin/python3
"""Reference values for tests/test_linalg_decomp.cpp (linalg::qr, svd, svdvals, pinv, lstsq,
norm, matrix_power), from numpy. Inputs are generated here and stored with the results."""
import sys

import numpy as np

import reference_file

rng = np.random.default_rng(1515)
out = {}

shapes = {"tall": (2, 3, 5, 3), "wide": (2, 3, 3, 5), "square": (2, 3, 4, 4)}
for name, shape in shapes.items():
    a = rng.standard_normal(shape)
    out[name] = a
    for mode in ("reduced", "complete"):
        q, r = np.linalg.qr(a, mode=mode)
        out[f"qr_{mode}_{name}_q"], out[f"qr_{mode}_{name}_r"] = q, r
    for full in (False, True):
        u, s, vh = np.linalg.svd(a, full_matrices=full)
        out[f"svd_{int(full)}_{name}_u"], out[f"svd_{int(full)}_{name}_vh"] = u, vh
    out[f"svdvals_{name}"] = np.linalg.svd(a, compute_uv=False)
    out[f"pinv_{name}"] = np.linalg.pinv(a)

# Rank 2 in [5, 4]: pinv and lstsq drop the zero singular values (minimum-norm solution).
low = rng.standard_normal((5, 2)) @ rng.standard_normal((2, 4))
out["low_rank"] = low
out["pinv_low_rank"] = np.linalg.pinv(low, rcond=1e-10)
b = rng.standard_normal((5, 2))
out["lstsq_b"] = b
out["lstsq_low_rank"] = np.linalg.lstsq(low, b, rcond=1e-10)[0]
out["lstsq_tall"] = np.linalg.lstsq(out["tall"][0, 0], b, rcond=None)[0]
out["lstsq_tall_vec"] = np.linalg.lstsq(out["tall"][0, 0], b[:, 0], rcond=None)[0]
out["lstsq_wide"] = np.linalg.lstsq(out["wide"][0, 0], b[:3], rcond=None)[0]

# Norms: a vector with a zero, a matrix, a batch of matrices over several axis pairs.
v = rng.standard_normal(6)
v[2] = 0.0
out["vec"] = v
for tag, ord in (
    ("2", 2),
    ("1", 1),
    ("inf", np.inf),
    ("minf", -np.inf),
    ("0", 0),
    ("3", 3),
    ("half", 0.5),
    ("m1", -1),
):
    out[f"norm_vec_{tag}"] = np.linalg.norm(v, ord)
out["norm_vec_default"] = np.linalg.norm(v)
x = rng.standard_normal((2, 3, 4))
out["x3"] = x
out["norm_x3_default"] = np.linalg.norm(x)
out["norm_x3_axis1_keep"] = np.linalg.norm(x, 3, axis=1, keepdims=True)
mat_ords = (
    ("fro", "fro"),
    ("nuc", "nuc"),
    ("1", 1),
    ("m1", -1),
    ("inf", np.inf),
    ("minf", -np.inf),
    ("2", 2),
    ("m2", -2),
)
for tag, ord in mat_ords:
    out[f"norm_mat_{tag}"] = np.linalg.norm(x[0], ord)
    for axes in ((1, 2), (2, 0), (0, 1)):
        out[f"norm_x3_{tag}_{axes[0]}{axes[1]}"] = np.linalg.norm(x, ord, axis=axes)
    out[f"norm_x3_{tag}_keep"] = np.linalg.norm(x, ord, axis=(2, 0), keepdims=True)

sq = out["square"] / 2
for n in (0, 1, 2, 3, 5, -1, -3):
    out[f"matrix_power_{n}"] = np.linalg.matrix_power(sq, n)

reference_file.write(sys.argv[1], out)
