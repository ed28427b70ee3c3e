"""numpy values for tests/test_indexing.cpp: einsum, tensordot, outer, kron and the indexing
operations (diagonal, diag, trace, tril/triu, tile, repeat, roll, meshgrid, pad modes).

Each case stores its inputs ("<case>/in0", ...) and numpy's result ("<case>/out"), in float64;
the test runs Kiln on the same inputs in float64 and float32.
"""
import sys

import numpy as np

import reference_file

rng = np.random.default_rng(15)
out = {}


def case(name, fn, *shapes):
    xs = [rng.uniform(-1.0, 1.0, s) for s in shapes]
    for i, x in enumerate(xs):
        out[f"{name}/in{i}"] = x
    r = fn(*xs)
    if isinstance(r, (list, tuple)):
        for i, y in enumerate(r):
            out[f"{name}/out{i}"] = np.asarray(y, dtype=np.float64)
    else:
        out[f"{name}/out"] = np.asarray(r, dtype=np.float64)


def einsum_case(name, s, *shapes):
    case(name, lambda *xs: np.einsum(s, *xs), *shapes)


einsum_case("einsum_attention", "bhqd,bhkd->bhqk", (2, 3, 4, 5), (2, 3, 6, 5))
einsum_case("einsum_bmm", "bij,bjk->bik", (3, 4, 5), (3, 5, 2))
einsum_case("einsum_diag", "ii->i", (4, 4))
einsum_case("einsum_trace", "ii", (4, 4))
einsum_case("einsum_sum_all", "ij->", (3, 4))
einsum_case("einsum_transpose", "ij->ji", (3, 4))
einsum_case("einsum_dot", "i,i", (5,), (5,))
einsum_case("einsum_outer", "i,j->ij", (3,), (4,))
einsum_case("einsum_implicit", "ij,jk", (3, 4), (4, 2))
einsum_case("einsum_case_order", "bA,Ac", (3, 4), (4, 2))
einsum_case("einsum_upper_first", "ab,cA->", (2, 3), (4, 5))
einsum_case("einsum_implicit_upper", "aB,c", (2, 3), (4,))
einsum_case("einsum_ellipsis", "...ij,...jk->...ik", (2, 1, 3, 4), (5, 4, 2))
einsum_case("einsum_ellipsis_implicit", "...i,...i", (2, 3), (3,))
einsum_case("einsum_broadcast_one", "ij,jk->ik", (2, 1), (3, 4))
einsum_case("einsum_three", "ijk,jl,lk->i", (2, 3, 4), (3, 5), (5, 4))
einsum_case("einsum_four", "abc,cd,de,ea->b", (2, 3, 4), (4, 5), (5, 2), (2, 2))
einsum_case("einsum_repeated_three", "iij->ij", (3, 3, 2))
einsum_case("einsum_repeated_across", "iij,jk->ik", (3, 3, 2), (2, 4))
einsum_case("einsum_batch_kept", "ij,ij->ij", (3, 4), (3, 4))
einsum_case("einsum_mixed", "bik,bkj,j->bi", (2, 3, 4), (2, 4, 5), (5,))
einsum_case("einsum_spaces", " ij , jk -> ik ", (2, 3), (3, 2))
einsum_case("einsum_empty_axis", "ij,jk->ik", (2, 0), (0, 3))
einsum_case("einsum_scalar", ",ij->ij", (), (2, 3))

case("tensordot_2", lambda a, b: np.tensordot(a, b, 2), (2, 3, 4), (3, 4, 5))
case("tensordot_0", lambda a, b: np.tensordot(a, b, 0), (2, 3), (4,))
case("tensordot_pairs", lambda a, b: np.tensordot(a, b, ([0, 2], [2, 1])), (2, 3, 4), (5, 4, 2))
case("outer", np.outer, (2, 3), (4,))
case("kron", np.kron, (2, 3), (4, 2))
case("kron_ranks", np.kron, (3,), (2, 2, 2))

case("diagonal", np.diagonal, (4, 5))
case("diagonal_offset", lambda x: np.diagonal(x, 2), (4, 5))
case("diagonal_negative", lambda x: np.diagonal(x, -1), (4, 5))
case("diagonal_axes", lambda x: np.diagonal(x, 1, 2, 0), (3, 2, 4))
case("diagonal_past", lambda x: np.diagonal(x, 7), (4, 5))
case("diag_vector", np.diag, (4,))
case("diag_vector_k", lambda v: np.diag(v, 2), (3,))
case("diag_vector_negative", lambda v: np.diag(v, -1), (3,))
case("diag_matrix", lambda x: np.diag(x, -2), (4, 3))
case("trace", np.trace, (4, 4))
case("trace_offset_axes", lambda x: np.trace(x, 1, 1, 2), (2, 3, 4))
for k in (0, 1, -2, 9, -9):
    case(f"tril_{k}", lambda x, k=k: np.tril(x, k), (2, 3, 4))
    case(f"triu_{k}", lambda x, k=k: np.triu(x, k), (2, 3, 4))
case("tile", lambda x: np.tile(x, (2, 3)), (2, 3))
case("tile_more_reps", lambda x: np.tile(x, (2, 1, 2)), (3,))
case("tile_fewer_reps", lambda x: np.tile(x, 2), (2, 3))
case("tile_zero", lambda x: np.tile(x, (0, 2)), (2, 3))
case("repeat_axis", lambda x: np.repeat(x, 3, axis=1), (2, 3))
case("repeat_flat", lambda x: np.repeat(x, 2), (2, 3))
case("roll", lambda x: np.roll(x, 2, axis=1), (2, 5))
case("roll_negative", lambda x: np.roll(x, -7, axis=0), (5, 2))
case("roll_flat", lambda x: np.roll(x, 4), (2, 3))
case("meshgrid_xy", lambda a, b, c: np.meshgrid(a, b, c), (2,), (3,), (4,))
case("meshgrid_ij", lambda a, b, c: np.meshgrid(a, b, c, indexing="ij"), (2,), (3,), (4,))
for mode in ("reflect", "edge", "wrap"):
    case(f"pad_{mode}", lambda x, m=mode: np.pad(x, ((2, 1), (4, 3)), mode=m), (3, 2))
    case(f"pad_{mode}_long", lambda x, m=mode: np.pad(x, ((7, 9),), mode=m), (3,))
    case(f"pad_{mode}_one", lambda x, m=mode: np.pad(x, ((2, 3),), mode=m), (1,))

# nonzero with a static size (padded with -1 here) and bincount with a length (values outside
# [0, length) dropped).
x = rng.uniform(-1.0, 1.0, (3, 4))
x[x < 0] = 0.0
x[0, 1], x[2, 2] = np.nan, -0.0
nz = np.argwhere(x)
out["nonzero/in0"] = x
out["nonzero/out"] = np.concatenate([nz, np.full((10 - len(nz), 2), -1)]).astype(np.int64)
v = rng.integers(-2, 8, 40)
w = rng.uniform(-1.0, 1.0, 40)
keep = (v >= 0) & (v < 5)
out["bincount/in0"] = v.astype(np.int64)
out["bincount/weights"] = w
out["bincount/out"] = np.bincount(v[keep], minlength=5).astype(np.int64)
out["bincount/out_weighted"] = np.bincount(v[keep], weights=w[keep], minlength=5)

# scatter along axis 1 with repeated indices (4 and -1): set keeps the last in index order.
x = rng.uniform(-1.0, 1.0, (3, 5, 2))
idx = np.array([[4, 0], [-1, 1]])
u = rng.uniform(-1.0, 1.0, (3, 2, 2, 2))
out["scatter/x"], out["scatter/idx"], out["scatter/u"] = x, idx.astype(np.int64), u
y = x.copy()
for j, i in enumerate(idx.flat):
    y[:, i, :] = u[:, j // 2, j % 2, :]
out["scatter/set"] = y
for name, ufunc in (
    ("add", np.add),
    ("mul", np.multiply),
    ("max", np.maximum),
    ("min", np.minimum),
):
    y = x.copy()
    ufunc.at(y, (slice(None), idx), u)
    out[f"scatter/{name}"] = y

reference_file.write(sys.argv[1], out)
