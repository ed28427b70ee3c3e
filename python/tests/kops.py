"""Kiln ops for the tests of pytrees, transformations and control flow.

The top-level operations (kiln.add, ...) where the module has them; otherwise
kiln._kiln._ops_for_tests, the few ops transforms.cpp binds so that these tests run before the
operations are bound.
"""
import numpy as np

import kiln as kl

_NAMES = {"add": "add", "sub": "sub", "mul": "mul", "div": "divide", "pow": "pow",
          "maximum": "maximum", "less": "less", "greater": "greater", "matmul": "matmul",
          "where": "where", "astype": "astype", "sin": "sin", "cos": "cos", "exp": "exp",
          "log": "log", "tanh": "tanh", "neg": "neg", "square": "square", "sum": "sum",
          "mean": "mean", "reshape": "reshape"}
_top_level = all(hasattr(kl, n) for n in _NAMES.values())
for _ours, _theirs in _NAMES.items():
    globals()[_ours] = getattr(kl, _theirs) if _top_level else getattr(kl._kiln._ops_for_tests, _ours)


def np_(x):
    """A tensor (or anything array-like) as a float64 NumPy array."""
    return np.asarray(x).astype(np.float64)


def close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np_(a), np_(b), rtol=rtol, atol=atol)
