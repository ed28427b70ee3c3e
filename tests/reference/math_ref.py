"""Reference values for tests/test_math.cpp from numpy 1.24 / scipy 1.10 (and mpmath for erfc:
scipy's erfc is up to 24 ulps off in the tail, above x = 6).

For every op: inputs (random values in the op's domain, then edge values: +-0, +-inf, NaN,
and the op's own special points) and numpy's / scipy's results, in float64 and float32
(float32 results are float64 ones of the float32 inputs, rounded once), and in the integer
dtypes where the op takes them. Names: "<op>/<x|a|b|y>_<dtype>".
"""
import sys

import mpmath
import numpy as np
import scipy.special as sp

import reference_file

rng = np.random.default_rng(15)
inf, nan = np.inf, np.nan
EDGES = [0.0, -0.0, inf, -inf, nan]
out = {}


def erfc_rounded(x):
    """erfc in 40 digits, rounded once to float64."""
    with mpmath.workdps(40):
        return np.array([float(mpmath.erfc(float(v))) for v in x])


def floats(lo, hi, extra=()):
    return np.concatenate([rng.uniform(lo, hi, 64), np.array(list(extra) + EDGES)])


UNARY = {
    "trunc": (np.trunc, floats(-10, 10, [0.5, -0.5, 2.5, -2.5, 1e300])),
    "log2": (np.log2, floats(0, 100, [1, 2, 1024, 0.5, -1, 1e-310])),
    "log10": (np.log10, floats(0, 100, [1, 10, 1000, 0.1, -1, 1e-310])),
    "exp2": (np.exp2, floats(-20, 20, [1, 10, -1, 1024, -1075, 1e-310])),
    "sinh": (np.sinh, floats(-5, 5, [1e-8, 710, -710, 1e-310])),
    "cosh": (np.cosh, floats(-5, 5, [1e-8, 710, -710])),
    "asin": (np.arcsin, floats(-1, 1, [1, -1, 1.5, 1e-310])),
    "acos": (np.arccos, floats(-1, 1, [1, -1, 1.5])),
    "atan": (np.arctan, floats(-10, 10, [1e300, -1e300, 1e-310])),
    "asinh": (np.arcsinh, floats(-10, 10, [1e300, -1e300, 1e-310])),
    "acosh": (np.arccosh, floats(1, 10, [1, 0.5, 1e300])),
    "atanh": (np.arctanh, floats(-1, 1, [1, -1, 1.5, 1e-310])),
    # erfc's tail: erfc(26) = 5.7e-296 (float64; 0 in float32), where 1 - erf(x) is 0.
    "erfc": (erfc_rounded, floats(-6, 9, [26, 5, -30, 1e-310])),
    "erfinv": (sp.erfinv, floats(-1, 1, [1, -1, 1.5, 1 - 1e-12, -(1 - 1e-12), 1e-300, 0.999])),
    # scipy's gammaln(-inf) is -inf where C's lgamma (and Kiln) gives +inf: not a case here.
    "lgamma": (
        sp.gammaln,
        np.concatenate(
            [
                rng.uniform(-10, 10, 64),
                np.array([1, 2, 0.5, -0.5, -1, -2, 1e-300, 1e300, 0.0, -0.0, inf, nan]),
            ]
        ),
    ),
    "digamma": (sp.psi, floats(-10, 10, [1, 2, 0.5, -0.5, -1, -2, 1e-300, 1e300])),
    "polygamma1": (lambda x: sp.polygamma(1, x), floats(-10, 10, [1, 0.5, -0.5, -1, 1e-8, 1e10])),
    "polygamma2": (lambda x: sp.polygamma(2, x), floats(-10, 10, [1, 0.5, -0.5, -1, 1e-8, 1e10])),
    "isinf": (np.isinf, floats(-10, 10)),
    "isfinite": (np.isfinite, floats(-10, 10)),
    "nan_to_num": (np.nan_to_num, floats(-10, 10)),
    "softplus": (
        lambda x: np.logaddexp(x, 0.0),
        floats(-50, 50, [1000, -1000, 30, -30, 40, -40, 1e-20, -1e-20]),
    ),
    "log_sigmoid": (
        lambda x: -np.logaddexp(-x, 0.0),
        floats(-50, 50, [1000, -1000, 30, -30, 40, -40, 1e-20, -1e-20]),
    ),
}

for name, (fn, x) in UNARY.items():
    with np.errstate(all="ignore"):
        out[f"{name}/x_f64"] = x
        out[f"{name}/y_f64"] = fn(x)
        x32 = x.astype(np.float32)
        out[f"{name}/x_f32"] = x32
        # nan_to_num's defaults are the dtype's own largest values.
        y32 = fn(x32) if name == "nan_to_num" else fn(x32.astype(np.float64))
        out[f"{name}/y_f32"] = y32.astype(np.float32) if y32.dtype == np.float64 else y32
# scipy's erfinv(-0.0) is +0.0; Kiln keeps erfinv odd (-0.0, as torch.erfinv).
for dt in ("f64", "f32"):
    x, y = out[f"erfinv/x_{dt}"], out[f"erfinv/y_{dt}"]
    y[(x == 0) & np.signbit(x)] = -0.0


def pairs(alo, ahi, blo, bhi, extra=()):
    a = rng.uniform(alo, ahi, 64)
    b = rng.uniform(blo, bhi, 64)
    ea = [p[0] for p in extra] + [x for x in EDGES for _ in EDGES]
    eb = [p[1] for p in extra] + [y for _ in EDGES for y in EDGES]
    return np.concatenate([a, np.array(ea)]), np.concatenate([b, np.array(eb)])


DIVISION = [
    (7.5, 2),
    (-7.5, 2),
    (7.5, -2),
    (-7.5, -2),
    (6, 3),
    (-6, 3),
    (6, -3),
    (1, 0),
    (-1, 0),
    (5, 1e-300),
    (1e300, 1e-300),
    (-1, 1e300),
    (1, -1e300),
]
BINARY = {
    "remainder": (np.remainder, pairs(-10, 10, -3, 3, DIVISION)),
    "fmod": (np.fmod, pairs(-10, 10, -3, 3, DIVISION)),
    "floor_divide": (np.floor_divide, pairs(-10, 10, -3, 3, DIVISION)),
    "atan2": (np.arctan2, pairs(-10, 10, -10, 10, [(1e-310, 1), (1, 1e-310)])),
    "hypot": (np.hypot, pairs(-10, 10, -10, 10, [(1e300, 1e300), (3, 4), (1e-310, 1e-310)])),
    "copysign": (np.copysign, pairs(-10, 10, -10, 10)),
    "logaddexp": (
        np.logaddexp,
        pairs(-10, 10, -10, 10, [(1000, 1000), (-1000, -1000), (1000, -1000), (800, 1)]),
    ),
}

for name, (fn, (a, b)) in BINARY.items():
    with np.errstate(all="ignore"):
        out[f"{name}/a_f64"], out[f"{name}/b_f64"] = a, b
        out[f"{name}/y_f64"] = fn(a, b)
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        out[f"{name}/a_f32"], out[f"{name}/b_f32"] = a32, b32
        out[f"{name}/y_f32"] = fn(a32.astype(np.float64), b32.astype(np.float64)).astype(np.float32)

# Integers: divisors without zeros (a zero is an Error in Kiln, 0 in numpy); MIN / -1.
INTS = {"i32": np.int32, "i64": np.int64, "u8": np.uint8}
for tag, dt in INTS.items():
    info = np.iinfo(dt)
    a = rng.integers(info.min, info.max, 64, dtype=dt, endpoint=True)
    b = rng.integers(1, 20, 64, dtype=dt)
    if info.min < 0:
        b = b * rng.choice(np.array([1, -1], dtype=dt), 64)
        a = np.concatenate([a, np.array([info.min, info.min, info.max, -7, 7, -7], dtype=dt)])
        b = np.concatenate([b, np.array([-1, 1, -1, 2, -2, -2], dtype=dt)])
    small = rng.integers(-20 if info.min < 0 else 0, 20, 64, dtype=dt)
    with np.errstate(all="ignore"):
        for name, fn in [
            ("remainder", np.remainder),
            ("fmod", np.fmod),
            ("floor_divide", np.floor_divide),
        ]:
            out[f"{name}/a_{tag}"], out[f"{name}/b_{tag}"] = a, b
            out[f"{name}/y_{tag}"] = fn(a, b)
            out[f"{name}/small_a_{tag}"], out[f"{name}/small_b_{tag}"] = small, b[:64]
            out[f"{name}/small_y_{tag}"] = fn(small, b[:64])
        c = rng.integers(info.min, info.max, len(a), dtype=dt, endpoint=True)
        for name, fn in [
            ("bitwise_and", np.bitwise_and),
            ("bitwise_or", np.bitwise_or),
            ("bitwise_xor", np.bitwise_xor),
        ]:
            out[f"{name}/a_{tag}"], out[f"{name}/b_{tag}"] = a, c
            out[f"{name}/y_{tag}"] = fn(a, c)
        out[f"bitwise_not/x_{tag}"] = a
        out[f"bitwise_not/y_{tag}"] = np.invert(a)
        bits = 8 * np.dtype(dt).itemsize
        # Counts in and out of range; negative counts for signed dtypes.
        lo = -3 if info.min < 0 else 0
        counts = rng.integers(lo, bits + 4, 64 + 6).astype(dt)
        counts[-6:] = np.array([0, bits - 1, bits, bits + 1, 1, 2], dtype=dt)
        values = np.concatenate(
            [a[:64], np.array([info.min, info.max, 1, 1, info.min, info.max], dtype=dt)]
        )
        for name, fn in [("left_shift", np.left_shift), ("right_shift", np.right_shift)]:
            out[f"{name}/a_{tag}"], out[f"{name}/b_{tag}"] = values, counts
            out[f"{name}/y_{tag}"] = fn(values, counts)

bools_a = np.array([False, False, True, True])
bools_b = np.array([False, True, False, True])
for name, fn in [
    ("bitwise_and", np.bitwise_and),
    ("bitwise_or", np.bitwise_or),
    ("bitwise_xor", np.bitwise_xor),
]:
    out[f"{name}/y_bool"] = fn(bools_a, bools_b)
out["bitwise_not/y_bool"] = np.invert(bools_a)
out["bool/a"], out["bool/b"] = bools_a, bools_b

reference_file.write(sys.argv[1], out)
