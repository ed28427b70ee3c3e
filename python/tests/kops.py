"""Kiln ops under short names, and comparisons, for the tests of pytrees, transformations and
control flow."""
import numpy as np

import kiln as kl

add, sub, mul, div, pow = kl.add, kl.sub, kl.mul, kl.divide, kl.pow
maximum, less, greater, matmul, where, astype = (
    kl.maximum,
    kl.less,
    kl.greater,
    kl.matmul,
    kl.where,
    kl.astype,
)
sin, cos, exp, log, tanh, neg, square = kl.sin, kl.cos, kl.exp, kl.log, kl.tanh, kl.neg, kl.square
sum, mean, reshape = kl.sum, kl.mean, kl.reshape


def np_(x):
    """A tensor (or anything array-like) as a float64 NumPy array."""
    return np.asarray(x).astype(np.float64)


def close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np_(a), np_(b), rtol=rtol, atol=atol)


def central_diff(f, x, eps=1e-6):
    """The gradient of a scalar NumPy function f at float64 x."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = eps
        g[i] = (f(x + d) - f(x - d)) / (2 * eps)
    return g
