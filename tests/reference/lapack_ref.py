#!/usr/bin/python3
"""Reference values for tests/test_lapack.cpp (linalg::cholesky, triangular_solve, solve, inv,
slogdet, det, eigh), from numpy / scipy. Inputs are generated here and stored with the results:
batches of symmetric positive-definite, general and triangular matrices in float64."""
import sys

import numpy as np
import scipy.linalg

import reference_file

rng = np.random.default_rng(15)
out = {}

# [2, 3, 4, 4]: symmetric positive definite (M M^T + n I) and general matrices.
m = rng.standard_normal((2, 3, 4, 4))
spd = m @ np.swapaxes(m, -1, -2) + 4 * np.eye(4)
gen = rng.standard_normal((2, 3, 4, 4))
rhs = rng.standard_normal((2, 3, 4, 2))
vec = rng.standard_normal(4)
out["spd"], out["general"], out["rhs"], out["vec"] = spd, gen, rhs, vec

out["cholesky"] = np.linalg.cholesky(spd)
out["solve"] = np.linalg.solve(gen, rhs)
out["solve_vec"] = np.linalg.solve(gen[0, 0], vec)
out["inv"] = np.linalg.inv(gen)
sign, logabs = np.linalg.slogdet(gen)
out["slogdet_sign"], out["slogdet_logabs"] = sign, logabs
out["det"] = np.linalg.det(gen)

# Triangular solves read one triangle of `general` (scipy ignores the other).
for lower in (False, True):
    for trans in (0, 1):
        for unit in (False, True):
            name = f"tri_l{int(lower)}_t{trans}_u{int(unit)}"
            x = np.empty_like(rhs)
            for i in np.ndindex(*gen.shape[:-2]):
                a = gen[i] + 3 * np.eye(4)  # well conditioned
                x[i] = scipy.linalg.solve_triangular(
                    a, rhs[i], lower=lower, trans=trans, unit_diagonal=unit
                )
            out[name] = x
out["tri_a"] = gen + 3 * np.eye(4)

# eigh of the symmetric part of `general` (Kiln symmetrises; numpy reads the lower triangle).
sym = (gen + np.swapaxes(gen, -1, -2)) / 2
out["eigh_w"], out["eigh_v"] = np.linalg.eigh(sym)

reference_file.write(sys.argv[1], out)
