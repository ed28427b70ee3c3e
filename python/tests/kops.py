"""Kiln ops for the tests of pytrees, transformations and control flow.

They come from kiln._kiln._ops_for_tests, a few ops bound for these tests so that they do not
depend on the top-level operations (bound by another part of the module).
"""
import numpy as np

import kiln as kl

_ops = kl._kiln._ops_for_tests
add, sub, mul, div, pow, maximum = _ops.add, _ops.sub, _ops.mul, _ops.div, _ops.pow, _ops.maximum
less, greater, matmul, where, astype = _ops.less, _ops.greater, _ops.matmul, _ops.where, _ops.astype
sin, cos, exp, log, tanh, neg, square = _ops.sin, _ops.cos, _ops.exp, _ops.log, _ops.tanh, _ops.neg, _ops.square
sum, mean, reshape = _ops.sum, _ops.mean, _ops.reshape


def np_(x):
    """A tensor (or anything array-like) as a float64 NumPy array."""
    return np.asarray(x).astype(np.float64)


def close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np_(a), np_(b), rtol=rtol, atol=atol)
